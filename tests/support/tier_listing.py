"""A pytest plugin for the tier check (`-p tests.support.tier_listing`): writes each collected test's id to
the file `TIER_LISTING` names, after `real ` where it is marked `real` (what `-m "not real"` leaves out),
so that one collection of the suite shows both its directories and its markers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    listing = os.environ.get("TIER_LISTING")
    if listing:
        lines = [("real " if item.get_closest_marker("real") else "") + item.nodeid for item in session.items]
        Path(listing).write_text("\n".join(lines) + "\n")
