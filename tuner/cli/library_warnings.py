"""A library's warning is not the operator's business: `tuner` commands do not print them.

A new release of a dependency may warn about its own future (cryptography 51 warns that DSA is
deprecated as soon as asyncssh imports it: ten lines before every command that reaches the ssh
transport, and every one-line error no longer one line). That is for this project's maintainers to read,
in the tests and in scripts/drift.sh, not for the operator of a server at 3 a.m.

The filter is by module: a warning attributed to a module outside `tuner` (the library's own code, or
the library's caller inside another library) is not shown, whatever its category; one attributed to the
tuner's own code still is. Whoever asks for warnings (`python -W default -m tuner ...`, or
`PYTHONWARNINGS=default`) sees them all, as Python's documentation advises for an application.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["hide_library_warnings"]

# The module a warning is attributed to, matched from its start: any but `tuner` and its submodules.
NOT_THE_TUNERS = r"(?!tuner(\.|$))"


def hide_library_warnings() -> None:
    """Installs the filter, unless warnings were asked for on the command line or in PYTHONWARNINGS."""
    if sys.warnoptions:
        return
    warnings.filterwarnings("ignore", category=Warning, module=NOT_THE_TUNERS)
