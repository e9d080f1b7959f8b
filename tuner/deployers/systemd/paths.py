"""Where the systemd deployer's own files lie on the host, for one unit: the trial's drop-in under /run,
the snapshot, lock and dead-man script beside each other under /run/serve-tuner, and what `tuner apply`
makes permanent under /etc. Nothing else on the host is ours to write or remove."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog import SYSTEMD_APPLIED_DROP_IN

__all__ = ["APPLIED_NAME", "DROP_IN_NAME", "STATE_DIR", "HostPaths"]

DROP_IN_NAME = "zz-tuner.conf"  # sorts after the operator's override.conf, so our values win
# `tuner apply` writes this one under /etc: it sorts before DROP_IN_NAME, so later trials still win over
# it (a file of the same name in /etc would hide ours in /run). Named in the catalog, for the morning report.
APPLIED_NAME = SYSTEMD_APPLIED_DROP_IN
RUNTIME_DIR = "/run/systemd/system"
PERSISTENT_DIR = "/etc/systemd/system"
STATE_DIR = "/run/serve-tuner"
PERSISTENT_SECRETS_DIR = "/etc/serve-tuner"


@dataclass(frozen=True)
class HostPaths:
    """The paths of our files for `unit` (a NAME.service)."""

    unit: str

    @property
    def runtime_drop_in(self) -> str:
        return f"{RUNTIME_DIR}/{self.unit}.d/{DROP_IN_NAME}"

    @property
    def snapshot(self) -> str:
        """The unit as found before the study; kept until a restore finishes."""
        return f"{STATE_DIR}/{self.unit}.json"

    @property
    def lock_dir(self) -> str:
        return f"{STATE_DIR}/{self.unit}.lock"

    @property
    def lock_owner(self) -> str:
        return f"{self.lock_dir}/owner.json"

    @property
    def restore_script(self) -> str:
        return f"{STATE_DIR}/{self.unit}.restore.sh"

    @property
    def secrets(self) -> str:
        return f"{STATE_DIR}/{self.unit}.secret.env"

    @property
    def timer(self) -> str:
        """The dead-man timer's transient unit name (no `.timer` suffix)."""
        return "serve-tuner-restore-" + self.unit.removesuffix(".service").replace("@", "_")

    @property
    def persistent_drop_in(self) -> str:
        return f"{PERSISTENT_DIR}/{self.unit}.d/{APPLIED_NAME}"

    @property
    def persistent_secrets(self) -> str:
        return f"{PERSISTENT_SECRETS_DIR}/{self.unit}.secret.env"
