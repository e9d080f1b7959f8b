"""The process deployer against a stand-in server (tests/data/health_server.py), no llama-server needed.

Time bounds here are deadlines for a condition, generous enough for a busy 2-core machine: a test that
passes waits only as long as the condition takes, never for the bound itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from optuna.trial import TrialState
from pydantic import SecretStr

from tests.support import free_port
from tuner.config import StudySpec
from tuner.deployers import ProcessDeployer
from tuner.deployers.process import ProcessOptions
from tuner.errors import ServerNotReady
from tuner.models import LaunchSpec
from tuner.search import run_study
from tuner.study_record import TrialRecord
from tuner.transports import LocalTransport

STAND_IN = Path(__file__).resolve().parents[1] / "data" / "health_server.py"


def stand_in(port: int, loading_s: float = 0.5) -> LaunchSpec:
    return LaunchSpec(
        executable=sys.executable,
        args=(str(STAND_IN),),
        env={"PORT": str(port), "LOADING_S": str(loading_s)},
        port=port,
    )


def gone(pid: int) -> bool:
    """The process no longer exists (stopped and reaped by the deployer, not merely signalled)."""
    return not Path(f"/proc/{pid}").exists()


def test_apply_waits_for_a_200_not_the_503_while_loading_and_restore_stops_the_server(tmp_path: Path) -> None:
    async def scenario() -> int:
        async with LocalTransport() as transport:
            async with ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
                assert await deployer.check_alive() == "no server was started"
                deployment = await deployer.apply(
                    stand_in(free_port(), loading_s=1.0), log_path=str(tmp_path / "a.log")
                )
                assert await deployer.check_alive() is None
                assert deployment.pid is not None
            # The deployer's own restore stopped it, not the transport's last-resort cleanup.
            assert gone(deployment.pid)
            return deployment.pid

    asyncio.run(scenario())
    answers = [line for line in (tmp_path / "a.log").read_text().splitlines() if '"GET /health' in line]
    assert " 503 " in answers[0] and " 200 " in answers[-1], answers
    assert all(" 200 " not in line for line in answers[:-1]), "apply returned at the first 200, not later"


def test_a_new_apply_replaces_the_running_server(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int]:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            first = await deployer.apply(stand_in(free_port(), 0.1), log_path=str(tmp_path / "1.log"))
            second = await deployer.apply(stand_in(free_port(), 0.1), log_path=str(tmp_path / "2.log"))
            assert first.pid is not None and second.pid is not None
            assert gone(first.pid)
            return first.pid, second.pid

    first, second = asyncio.run(scenario())
    assert first != second


def test_a_server_that_exits_while_starting_fails_fast_with_its_last_error_line(tmp_path: Path) -> None:
    launch = LaunchSpec(
        executable="sh", args=("-c", "echo 'error: unknown argument --bogus' >&2; exit 1"), port=free_port()
    )

    async def scenario() -> None:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            await deployer.apply(launch, log_path=str(tmp_path / "bad.log"))

    # Fast means long before the 120 s start timeout: noticed at the first poll after the exit.
    with pytest.raises(ServerNotReady, match=r"exited with status 1.*unknown argument --bogus"):
        asyncio.run(asyncio.wait_for(scenario(), timeout=60))


def test_a_server_that_never_gets_healthy_fails_at_the_start_timeout_and_is_stopped(tmp_path: Path) -> None:
    # 8 s: ample for the stand-in to bind its port and answer 503 on a loaded machine, so the last
    # answer is the server's own, not a refused connection.
    options = ProcessOptions(start_timeout_s=8.0)
    log = tmp_path / "slow.log"

    async def scenario() -> None:
        async with LocalTransport() as transport, ProcessDeployer(options, transport=transport) as deployer:
            with pytest.raises(ServerNotReady, match=r"within 8 s \(last answer: HTTP 503\)"):
                await deployer.apply(stand_in(free_port(), loading_s=600), log_path=str(log))
            # Stopped by the failed apply itself, before the deployer's restore.
            assert gone(int(log.read_text().split()[3]))

    asyncio.run(scenario())


def test_the_server_gets_only_the_launch_environment_and_the_inherited_basics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_ARG_BATCH", "7")
    monkeypatch.setenv("SECRET_TOKEN", "do-not-pass")
    canary = "sk-canary-31c7"
    launch = LaunchSpec(
        executable="sh",
        args=("-c", 'env > "$OUT"; tr "\\0" " " < /proc/$$/cmdline > "$OUT.argv"; exit 0'),
        env={"OUT": str(tmp_path / "env")},
        secret_env={"LLAMA_API_KEY": SecretStr(canary)},
        port=free_port(),
    )

    async def scenario() -> None:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            with pytest.raises(ServerNotReady):
                await deployer.apply(launch, log_path=str(tmp_path / "log"))

    asyncio.run(scenario())
    env = (tmp_path / "env").read_text()
    assert "LLAMA_ARG_BATCH" not in env and "SECRET_TOKEN" not in env and "PATH=" in env
    assert f"LLAMA_API_KEY={canary}\n" in env  # the secret reaches the server ...
    assert canary not in (tmp_path / "env.argv").read_text()  # ... through its environment, not its argv
    assert canary not in (tmp_path / "log").read_text()


def _ended(pid: int) -> bool:
    """The kernel has ended the process: a zombie waiting to be reaped, or reaped already."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_server_killed_after_it_started_is_reported_at_the_first_check_with_the_signal(tmp_path: Path) -> None:
    async def scenario() -> str | None:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            deployment = await deployer.apply(stand_in(free_port(), 0.1), log_path=str(tmp_path / "k.log"))
            assert deployment.pid is not None and await deployer.check_alive() is None
            os.kill(deployment.pid, signal.SIGKILL)
            # Wait for the death without giving the event loop a turn, as when a server dies during a
            # round's last request and the study asks at once: the check must not need asyncio to have
            # noticed the exit first. A deadline, not a sleep: it returns as soon as the kernel is done.
            deadline = time.monotonic() + 60
            while not _ended(deployment.pid):
                assert time.monotonic() < deadline, "the kernel did not end a SIGKILLed process in 60 s"
                time.sleep(0.01)
            return await deployer.check_alive()

    assert asyncio.run(scenario()) == "the process was killed by SIGKILL"


