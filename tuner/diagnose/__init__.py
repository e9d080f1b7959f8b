"""`tuner diagnose`: why a server is slow, from its own log, before any trial.

`diagnose_log(path or lines)` reads a llama-server log (plain, with or without timestamps, or
`journalctl -u UNIT` output; an Ollama journal whose runner writes llama-server's lines) or vLLM's stats
lines in one streaming pass and returns a `Diagnosis`: findings worst first (by the time they cost the
users), each with its figures, evidence (time range, tasks, slots, line numbers) and the knob that
addresses it. It only reads: nothing here reaches a host.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from tuner.diagnose.analyses import ANALYSES, LoraSwitch, Stalls, Waits, new_analyses
from tuner.diagnose.analyses.stalls import UNREADABLE_TOK_S
from tuner.diagnose.identity import ServerIdentity
from tuner.diagnose.ollama_levers import in_ollamas_terms
from tuner.diagnose.reader import LogFacts, ReadContext, read_llama_server_log
from tuner.diagnose.report import (
    DIAGNOSIS_VERSION,
    Diagnosis,
    Evidence,
    Figure,
    Finding,
    Fix,
    ServerFacts,
    StudyConstraint,
    StudyObjective,
    counted,
)
from tuner.diagnose.vllm import VllmReader, read_metrics_scrape
from tuner.errors import ConfigError
from tuner.text import duration_text

__all__ = [
    "ANALYSES",
    "DIAGNOSIS_VERSION",
    "Diagnosis",
    "Evidence",
    "Figure",
    "Finding",
    "Fix",
    "ServerFacts",
    "StudyConstraint",
    "StudyObjective",
    "diagnose_log",
    "format_duration",
    "parse_duration",
]

_LOG_FIX = "pass the server's own log: llama-server's stderr, `journalctl -u UNIT > today.log`, or vLLM's log"
# Ollama's own runner (0.3 and later) logs one access line per request ([GIN]: its end to the second and its
# whole duration) and no prompt, batch or queue timing at any OLLAMA_DEBUG level: nothing to diagnose a stall
# or a wait from, nor a prediction or a study's starting point (`--predict`, `--study --like`).
_OLLAMA_WITHOUT_TASKS = (
    "an Ollama log, whose runner logs no prompt, batch or queue timing per request (only one [GIN] access line "
    "with its total time, at any OLLAMA_DEBUG level), so diagnose, --predict and --study cannot read stalls or "
    "waits from it; measure instead with a study of your server: copy studies/ollama-five-users.toml, set "
    "engine.model to your model and [host] and [deploy] to your server (docs/production-host.md)"
)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `15m`, `2h`, `1h30m`, `1.5h`: seconds. ValueError with the accepted forms otherwise."""
    value = text.strip().lower()
    if not value:
        raise ValueError("is empty")
    try:
        seconds = float(value)
    except ValueError:
        seconds = _units(text, value)
    if math.isnan(seconds) or seconds < 0 or math.isinf(seconds):
        raise ValueError(f"{text!r} is not a duration of zero or more")
    return seconds


def _units(text: str, value: str) -> float:
    seconds, rest = 0.0, value
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if unit in rest:
            number, _, rest = rest.partition(unit)
            try:
                seconds += float(number) * size
            except ValueError:
                raise ValueError(f"{text!r} is not a duration") from None
    if rest:
        raise ValueError(f"{text!r} is not a duration")
    return seconds


def format_duration(seconds: float) -> str:
    """A time in a log, to the second: `3.2s`, `3m05s`, `1h02m03s` (tuner.text's `exact` style)."""
    return duration_text(seconds, style="exact")


