"""The data contracts between the seams: what a deployer launches, what the load generator sends,
what it records, and what a trial produced. Timing stays apart from payload: a `ReplayRequest`
says what to send and when, a `RequestRecord` says what happened, measured on one monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = [
    "AnswerSpan",
    "LaunchSpec",
    "PrefillProgress",
    "ReplayRequest",
    "RequestRecord",
    "RequestStatus",
    "ServerTimings",
    "TaskTimeline",
    "TokenRateSample",
]


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LaunchSpec(_Contract):
    """Everything a deployer needs to start a server, and nothing about which engine it is."""

    executable: str = Field(description="Program to run.")
    args: tuple[str, ...] = Field(default=(), description="Command-line arguments after the program.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables the server reads.")
    secret_env: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Environment variables that hold secrets (an API key): never on a command line, in a "
        "unit file, a log or a repr; deployers pass them in a file only the server's user can read.",
    )
    host: str = Field(default="127.0.0.1", description="Address the server listens on.")
    port: int = Field(description="TCP port the server listens on.")
    health_path: str = Field(default="/health", description="GET path that answers 200 once ready.")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> tuple[str, ...]:
        return (self.executable, *self.args)

    def secret_values(self) -> dict[str, str]:
        return {name: value.get_secret_value() for name, value in self.secret_env.items()}


class AnswerSpan(_Contract):
    """Where an earlier turn's answer sits in a prompt's session history, as a placeholder."""

    start: int = Field(ge=0)
    length: int = Field(ge=0)
    request_id: str

    def shifted(self, by: int) -> AnswerSpan:
        return self.model_copy(update={"start": self.start + by})


class ReplayRequest(_Contract):
    """One request of a workload, ready to send: its schedule, its prompt as token ids, its output.

    `answer_spans` name the stretches of the prompt that stand for earlier answers of the session; the
    load generator replaces them with the token ids the server generated for those answers, so the
    prompt is exactly what the server holds in its cache, as in production.
    """

    request_id: str
    session: str
    turn: int = 0
    offset_s: float = Field(ge=0, description="Arrival time relative to the start of the replay.")
    think_s: float = Field(default=0.0, ge=0, description="Pause after the session's previous turn ended.")
    prompt_token_ids: tuple[int, ...]
    answer_spans: tuple[AnswerSpan, ...] = ()
    output_tokens: int = Field(gt=0)
    tag: str = "chat"
    lora: tuple[tuple[str, float], ...] | None = Field(
        default=None, description="Adapter names and scales; None leaves the server's default."
    )

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


class RequestStatus(StrEnum):
    OK = "ok"
    HTTP_ERROR = "http_error"
    REJECTED = "rejected"  # HTTP 503: the server's queue was full
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    NO_OUTPUT = "no_output"


class ServerTimings(_Contract):
    """What the server says it spent on one request (llama-server's `timings` object)."""

    cache_n: int = 0
    prompt_n: int = 0
    prompt_n_includes_cached: bool = Field(
        default=False, description="prompt_n counts cached tokens too (Ollama), so it is not the computed part."
    )
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0


class RequestRecord(_Contract):
    """What happened to one request, on the replay's monotonic clock (seconds from its start)."""

    request_id: str
    session: str
    tag: str
    prompt_tokens: int
    output_tokens_requested: int
    lora: tuple[tuple[str, float], ...] = Field(default=(), description="Adapters and scales it ran with.")
    send_s: float
    due_s: float | None = Field(
        default=None,
        description="When the schedule had it sent (its arrival, or its session's previous turn's end plus "
        "think time); send_s minus this is the load generator's own lateness. None in records made before 0.2.",
    )
    token_s: tuple[float, ...] = Field(default=(), description="Arrival time of every streamed token.")
    end_s: float
    status: RequestStatus
    http_status: int | None = None
    error: str | None = None
    timings: ServerTimings | None = None

    @property
    def ok(self) -> bool:
        return self.status is RequestStatus.OK

    @property
    def first_token_s(self) -> float | None:
        return self.token_s[0] if self.token_s else None


@dataclass(frozen=True, kw_only=True)
class TokenRateSample:
    """One `n_gen / tg / tg_3s` line: `tg_3s` is the slot's rate since its previous such line."""

    at_s: float
    n_gen: int
    tg: float
    tg_3s: float


@dataclass(frozen=True, kw_only=True)
class PrefillProgress:
    at_s: float
    n_tokens: int
    progress: float


@dataclass(kw_only=True)
class TaskTimeline:
    """What the server's log says about one task (one request) on one slot, on the server's clock."""

    task: int
    slot: int
    launch_s: float | None = None
    release_s: float | None = None
    prompt_ms: float | None = None
    prompt_n: int | None = None
    eval_ms: float | None = None
    eval_n: int | None = None
    n_tokens_at_release: int | None = None
    rate_samples: list[TokenRateSample] = field(default_factory=list)
    prefill_progress: list[PrefillProgress] = field(default_factory=list)
    slot_selection: str | None = None  # "LCP" (a slot holding a shared prefix) or "LRU"
    prompt_cache_hit: bool = False  # restored from the host-RAM prompt cache (seen at log verbosity 4)
    prompt_cache_evictions: int = 0  # entries evicted while this task was being placed

    @property
    def prompt_tokens(self) -> int | None:
        """Prompt length, cached part included: the slot holds prompt + generated - 1 at release."""
        if self.n_tokens_at_release is None or self.eval_n is None:
            return None
        return self.n_tokens_at_release + 1 - self.eval_n

    @property
    def wait_before_prefill_s(self) -> float | None:
        """Time the task held its slot without being computed: in the slot, minus prompt eval and eval."""
        if None in (self.launch_s, self.release_s, self.prompt_ms, self.eval_ms):
            return None
        assert self.launch_s is not None and self.release_s is not None
        assert self.prompt_ms is not None and self.eval_ms is not None
        return max(0.0, (self.release_s - self.launch_s) - (self.prompt_ms + self.eval_ms) / 1000.0)

    @property
    def prefill_window_s(self) -> tuple[float, float] | None:
        """When the prompt was being processed: it ended where decoding started."""
        if None in (self.release_s, self.prompt_ms, self.eval_ms):
            return None
        assert self.release_s is not None and self.prompt_ms is not None and self.eval_ms is not None
        end = self.release_s - self.eval_ms / 1000.0
        return end - self.prompt_ms / 1000.0, end
