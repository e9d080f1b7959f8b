"""`tuner diagnose` on logs of the real llama-server (`tuner setup`'s build and model), produced here under
known conditions and checked against what this test's own client measured: a long prefill beside two
streams at n_batch 64 and 2048, mixed LoRA settings, a prompt-cache eviction with every slot busy, the
journalctl-wrapped versions of the same lines, and a clean log.

One server per configuration (module-scoped), small prompts, one server thread: the whole file takes
about a minute on two cores (61 s measured).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tuner.diagnose import Diagnosis, Finding, diagnose_log
from tuner.metrics import compute_metrics
from tuner.models import ReplayRequest, RequestRecord

# Each log is recorded beside the client's own measurements, which the findings are held to.
pytestmark = [pytest.mark.real_server, pytest.mark.measures]

STYLE = (("style", 1.0),)
# Lower than the default (1000): a prompt this long takes several seconds to prefill at n_batch 64 on two
# cores, long enough for the server's progress lines (printed after 3 s of prefill) to show its iterations.
LONG = 800
BUSY = 300  # the prompts of the all-slots-busy log
LONG_2048 = 1200  # one iteration at n_batch 2048: long enough to span several of the streams' tokens


@dataclass(frozen=True)
class ServedLog:
    path: Path
    # Each `send`'s records: a replay times its requests from its own start, so two sends' times do not compare.
    batches: list[list[RequestRecord]]

    @property
    def records(self) -> list[RequestRecord]:
        return [record for batch in self.batches for record in batch]

    @property
    def lines(self) -> list[str]:
        return self.path.read_text().splitlines()


Send = Callable[[list[ReplayRequest]], Awaitable[list[RequestRecord]]]


def request(
    request_id: str,
    offset: float,
    prompt: int,
    output: int,
    *,
    lora: tuple[tuple[str, float], ...] | None = None,
    session: str | None = None,
    turn: int = 0,
    prefix: tuple[int, ...] = (),
) -> ReplayRequest:
    seed = sum(map(ord, request_id)) * 7919
    tokens = prefix + tuple(100 + (seed + 31 * i) % 29000 for i in range(prompt - len(prefix)))
    return ReplayRequest(
        request_id=request_id,
        session=session or request_id,
        turn=turn,
        offset_s=offset,
        prompt_token_ids=tokens,
        output_tokens=output,
        lora=lora,
    )


def serve(
    log: Path, settings: dict[str, object], scenario: Callable[[Send], Awaitable[None]], *, lora: bool = False
) -> ServedLog:
    """Starts the real llama-server with `settings` (its stderr in `log`), runs `scenario` against it with
    the replay's own client, stops it; the records are every request's, as the client measured them."""
    from tuner import assets
    from tuner.config import PluginSpec
    from tuner.deployers import ProcessDeployer
    from tuner.deployers.process import ProcessOptions
    from tuner.engines import create_engine
    from tuner.loadgen import replay
    from tuner.transports import LocalTransport

    options: dict[str, object] = {"kind": "llama-server", "settings": settings}
    if lora:
        options["lora_adapters"] = {"style": str(assets.ensure_test_lora(log=False))}
    engine = create_engine(PluginSpec.model_validate(options))
    batches: list[list[RequestRecord]] = []

    async def run() -> None:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            deployment = await deployer.apply(engine.launch_spec({}), log_path=str(log))

            async def send(requests: list[ReplayRequest]) -> list[RequestRecord]:
                done = await replay(requests, engine=engine, base_url=deployment.base_url, request_timeout_s=180)
                assert all(r.ok for r in done), [r.error for r in done]
                batches.append(done)
                return done

            await scenario(send)

    asyncio.run(run())
    return ServedLog(path=log, batches=batches)


def stall_scenario(long_prompt: int) -> Callable[[Send], Awaitable[None]]:
    """Two streams, and a long prompt once both are past 100 tokens (from then on the server prints their
    rate lines): when that is, a lone stream measured first on the same server says."""

    async def scenario(send: Send) -> None:
        (alone,) = await send([request("calibrate", 0.0, 40, 100)])
        to_100 = alone.token_s[-1] - alone.send_s
        # Two streams decode a little slower than one: half as long again, and a second to spare.
        await send(
            [
                request("chat-1", 0.0, 40, 200),
                request("chat-2", 0.1, 40, 200),
                request("long-1", 1.0 + 1.5 * to_100, long_prompt, 4),
            ]
        )

    return scenario


# One server thread of two cores: with one per core, a core busy with other work stalls every barrier.
STALL = {"n_parallel": 3, "ctx_size": 3 * 2048, "threads": 1}


@pytest.fixture(scope="module")
def stall_64(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> ServedLog:
    log = tmp_path_factory.mktemp("diagnose-64") / "server.log"
    return serve(log, {**STALL, "n_batch": 64, "n_ubatch": 64}, stall_scenario(LONG))


@pytest.fixture(scope="module")
def stall_2048(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> ServedLog:
    log = tmp_path_factory.mktemp("diagnose-2048") / "server.log"
    # At n_batch 2048 the whole prompt is one iteration: long enough to span a few of the streams' tokens.
    return serve(log, {**STALL, "n_batch": 2048, "n_ubatch": 512}, stall_scenario(LONG_2048))


@pytest.fixture(scope="module")
def mixed_lora(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> ServedLog:
    """Pairs of users arriving together, one with the adapter, one without (workloads/lora-mix.jsonl)."""
    log = tmp_path_factory.mktemp("diagnose-lora") / "server.log"

    async def scenario(send: Send) -> None:
        for pair in range(3):
            await send([request(f"styled-{pair}", 0.0, 150, 40, lora=STYLE), request(f"plain-{pair}", 0.05, 150, 40)])

    return serve(log, {"n_parallel": 2, "threads": 1}, scenario, lora=True)


@pytest.fixture(scope="module")
def busy_and_evicting(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> ServedLog:
    """One slot, three users at once, and a RAM prompt cache of room for about one of their prompts: two
    wait for the slot, each new task saves the slot's prompt to the cache, evicting the one before, and the
    first user's second turn finds nothing of its conversation left."""
    log = tmp_path_factory.mktemp("diagnose-busy") / "server.log"

    async def scenario(send: Send) -> None:
        first = request("a-0", 0.0, BUSY, 8, session="a")
        await send([first, request("b-0", 0.02, BUSY, 8), request("c-0", 0.04, BUSY, 8)])
        await send([request("a-1", 0.0, BUSY + 40, 8, session="a2", prefix=first.prompt_token_ids)])

    # SmolLM2-135M holds about 23 KB of KV state a token: a 300-token prompt is about 7 MiB.
    return serve(log, {"n_parallel": 1, "cache_ram": 10, "threads": 1}, scenario)


