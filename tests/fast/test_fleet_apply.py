"""`tuner apply` and `tuner restore` on a fleet: the chosen trial rolled out host by host, each host's own
verification run first, stopping at the first host where it fails (that host back on its baseline, the hosts
before it keeping what they verified, the rest untouched).

Fast tier: the fleet's study is made on simulated hosts (tests/support/sim_study.py); the verification runs start
the simulated llama-server as real processes. The deployer is the process deployer with a stand-in for the
host's configuration (systemd's drop-in, tested on a real unit in test_systemd_deployer.py): it records
what it is asked to make permanent and to remove, and what was running when it was asked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from pydantic import Field

from tests.support import run_cli
from tests.support.sim_study import DEMO, fleet_overrides, prepare_simulated, run_simulated_fleet
from tuner.deployers.base import DEPLOYERS
from tuner.deployers.process import ProcessDeployer, ProcessOptions
from tuner.errors import DeployError
from tuner.models import LaunchSpec
from tuner.study_record import TrialRecord
from tuner.transports.base import Transport

_KIND = "process-with-a-recorded-config"


class _RecordedOptions(ProcessOptions):
    record: str = Field(description="A JSON-lines file: what this host was asked to make permanent or remove.")
    fail_remove: bool = Field(default=False, description="Removing fails, as on a host that went away.")


class _RecordingDeployer(ProcessDeployer):
    """The process deployer, with a host configuration that is one line per request in `record`."""

    options_model = _RecordedOptions  # type: ignore[assignment]  # a narrower model: its options are a superset

    def __init__(self, options: _RecordedOptions, *, transport: Transport) -> None:
        super().__init__(options, transport=transport)
        self._record = Path(options.record)
        self._fail_remove = options.fail_remove

    def _write(self, entry: dict[str, Any]) -> None:
        with self._record.open("a") as out:
            out.write(json.dumps(entry) + "\n")

    async def persist(self, *, note: str) -> str:
        running = self._child is not None and await self.check_alive() is None
        self._write({"persist": note, "server_running": running})
        return str(self._record)

    async def remove_persisted(self, launch: LaunchSpec) -> str | None:
        if self._fail_remove:
            raise DeployError("cannot remove the drop-in: Connection refused")
        self._write({"remove": True})
        return str(self._record)


@pytest.fixture(autouse=True)
def _recording_deployer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in's kind, for this module's tests only (the registries' contents are tested as shipped)."""
    monkeypatch.setitem(DEPLOYERS._entries, _KIND, _RecordingDeployer)


HOSTS = ("gpu-a", "gpu-b", "gpu-c")
_SPEED = ["--sim-speed", "20"]


def _hosts_override(
    records: Path, *, broken: str | None = None, refuses: str | None = None, **deploy: dict[str, Any]
) -> str:
    """The fleet's hosts: `broken`'s server dies after one request, `refuses`' does not start; `deploy`: a
    host's [deploy] table instead of the recording one."""
    entries = []
    for name in HOSTS:
        fault = {broken: ["--sim-fault", "die-after=1"], refuses: ["--sim-fault", "refuse-start"]}.get(name, [])
        table = deploy.get(name.replace("-", "_")) or {
            "kind": _KIND, "record": f"{records / name}.jsonl", "start_timeout_s": 30
        }  # fmt: skip
        entries.append(
            f'{{name = "{name}", deploy = {_toml(table)}, engine = {{extra_args = {json.dumps([*_SPEED, *fault])}}}}}'
        )
    return "hosts=[" + ", ".join(entries) + "]"


def _toml(table: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{key} = {json.dumps(value)}" for key, value in table.items()) + "}"


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A fleet study's run directory (its journal) and a trial of it that completed."""
    runs = tmp_path_factory.mktemp("runs")
    prepared = prepare_simulated(
        [*fleet_overrides(list(HOSTS)), "budget.trials=3", "confirm.top=0", 'search.pruner="none"']
    )
    run_path = runs / prepared.spec.name
    run_path.mkdir()
    storage = JournalStorage(JournalFileBackend(str(run_path / "optuna.journal")))
    study = run_simulated_fleet(prepared, run_path, hosts=dict.fromkeys(HOSTS, 1.0), seed=2, storage=storage).study
    done = [t.number for t in study.get_trials() if t.state == TrialState.COMPLETE and not TrialRecord.of(t).baseline]
    return runs, done[0]


def _apply(capsys: pytest.CaptureFixture[str], runs: Path, trial: int, records: Path, *extra: str) -> Any:
    argv = ["apply", str(DEMO), "--runs-dir", str(runs), "--trial", str(trial), "--set", 'engine.binary="simulated"']
    argv += ["--set", "workload.time_scale=0.05", *extra]
    return run_cli(capsys, *argv)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_apply_rolls_the_trial_out_to_every_host_each_after_its_own_verification_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fleet_run: tuple[Path, int]
) -> None:
    runs, trial = fleet_run
    outcome = _apply(capsys, runs, trial, tmp_path, "--set", _hosts_override(tmp_path))
    assert outcome.code == 0, outcome.err
    for host in HOSTS:
        (persisted,) = _lines(tmp_path / f"{host}.jsonl")
        assert persisted["server_running"] and f"trial {trial}" in persisted["persist"]
        assert f"verification run on {host}:" in outcome.out
        assert f"applied trial {trial} (" in outcome.out and f") on {host} for good" in outcome.out
    # The verification runs' server logs, one per host, in the run directory.
    logs = sorted(p.name for p in (runs / "stall-demo" / "apply").glob("*-server.log"))
    assert [name.rsplit("-server.log")[0].split("-", 1)[1] for name in logs] == list(HOSTS)


