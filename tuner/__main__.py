"""`python -m tuner` runs the CLI."""

from __future__ import annotations

from tuner.cli import entry

entry()
