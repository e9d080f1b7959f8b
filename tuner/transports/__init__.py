"""Transports run commands, move files and start background processes on the host under test.

The seam is owned by its consumers (deployers, log collection): they see only `Transport`.
`local` runs on this machine; `ssh` (asyncssh) plugs in through the same registry.
"""

from __future__ import annotations

from tuner.transports.base import (
    TRANSPORTS,
    CommandResult,
    ProcessHandle,
    Transport,
    create_transport,
)
from tuner.transports.local import LocalTransport
from tuner.transports.ssh import SshTransport

__all__ = [
    "TRANSPORTS",
    "CommandResult",
    "LocalTransport",
    "ProcessHandle",
    "SshTransport",
    "Transport",
    "create_transport",
]
