"""`python -m tuner` runs the CLI."""

from __future__ import annotations

import sys

from tuner.cli import main

sys.exit(main())
