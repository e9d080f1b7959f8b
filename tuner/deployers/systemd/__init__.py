"""The `systemd` deployer: a trial is one drop-in of ours on the operator's unit, under /run.

    enter:   take the host's lock; put back whatever an earlier, killed run left; snapshot the unit
             (its files, their hashes, its environment, whether it ran)
    apply:   refuse if an operator drop-in sorting after ours sets one of our keys
             arm the dead-man timer on the host (it restores the baseline if this controller vanishes)
             write /run/systemd/system/UNIT.d/zz-tuner.conf atomically; daemon-reload; reset-failed;
             restart; wait for health while watching Result=, NRestarts and MainPID; then verify that
             what runs is what was meant (no pending reload, a new MainPID and InvocationID, the
             process's own environment and, with `exec_start = "replace"`, its argv)
    restore: remove our drop-in; daemon-reload; reset-failed; restart (or stop, if the unit was not
             running); verify every file is byte-identical to the snapshot; disarm the timer; unlock
    persist: (`tuner apply`, after a verification run) the same text as APPLIED_NAME under /etc, ours
             under /run removed: the running server already has these settings, so it is not restarted

The drop-in lives under /run, so a host rebooted mid-trial boots on its baseline. We never run
`systemctl revert`: it would delete the operator's drop-ins too. `tuner restore` removes the file
`tuner apply` wrote, and only that.

The modules: `deployer.py` (the options and the lifecycle above), `unit_file.py` (the drop-in's and the
secrets file's text, pure), `unit.py` (the unit read and driven: systemctl, its properties, files and
journal), `paths.py` (our files on the host), `lock.py` (the host's lock), `dead_man.py` (the timer),
`snapshot.py` (the unit as found, and the restore held to it), `start.py` (a start watched and verified),
`operator_server.py` (where the server answers) and `check.py` (`tuner run --check`'s look at the unit).
"""

from __future__ import annotations

from tuner.deployers.systemd.deployer import SystemdDeployer, SystemdOptions
from tuner.deployers.systemd.paths import APPLIED_NAME, DROP_IN_NAME
from tuner.deployers.systemd.unit_file import (
    check_kept_command,
    parse_show_environment,
    quote_unit_word,
    render_drop_in,
    render_secrets_file,
)

__all__ = [
    "APPLIED_NAME",
    "DROP_IN_NAME",
    "SystemdDeployer",
    "SystemdOptions",
    "check_kept_command",
    "parse_show_environment",
    "quote_unit_word",
    "render_drop_in",
    "render_secrets_file",
]