def _study(tmp_path: Path, port: int, *, crash_at_completion: int) -> StudySpec:
    """A vLLM study on the process deployer whose server is the stand-in: the baseline runs
    --max-num-seqs 64; the only other setting, 16, crashes the server at its `crash_at_completion`-th
    completion request (the warm-up is the first, then the four replayed requests of a round)."""
    (tmp_path / "space.toml").write_text('engine = "vllm"\n\n[params.max_num_seqs]\nchoices = [16, 64]\n')
    header = {"format": "serve-tuner-trace", "version": 1, "name": "four-chats"}
    requests = [
        {
            "id": f"chat-{i}",
            "offset_s": 0.4 * i,
            "session": f"chat-{i}",
            "turn": 0,
            "prompt": {"new_tokens": 24},
            "output_tokens": 7,
            "tag": "chat",
        }
        for i in range(4)
    ]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(line) + "\n" for line in (header, *requests)))
    return StudySpec.model_validate(
        {
            "name": "killed-mid-replay",
            "rounds": 2,
            "interleave": 1,
            "extra_rounds_if_noisy": 0,
            "budget": {"trials": 1},
            "deploy": {"kind": "process", "start_timeout_s": 300},  # a deadline for a loaded machine
            "engine": {
                "kind": "vllm",
                "command": [sys.executable, str(STAND_IN)],
                "model": "stand-in/model",
                "port": port,
                "settings": {"max_num_seqs": 64},
                "env": {
                    "LOADING_S": "0.2",
                    "CRASH_WITH": "--max-num-seqs 16",
                    "CRASH_AT_COMPLETION": str(crash_at_completion),
                },
            },
            "workload": {"path": "trace.jsonl", "request_timeout_s": 60},
            "search": {"space": "space.toml", "sampler": "random"},
            "gate": {"enabled": False},
            "confirm": {"top": 0},
            "objectives": [{"metric": "ttft_p95_s", "direction": "minimize"}],
        }
    )


@pytest.mark.parametrize(
    ("crash_at_completion", "answered"),
    [(3, 1), (5, 3)],
    ids=["mid-replay", "at-the-last-request"],  # the last: the study asks check_alive right after
)
def test_a_server_killed_mid_replay_fails_the_trial_with_the_reason_and_no_partial_score(
    tmp_path: Path, crash_at_completion: int, answered: int
) -> None:
    spec = _study(tmp_path, free_port(), crash_at_completion=crash_at_completion)
    run_path = tmp_path / "runs" / spec.name

    study = asyncio.run(run_study(spec, tmp_path, run_path))

    trials = study.get_trials(deepcopy=False)
    (baseline,) = [t for t in trials if TrialRecord.of(t).baseline]
    (trial,) = [t for t in trials if TrialRecord.of(t).deployed and not TrialRecord.of(t).baseline]
    assert TrialRecord.of(trial).settings == {"max_num_seqs": 16}
    assert baseline.state == TrialState.COMPLETE and TrialRecord.of(baseline).baseline
    assert trial.state == TrialState.FAIL
    assert TrialRecord.of(trial).fail_reason == "the server died during round 1/2: the process was killed by SIGKILL"
    # No partial score: nothing for Optuna, no score, no rounds to rank it by.
    assert trial.values is None
    record = TrialRecord.of(trial)
    assert record.score is None and not record.round_scores and not record.rounds
    # It really died during the replay: the requests before the kill were answered, the rest failed.
    round_one = [json.loads(line) for line in (run_path / "trials" / f"{trial.number:04d}" / "round-1.jsonl").open()]
    assert sum(record["status"] == "ok" for record in round_one) == answered, round_one
    assert len(round_one) == 4
    server_log = (run_path / "trials" / f"{trial.number:04d}" / "server.log").read_text()
    assert server_log.count(f"killed at completion request {crash_at_completion}, as configured") == 1
    assert "bad completion request" not in server_log  # the stand-in accepted every body the engine sent
    assert not any(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False))