@pytest.fixture(scope="module")
def clean(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> ServedLog:
    log = tmp_path_factory.mktemp("diagnose-clean") / "server.log"

    async def scenario(send: Send) -> None:
        # One conversation, one request at a time.
        await send([request(f"q{i}", 0.0, 60, 30, session="one", turn=i) for i in range(3)])

    return serve(log, {"n_parallel": 2, "threads": 1}, scenario)


def figures(finding: Finding) -> dict[str, float | None]:
    return {f.name: f.value for f in finding.figures}


def journal(lines: list[str], *, keep_server_time: bool = True) -> list[str]:
    """The lines as `journalctl -u llama-server` prints them, the journal's prefix written here as journalctl
    writes it (`Mon DD HH:MM:SS host unit[pid]: `, the time the server wrote the line); with
    `keep_server_time=False`, as `-o short-precise` prints a server started with --no-log-timestamps."""
    out = []
    for line in lines:
        stamp, _, rest = line.partition(" ")
        minutes, seconds, millis, micros = (int(p) for p in stamp.split("."))
        total = 9 * 3600 + minutes * 60 + seconds
        clock = f"Mar 03 {total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}"
        if keep_server_time:
            out.append(f"{clock} gpu-host llama-server[811]: {line}")
        else:
            out.append(f"{clock}.{millis:03d}{micros:03d} gpu-host llama-server[811]: {rest.split(' ', 1)[1]}")
    return out


def client_stall(served: ServedLog, long_prompt: int) -> float:
    """The streams' speed during the long prefill, as the client measured it: from the records of the replay that
    sent the long prompt alone. A request of an earlier replay, on that replay's clock, would seem to overlap the
    prefill: a lone request decoding at full speed from 0.4 to 1.8 s counted as a second stream beside a long
    prompt sent at 1.0 s of the next replay, and doubled the median when the machine was slow enough for it to
    overlap by 0.5 s (a busy loop on each core)."""
    (batch,) = [b for b in served.batches if any(r.prompt_tokens >= long_prompt for r in b)]
    stall = compute_metrics(batch, long_prompt_tokens=long_prompt, min_overlap_s=0.5)["stall_tok_s"]
    assert stall is not None, "the client saw no stream beside the long prefill"
    return stall


def test_a_long_prefill_beside_streams_at_n_batch_64_is_a_stall_at_the_clients_speed_naming_n_batch(
    stall_64: ServedLog,
) -> None:
    client = client_stall(stall_64, LONG)
    diagnosis = diagnose_log(stall_64.path, long_prompt_tokens=LONG)
    stall = diagnosis.finding("stalls")
    assert stall is not None, diagnosis.findings
    by_name = figures(stall)
    assert by_name["stall_tok_s"] == pytest.approx(client, rel=0.25), (by_name, client)
    unstalled = by_name["unstalled_tok_s"]
    assert unstalled is not None and unstalled > 3 * client
    # The chunks the progress lines show (62 prompt tokens beside the two streams' tokens) give n_batch.
    assert diagnosis.server.n_batch == 64
    (fix,) = stall.fixes
    assert fix.knob == "n_batch" and fix.estimate is not None and "n_batch 32 would give" in fix.estimate
    assert diagnosis.findings[0].kind == "stalls"


def test_at_n_batch_2048_the_stall_is_near_zero_as_the_client_saw_and_the_estimate_is_prefill_over_n_batch(
    stall_2048: ServedLog,
) -> None:
    client = client_stall(stall_2048, LONG_2048)
    diagnosis = diagnose_log(stall_2048.path, long_prompt_tokens=LONG_2048)
    stall = diagnosis.finding("stalls")
    assert stall is not None, diagnosis.findings
    by_name = figures(stall)
    window = next(r for r in stall_2048.records if r.request_id == "long-1")
    assert window.timings is not None
    seconds = window.timings.prompt_ms / 1000
    # About one token in the whole prefill (one iteration). The streams' rate lines are 3 s apart and none
    # falls inside it, so the log places the tokens around its start only as well as their usual speed does:
    # good to a few tokens over the window (seen: 1 and 3.5), not to 25% of one token.
    assert by_name["stall_tok_s"] == pytest.approx(client, abs=max(0.25 * client, 4 / seconds)), (by_name, client)
    stalled, unstalled = by_name["stall_tok_s"], by_name["unstalled_tok_s"]
    assert stalled is not None and unstalled is not None and stalled < 0.1 * unstalled
    prefill = by_name["prefill_tok_s"]
    assert prefill is not None and prefill == pytest.approx(LONG_2048 / seconds, rel=0.05)
    (fix,) = stall.fixes
    # One iteration held the whole prompt: no progress line, so n_batch is not inferred; 512 is proposed.
    assert fix.knob == "n_batch" and fix.estimate is not None and f"{prefill / 512:.2f} tok/s" in fix.estimate


def test_mixed_lora_settings_wait_behind_the_other_setting_as_the_case_study_classifies_them(
    mixed_lora: ServedLog,
) -> None:
    diagnosis = diagnose_log(mixed_lora.path, min_wait_s=0.3)
    waits = diagnosis.finding("waits")
    assert waits is not None, diagnosis.findings
    by_name = figures(waits)
    # What the client saw: the plain user of each pair waited for the styled one (they cannot share a batch).
    waited = [
        r.request_id
        for r in mixed_lora.records
        if r.timings is not None and r.token_s[0] - r.send_s - r.timings.prompt_ms / 1000 > 0.3
    ]
    assert sorted(waited) == ["plain-0", "plain-1", "plain-2"]
    assert by_name["other_lora_count"] == 3
    assert by_name["same_setting_count"] == 0 and by_name["nothing_count"] == 0
    assert waits.fixes[0].knob == "lora_policy"
    assert any("does not name LoRA settings" in note for note in diagnosis.notes)
    # The switch cost is never negative: a figure of zero or more, or absent with the reason.
    switch = diagnosis.finding("lora_switch")
    if switch is not None:
        cost = figures(switch)["lora_switch_ms"]
        assert cost is not None and cost > 0
    else:
        assert any(note.startswith("LoRA switch cost: absent: ") for note in diagnosis.notes), diagnosis.notes


def test_a_prompt_cache_eviction_and_every_slot_busy_are_found(busy_and_evicting: ServedLog) -> None:
    lines = busy_and_evicting.lines
    evictions = sum("removing oldest entry" in line for line in lines)
    assert evictions >= 1, "the server evicted nothing from its prompt cache: cache_ram too large for the test"
    diagnosis = diagnose_log(busy_and_evicting.path, long_prompt_tokens=BUSY)
    sources = diagnosis.finding("long_prefills")
    assert sources is not None, diagnosis.findings
    by_name = figures(sources)
    assert by_name["prompt_cache_evictions"] == evictions
    # The first user's second turn: its conversation was evicted, so all of it was prefilled again.
    assert by_name["after_evictions_count"] is not None and by_name["after_evictions_count"] >= 1
    assert any(fix.knob == "cache_ram" for fix in sources.fixes)
    queueing = diagnosis.finding("queueing")
    assert queueing is not None, diagnosis.findings
    queued = figures(queueing)
    # Three users on one slot: the second and third waited for it.
    assert queued["queued"] == 2 and queued["slots"] == 1
    # One slot: it was busy whenever the client had a request in flight, in each of its two replays (each
    # on its own clock): the three users, then the second turn.
    records = busy_and_evicting.records
    client_busy = 0.0
    for replay in (records[:3], records[3:]):
        client_busy += max(r.end_s for r in replay) - min(r.send_s for r in replay)
    busy = queued["all_slots_busy_s"]
    assert busy is not None and busy == pytest.approx(client_busy, rel=0.25), (busy, client_busy)
    assert queueing.fixes[0].knob == "n_parallel"


@pytest.mark.parametrize("keep_server_time", [True, False])
def test_journalctl_wrapped_lines_give_the_same_findings(
    stall_64: ServedLog, mixed_lora: ServedLog, busy_and_evicting: ServedLog, keep_server_time: bool
) -> None:
    for served, options in (
        (stall_64, {"long_prompt_tokens": LONG}),
        (mixed_lora, {"min_wait_s": 0.3}),
        (busy_and_evicting, {"long_prompt_tokens": BUSY}),
    ):
        plain: Diagnosis = diagnose_log(served.path, **options)
        wrapped = diagnose_log(journal(served.lines, keep_server_time=keep_server_time), **options)
        assert [f.kind for f in wrapped.findings] == [f.kind for f in plain.findings]
        for mine, theirs in zip(wrapped.findings, plain.findings, strict=True):
            for name, value in figures(theirs).items():
                again = figures(mine)[name]
                if value is None or again is None:
                    assert value == again, name
                else:
                    # The journal's own time is to the microsecond: the same figures, to rounding.
                    assert again == pytest.approx(value, rel=0.02, abs=0.01), (name, again, value)


def test_a_clean_log_yields_no_finding(clean: ServedLog) -> None:
    diagnosis = diagnose_log(clean.path)
    assert diagnosis.findings == [], [f.summary for f in diagnosis.findings]
    assert diagnosis.tasks == 3


# A new user's first short log (issue 28): a request alone, then one stream beside a long prompt, at each
# n_batch a study tries and with n_ubatch equal or smaller. Each prompt is long enough for the log to say
# how many iterations its prefill took: at n_batch 512 and 1024 a first batch that ends past the progress
# lines' 3 s delay, or batches after it (a prefill of two batches whose first ends before 3 s prints no
# line, and reads as one iteration: docs/diagnose.md); at 2048, one iteration, longer than twice the delay.
SHORT_LOGS = [(32, 32, 600), (128, 128, 800), (512, 512, 1600), (512, 128, 1600), (1024, 256, 1600), (2048, 2048, 1600)]


@pytest.fixture(scope="module", params=SHORT_LOGS, ids=[f"n_batch {b}, n_ubatch {u}" for b, u, _ in SHORT_LOGS])
def short_log(
    request: pytest.FixtureRequest, llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ServedLog, int, int]:
    n_batch, n_ubatch, long_prompt = request.param
    log = tmp_path_factory.mktemp(f"diagnose-short-{n_batch}-{n_ubatch}") / "server.log"

    async def scenario(send: Send) -> None:
        await send([request_for("solo", 0.0, 40, 60)])
        await send([request_for("stream", 0.0, 40, 120), request_for("long", 1.0, long_prompt, 4)])

    settings = {"n_parallel": 2, "ctx_size": 2 * 2048, "threads": 1, "n_batch": n_batch, "n_ubatch": n_ubatch}
    return serve(log, settings, scenario), n_batch, long_prompt


request_for = request  # the fixture's own `request` is pytest's


def test_a_short_logs_stall_is_found_at_the_clients_speed_and_n_batch_named_where_it_helps(
    short_log: tuple[ServedLog, int, int],
) -> None:
    served, n_batch, long_prompt = short_log
    client = client_stall(served, long_prompt)
    (solo,) = [r for r in served.records if r.request_id == "solo"]
    solo_tok_s = (len(solo.token_s) - 1) / (solo.token_s[-1] - solo.token_s[0])
    assert client < 0.5 * solo_tok_s, (client, solo_tok_s)  # the stream was stalled: a finding is due
    diagnosis = diagnose_log(served.path, long_prompt_tokens=long_prompt)
    stall = diagnosis.finding("stalls")
    assert stall is not None, diagnosis.findings
    by_name = figures(stall)
    (long,) = [r for r in served.records if r.request_id == "long"]
    assert long.timings is not None
    seconds = long.timings.prompt_ms / 1000
    # Within 25%, or within one token over the prefill where the stream got only a token or two in it.
    assert by_name["stall_tok_s"] == pytest.approx(client, abs=max(0.25 * client, 1 / seconds)), (by_name, client)
    (fix,) = stall.fixes
    if n_batch == 32:  # the smallest a study tries: no smaller one is named
        assert fix.knob is None, fix
    else:
        assert fix.knob == "n_batch" and fix.estimate is not None, fix
        if n_batch < 2048:  # at 2048 one iteration held the prompt: no progress line tells the batch
            assert diagnosis.server.n_batch == n_batch and f"at n_batch {n_batch}" in fix.estimate, fix
