"""`python -m tuner.cli` runs the CLI, as `python -m tuner` does."""

from __future__ import annotations

import sys

from tuner.cli.main import main

sys.exit(main())