def test_the_vllm_stand_in_refuses_what_vllm_would_so_the_study_tests_cannot_pass_on_a_wrong_request(
    tmp_path: Path,
) -> None:
    port = free_port()
    launch = LaunchSpec(
        executable=sys.executable,
        args=(str(STAND_IN), "stand-in/model", "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "16"),
        env={"LOADING_S": "0"},
        port=port,
    )
    bogus = launch.model_copy(update={"args": (*launch.args, "--bogus-flag", "1")})

    async def scenario() -> list[tuple[int, str]]:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            with pytest.raises(ServerNotReady, match=r"exited with status 2.*unrecognized arguments: --bogus-flag 1"):
                await deployer.apply(bogus, log_path=str(tmp_path / "bogus.log"))
            deployment = await deployer.apply(launch, log_path=str(tmp_path / "ok.log"))
            good = {"model": "stand-in/model", "prompt": [101, 102], "max_tokens": 4, "stream": True}
            answers = []
            async with httpx.AsyncClient(base_url=deployment.base_url, timeout=30) as client:
                for body in (good, {**good, "model": "other"}, {**good, "prompt": []}, {**good, "max_tokens": 0}):
                    response = await client.post("/v1/completions", json=body)
                    answers.append((response.status_code, response.text))
            return answers

    ok, wrong_model, no_prompt, no_tokens = asyncio.run(scenario())
    assert ok[0] == 200 and ok[1].startswith("data: ")
    assert wrong_model == (400, json.dumps({"error": "model 'other' is not the served model 'stand-in/model'"}))
    assert no_prompt[0] == 400 and "prompt is neither" in no_prompt[1]
    assert no_tokens[0] == 400 and "max_tokens 0 is not a positive integer" in no_tokens[1]


def test_a_state_file_naming_another_process_stops_nothing(tmp_path: Path) -> None:
    # The id a killed run kept may belong to an unrelated process by now: its start time differs, so it runs on.
    import asyncio
    import json
    import subprocess

    from tuner.deployers.process import ProcessDeployer, ProcessOptions
    from tuner.transports import LocalTransport

    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = tmp_path / "deployer-state.json"
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        state.write_text(json.dumps({"pid": bystander.pid, "boot": boot, "start": "1"}))  # its start differs

        async def enter() -> None:
            async with LocalTransport() as transport:
                deployer = ProcessDeployer(ProcessOptions(), transport=transport)
                deployer.remember_in(state)
                async with deployer:
                    pass

        asyncio.run(enter())
        assert bystander.poll() is None, "an unrelated process was stopped"
        assert not state.exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_a_killed_runs_server_that_ignores_sigterm_is_killed_and_waited_for(tmp_path: Path) -> None:
    import asyncio
    import json
    import subprocess
    import time

    from tuner.deployers.process import ProcessDeployer, ProcessOptions
    from tuner.transports import LocalTransport

    stubborn = subprocess.Popen(["sh", "-c", 'trap "" TERM; while true; do sleep 1; done'], start_new_session=True)
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        start = Path(f"/proc/{stubborn.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        state = tmp_path / "deployer-state.json"
        state.write_text(json.dumps({"pid": stubborn.pid, "boot": boot, "start": start}))

        async def enter() -> None:
            async with LocalTransport() as transport:
                deployer = ProcessDeployer(ProcessOptions(stop_grace_s=0.5), transport=transport)
                deployer.remember_in(state)
                async with deployer:
                    pass

        asyncio.run(enter())
        # Gone before the deployer goes on (a zombie only waits for this test, its parent, to reap it).
        fields = Path(f"/proc/{stubborn.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert fields[0] == "Z", f"still running, state {fields[0]}"
        assert not state.exists()
        deadline = time.monotonic() + 30
        while stubborn.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stubborn.returncode == -9  # it took SIGKILL: SIGTERM was ignored
    finally:
        stubborn.kill()
        stubborn.wait()