def _open_lines(path: Path) -> Iterator[tuple[int, str]]:
    shown = "standard input" if str(path) == "-" else str(path)
    if str(path) != "-":
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise ConfigError(f"{shown}: file not found; {_LOG_FIX}") from None
        except PermissionError:
            raise ConfigError(f"{shown}: permission denied; run as a user who may read it, or copy it") from None
        if stat.S_ISDIR(mode):
            raise ConfigError(f"{shown} is a directory; {_LOG_FIX}")
    try:
        handle = open(0 if str(path) == "-" else path, "rb", closefd=str(path) != "-")  # noqa: SIM115
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read: {exc.strerror}; {_LOG_FIX}") from None
    with handle:
        head = handle.peek(8192)[:8192] if hasattr(handle, "peek") else b""
        if b"\x00" in head:
            raise ConfigError(
                f"{shown} is a binary file, not a text log; decompress it first (zcat, journalctl --file), "
                f"or {_LOG_FIX}"
            )
        for number, raw in enumerate(handle, start=1):
            yield number, raw.decode("utf-8", errors="replace").rstrip("\r\n")


def _numbered(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(lines, start=1):
        yield number, line.rstrip("\r\n")


def diagnose_log(
    source: Path | str | Iterable[str],
    *,
    long_prompt_tokens: int = 1000,
    min_overlap_s: float = 0.5,
    min_wait_s: float = 1.0,
    since_s: float | None = None,
    until_s: float | None = None,
    metrics_scrape: Path | None = None,
    name: str | None = None,
) -> Diagnosis:
    """The findings of one log, worst first. `source` is a path (`-` for standard input) or the lines
    themselves; `since_s`/`until_s` keep the requests launched within that range of the log's clock
    (seconds since its first timestamp). Raises `ConfigError` (one line naming the problem and the fix)
    for a missing, binary or unreadable file and for a log without any server line."""
    if isinstance(source, str | Path):
        path = Path(source)
        numbered = _open_lines(path)
        shown = name or ("-" if str(path) == "-" else path.name)
    else:
        numbered = _numbered(source)
        shown = name or "-"
    if since_s is not None and until_s is not None and until_s < since_s:
        raise ConfigError("--until is before --since; pass a range whose end comes after its start")
    context = ReadContext(
        facts=LogFacts(),
        long_prompt_tokens=long_prompt_tokens,
        min_overlap_s=min_overlap_s,
        min_wait_s=min_wait_s,
        since_s=since_s,
        until_s=until_s,
    )
    analyses = new_analyses()
    vllm = VllmReader()
    identity = ServerIdentity()
    reading = _Counter(numbered, vllm, identity)
    read_llama_server_log(reading, analyses, context)
    facts = context.facts
    if facts.matched_lines == 0 and vllm.stats == 0:
        if facts.untimed_lines:
            raise ConfigError(
                f"{shown}: the llama-server lines have no timestamps; keep llama-server's default --log-timestamps, "
                "or pass journalctl output (`journalctl -o short-precise -u UNIT`), whose lines carry the time"
            )
        if identity.ollama:
            raise ConfigError(f"{shown}: {_OLLAMA_WITHOUT_TASKS}")
        raise ConfigError(f"{shown}: no llama-server or vLLM lines in {reading.count:,} lines; {_LOG_FIX}")
    scrape = read_metrics_scrape(_scrape_lines(metrics_scrape)) if metrics_scrape is not None else {}
    if facts.matched_lines == 0:
        return _vllm_diagnosis(
            shown,
            lines=reading.count,
            vllm=vllm,
            models=identity.models,
            scrape=scrape,
            long_prompt_tokens=long_prompt_tokens,
            since_s=since_s,
            until_s=until_s,
        )
    span = facts.last_s or 0.0
    if since_s is not None and since_s > span:
        raise ConfigError(
            f"--since {format_duration(since_s)} is past the end of {shown}, which spans {format_duration(span)}; "
            "pass a time from the log's first line, e.g. --since 0s"
        )
    results: dict[str, object] = {}
    findings: list[Finding] = []
    for item in analyses:
        findings.extend(item.findings(context, results))
    findings.sort(key=lambda f: (f.user_seconds_lost is None, -(f.user_seconds_lost or 0.0)))
    profile = [figure for item in analyses for figure in item.profile()]
    stalls = next(a for a in analyses if isinstance(a, Stalls))
    tasks = len(next(a for a in analyses if isinstance(a, Waits)).with_wait)
    notes = _notes(context, analyses, vllm)
    return Diagnosis(
        source=shown,
        log_kind="llama-server",
        lines=reading.count,
        tasks=tasks,
        span_s=round(span, 3),
        since_s=since_s,
        until_s=until_s,
        long_prompt_tokens=long_prompt_tokens,
        server=ServerFacts(
            n_slots=facts.n_slots or (max(facts.epochs_with_slots.values()) if facts.epochs_with_slots else None),
            n_ctx_slot=facts.n_ctx_slot,
            n_batch=stalls.n_batch(),
            verbose_log=facts.verbose,
            restarts=facts.restarts,
            engine="ollama" if identity.ollama else "llama-server",
            models=identity.models,
        ),
        findings=in_ollamas_terms(findings) if identity.ollama else findings,
        profile=profile,
        notes=notes,
    )


class _Counter:
    """Passes the lines on, counting them and offering each to the vLLM reader and to the server's identity
    (one pass for all)."""

    def __init__(self, lines: Iterator[tuple[int, str]], vllm: VllmReader, identity: ServerIdentity) -> None:
        self.lines, self.vllm, self.identity, self.count = lines, vllm, identity, 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for number, line in self.lines:
            self.count = number
            self.identity.feed(line)
            if "Avg prompt throughput" in line:
                self.vllm.feed(number, line)
                continue
            yield number, line


def _scrape_lines(path: Path) -> Iterator[str]:
    for _, line in _open_lines(path):
        yield line


def _notes(context: ReadContext, analyses: list, vllm: VllmReader) -> list[str]:  # type: ignore[type-arg]
    facts = context.facts
    notes = []
    waits = next(a for a in analyses if isinstance(a, Waits))
    if waits.inferred:
        notes.append(
            "the log does not name LoRA settings at this verbosity: a wait while other slots decoded with room in "
            "the batch is counted as behind another LoRA setting (llama-server leaves out only slots it cannot "
            "batch with); -lv 4 logs each switch"
        )
    stalls = next(a for a in analyses if isinstance(a, Stalls))
    if stalls.nothing_to_compare:
        notes.append(
            f"streams decoded beside a long prefill ({counted(len(stalls.overlaps), 'overlap')}) but nowhere else, "
            f"and no request decoded alone: with no speed to compare with and none under {UNREADABLE_TOK_S:g} "
            "tok/s, no stall is claimed"
        )
    switch = next(a for a in analyses if isinstance(a, LoraSwitch)).cost
    if switch is not None and switch.ms is None and (switch.switches or waits.totals["other_lora"][0]):
        notes.append(f"LoRA switch cost: absent: {switch.reason}")
    if facts.unfinished:
        notes.append(f"{counted(facts.unfinished, 'task')} had not finished when the log (or a server run) ended")
    if facts.restarts:
        notes.append(
            f"the server restarted {counted(facts.restarts, 'time')} in this log; each run was read on one clock"
        )
    if vllm.stats:
        notes.append(f"{counted(vllm.stats, 'vLLM stats line')} left aside: the log is read as llama-server's")
    for at, line, text in facts.errors[:3]:
        notes.append(f"line {line} ({format_duration(at)}): {text}")
    return notes


def _vllm_diagnosis(
    shown: str,
    *,
    lines: int,
    vllm: VllmReader,
    models: list[str],
    scrape: dict[str, float],
    long_prompt_tokens: int,
    since_s: float | None,
    until_s: float | None,
) -> Diagnosis:
    findings = sorted(vllm.findings(scrape), key=lambda f: (f.user_seconds_lost is None, -(f.user_seconds_lost or 0.0)))
    notes = [] if scrape else ["no /metrics scrape was given (--metrics FILE adds its counters)"]
    if since_s is not None or until_s is not None:
        notes.append("--since/--until are not applied to vLLM stats lines")
    return Diagnosis(
        source=shown,
        log_kind="vllm",
        lines=lines,
        tasks=0,
        span_s=round(vllm.last_s or 0.0, 3),
        since_s=since_s,
        until_s=until_s,
        long_prompt_tokens=long_prompt_tokens,
        server=ServerFacts(engine="vllm", models=models),
        findings=findings,
        notes=notes,
    )