def test_a_host_whose_verification_fails_stops_the_rollout_there(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fleet_run: tuple[Path, int]
) -> None:
    runs, trial = fleet_run
    outcome = _apply(capsys, runs, trial, tmp_path, "--set", _hosts_override(tmp_path, broken="gpu-b"))
    assert outcome.code == 1
    line = outcome.error_line()
    assert "host gpu-b: the verification run failed" in line and "stays on its baseline" in line, line
    assert f"gpu-a keeps trial {trial}" in line and "not tried: gpu-c" in line, line
    assert f"applied trial {trial} (" in outcome.out and ") on gpu-a for good" in outcome.out  # said as it was done
    assert len(_lines(tmp_path / "gpu-a.jsonl")) == 1
    assert _lines(tmp_path / "gpu-b.jsonl") == [] and _lines(tmp_path / "gpu-c.jsonl") == []


def test_a_host_whose_server_does_not_start_stops_the_rollout_and_says_who_keeps_the_trial(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fleet_run: tuple[Path, int]
) -> None:
    runs, trial = fleet_run
    outcome = _apply(capsys, runs, trial, tmp_path, "--set", _hosts_override(tmp_path, refuses="gpu-b"))
    assert outcome.code != 0 and "Traceback" not in outcome.err
    assert f"the rollout stopped at host gpu-b, which is back on its baseline; gpu-a keeps trial {trial}" in outcome.out
    assert "not tried: gpu-c" in outcome.out
    assert len(_lines(tmp_path / "gpu-a.jsonl")) == 1 and _lines(tmp_path / "gpu-c.jsonl") == []


def test_a_host_whose_deploy_cannot_keep_a_trial_is_refused_before_any_host_is_touched(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fleet_run: tuple[Path, int]
) -> None:
    runs, trial = fleet_run
    hosts = _hosts_override(tmp_path, gpu_c={"kind": "process", "start_timeout_s": 30})
    outcome = _apply(capsys, runs, trial, tmp_path, "--set", hosts)
    assert outcome.code == 2
    assert "deploy.kind = 'process' (host gpu-c) has no configuration of the host to write" in outcome.error_line()
    assert all(_lines(tmp_path / f"{host}.jsonl") == [] for host in HOSTS)
    restore = run_cli(capsys, "restore", str(DEMO), "--set", 'engine.binary="simulated"', "--set", hosts)
    assert restore.code == 2 and "(host gpu-c) writes nothing" in restore.error_line()
    assert all(_lines(tmp_path / f"{host}.jsonl") == [] for host in HOSTS)


def test_restore_tries_every_host_and_names_the_ones_it_could_not_restore(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    failing = {"kind": _KIND, "record": str(tmp_path / "gpu-b.jsonl"), "fail_remove": True}
    hosts = _hosts_override(tmp_path, gpu_b=failing)
    outcome = run_cli(capsys, "restore", str(DEMO), "--set", 'engine.binary="simulated"', "--set", hosts)
    assert outcome.code == 1
    line = outcome.error_line()
    assert "could not restore 1 of 3 hosts (gpu-b: cannot remove the drop-in: Connection refused)" in line, line
    assert "gpu-a: removed" in outcome.out and "gpu-c: removed" in outcome.out
    assert _lines(tmp_path / "gpu-a.jsonl") == [{"remove": True}] == _lines(tmp_path / "gpu-c.jsonl")


def test_apply_and_restore_on_the_hosts_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fleet_run: tuple[Path, int]
) -> None:
    runs, trial = fleet_run
    hosts = _hosts_override(tmp_path)
    assert _apply(capsys, runs, trial, tmp_path, "--set", hosts, "--host", "gpu-c").code == 0
    assert [len(_lines(tmp_path / f"{h}.jsonl")) for h in HOSTS] == [0, 0, 1]
    restore = run_cli(
        capsys, "restore", str(DEMO), "--set", 'engine.binary="simulated"', "--set", hosts, "--host", "gpu-c"
    )
    assert restore.code == 0, restore.err
    assert "gpu-c: removed" in restore.out
    assert _lines(tmp_path / "gpu-c.jsonl")[-1] == {"remove": True}
    assert _lines(tmp_path / "gpu-a.jsonl") == []
    unknown = _apply(capsys, runs, trial, tmp_path, "--set", hosts, "--host", "gpu-z")
    assert unknown.code == 2 and "--host 'gpu-z' is not a host of the study" in unknown.error_line()


def test_host_on_a_one_host_study_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    outcome = run_cli(capsys, "restore", str(DEMO), "--host", "gpu-a")
    assert outcome.code == 2 and "the study has none" in outcome.error_line()
