"""The `tuner` command. It renders every `TunerError` as one line and a non-zero exit code.

`commands` is the table of commands (name, help, arguments, checks, the function that runs each);
`parser` builds argparse from it; `checks` holds every argument check that needs no I/O; `main` parses,
checks, imports the chosen command's module and runs it. The other modules are the commands themselves,
imported only when one of theirs runs, so `tuner --help` loads no plugin (tests/fast/test_startup.py).
"""

from __future__ import annotations

from tuner.cli.main import EXIT_INTERRUPTED, EXIT_TERMINATED, entry, main

__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "entry", "main"]
