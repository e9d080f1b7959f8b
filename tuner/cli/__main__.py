"""`python -m tuner.cli` runs the CLI, as `python -m tuner` does."""

from __future__ import annotations

from tuner.cli.main import entry

entry()
