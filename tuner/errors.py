"""The one error tree of serve-tuner. Every failure a user can meet is a `TunerError`.

    TunerError
    ├── ConfigError            a study, search space or workload file is wrong (exit code 2)
    ├── AssetError             llama-server or the model could not be fetched or built
    ├── TransportError         a command or file operation on the host failed
    │   ├── CommandFailed      a command exited non-zero (argv, exit status, stderr tail)
    │   └── HostUnreachable    the link to the host stayed down past the reconnect window (exit code 75)
    ├── DeployError            a config could not be applied or restored
    │   └── ServerNotReady     the server did not become healthy in time, or exited
    ├── WorkloadError          a workload trace is malformed or unusable (exit code 2: a file the user gave)
    ├── MeasurementError       a round could not be measured (server died, no requests finished)
    ├── OutputError            an output file could not be written (a full disk, no permission)
    └── StudyError             the study cannot go on (no baseline, run directory locked, ...)

The CLI prints `str(error)` as one line; messages name the problem and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AssetError",
    "CommandFailed",
    "ConfigError",
    "DeployError",
    "HostUnreachable",
    "MeasurementError",
    "OutputError",
    "ServerNotReady",
    "StudyError",
    "TransportError",
    "TunerError",
    "WorkloadError",
]


class TunerError(Exception):
    """Root of every error serve-tuner raises on purpose."""

    exit_code: int = 1


class ConfigError(TunerError):
    """Something a user wrote is invalid; the message names the file, the key and the fix."""

    exit_code = 2


class AssetError(TunerError):
    """A real part (llama-server binary, model file) could not be fetched or built."""


class TransportError(TunerError):
    """A command or file operation on the host could not be carried out."""


class CommandFailed(TransportError):
    """A command ran but exited with a non-zero status."""

    def __init__(self, *, argv: Sequence[str], exit_status: int, stderr_tail: str) -> None:
        self.argv = tuple(argv)
        self.exit_status = exit_status
        self.stderr_tail = stderr_tail
        tail = stderr_tail.strip().splitlines()[-1:] or ["no stderr"]
        super().__init__(f"{self.argv[0]} exited with status {exit_status}: {tail[0]}")


class HostUnreachable(TransportError):
    """The connection to the host was lost and could not be re-opened within the reconnect window.

    Exit code 75 (EX_TEMPFAIL): nothing is known to be wrong with the host or the study; on a systemd
    host the dead-man timer puts the baseline back by itself."""

    exit_code = 75


class DeployError(TunerError):
    """A config could not be applied to, or restored on, the host."""


class ServerNotReady(DeployError):
    """The server exited, or did not answer its health check within the start timeout."""


class WorkloadError(TunerError):
    """A workload trace is malformed, of an unknown version, or cannot be replayed."""

    exit_code = 2  # a file the user named (the study's workload, an import's input): theirs to fix


class MeasurementError(TunerError):
    """A measurement round produced no usable result."""


class OutputError(TunerError):
    """A file serve-tuner writes on this machine could not be written; what was there is unchanged."""


class StudyError(TunerError):
    """The study cannot continue: no baseline, a locked run directory, an incompatible resume."""
