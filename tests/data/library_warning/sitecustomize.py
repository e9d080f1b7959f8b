"""Makes asyncssh warn as it is imported, as it did with cryptography 51 (`CryptographyDeprecationWarning:
DSA is deprecated`): put this directory on PYTHONPATH, and MARK names a file written once the warnings
are raised, so that a test knows the command reached the ssh transport. Python imports `sitecustomize`
at start-up (tests/fast/test_library_warnings.py)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# Run in asyncssh's own namespace, so that each warning is attributed to asyncssh, as a library's is.
WARN = """
import warnings as _warnings
class CryptographyDeprecationWarning(UserWarning):
    pass
_warnings.warn("DSA is deprecated and will be removed in a future release", CryptographyDeprecationWarning)
_warnings.warn("this call will change in a future release", FutureWarning)
"""


class _WarnOnImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "asyncssh":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            exec(compile(WARN, module.__file__ or fullname, "exec"), vars(module))
            Path(os.environ["MARK"]).write_text("asyncssh imported, its warnings raised\n")

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _WarnOnImport())
