"""The data contracts between the seams: what a deployer launches, what the load generator sends,
what it records, and what a trial produced. Timing stays apart from payload: a `ReplayRequest`
says what to send and when, a `RequestRecord` says what happened, measured on one monotonic clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = [
    "AnswerSpan",
    "CheckLine",
    "LaunchSpec",
    "ListenRule",
    "OperatorServer",
    "PrefillProgress",
    "ReplayRequest",
    "RequestRecord",
    "RequestStatus",
    "ServerCommand",
    "ServerTimings",
    "TaskTimeline",
    "TokenRateSample",
    "RunningValue",
    "TunedKnob",
]


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerCommand(StrEnum):
    """Whose command line starts the server, which decides what `auto` paths and the address mean."""

    LOCAL = "local"  # the tuner's, on this machine: `auto` is the build `tuner setup` made here
    REMOTE = "remote"  # the tuner's, on another host or in a container: every path is the host's, given
    UNIT = "unit"  # the operator's own (a systemd unit kept as it is): its program, model and address


# Addresses a server listens on that mean "every interface": the controller reaches it on the host's loopback.
_EVERY_INTERFACE = ("", "0.0.0.0", "::", "[::]", "*")


class OperatorServer(_Contract):
    """The operator's own server as its unit starts it: its program, model and address, read back from its
    command line and environment (what a deployer that keeps the unit's command measures, and leaves alone)."""

    program: str
    model: str | None
    host: str
    port: int = Field(ge=1, le=65535)

    @property
    def reach_host(self) -> str:
        """Where the controller connects, from the host's side: a server on every interface is on loopback."""
        return "127.0.0.1" if self.host in _EVERY_INTERFACE else self.host.strip("[]")

    @property
    def address(self) -> str:
        """HOST:PORT as a URL writes it (an IPv6 host in brackets)."""
        host = self.host or "*"
        return f"[{host.strip('[]')}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def describe(self) -> str:
        model = f", model {self.model}" if self.model else ""
        return f"{self.program}{model}, listening on {self.address}"


class ListenRule(_Contract):
    """How an engine's server is told which model to load and where to listen: its flags, its environment
    variables and its defaults. With it a deployer reads the operator's choice back from the unit instead of
    writing one of its own."""

    host_flags: tuple[str, ...] = ()
    port_flags: tuple[str, ...] = ()
    model_flags: tuple[str, ...] = ()
    host_env: str | None = None
    port_env: str | None = None
    model_env: str | None = None
    address_env: str | None = Field(
        default=None, description="One variable with [SCHEME://]HOST[:PORT], read as Ollama reads OLLAMA_HOST."
    )
    model_after: str | None = Field(default=None, description="A word the model follows as its first argument.")
    default_host: str
    default_port: int

    def read(self, argv: Sequence[str], environ: Mapping[str, str]) -> OperatorServer:
        """The server `argv` starts with `environ`: a flag wins over its environment variable, as in the
        engines themselves. `ValueError` for a port that is no number."""
        host, port, model = self.default_host, str(self.default_port), None
        if self.address_env and environ.get(self.address_env, "").strip():
            host, port = _ollama_address(environ[self.address_env], default_host=host, default_port=port)
        host = environ.get(self.host_env, host) if self.host_env else host
        port = environ.get(self.port_env, port) if self.port_env else port
        model = environ.get(self.model_env) if self.model_env else None
        words = list(argv[1:])
        if self.model_after and self.model_after in words:
            following = words.index(self.model_after) + 1
            if following < len(words) and not words[following].startswith("-"):
                model = words[following]
        host = _flag_value(words, self.host_flags) or host
        port = _flag_value(words, self.port_flags) or port
        model = _flag_value(words, self.model_flags) or model
        return OperatorServer(program=argv[0] if argv else "", model=model, host=host, port=int(port))


def _flag_value(words: Sequence[str], flags: Sequence[str]) -> str | None:
    """The last value given to any of `flags`, as `--flag VALUE` or `--flag=VALUE`."""
    found = None
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        if name in flags:
            if equals:
                found = value
            elif index + 1 < len(words):
                found = words[index + 1]
    return found


def _ollama_address(value: str, *, default_host: str, default_port: str) -> tuple[str, str]:
    """[SCHEME://]HOST[:PORT][/PATH] as Ollama's envconfig.Host reads it: spaces trimmed, the port 80 or 443
    for an http or https scheme without one, a bare IPv6 address taken whole, and a port that is no number
    in 0-65535 replaced by the default."""
    text = value.strip()
    scheme, found, rest = text.partition("://")
    if not found:
        rest = text
    elif scheme == "http":
        default_port = "80"
    elif scheme == "https":
        default_port = "443"
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):
        host, _, after = rest[1:].partition("]")
        port = after.removeprefix(":") if after.startswith(":") else ""
    elif rest.count(":") == 1:
        host, _, port = rest.partition(":")
    else:  # no port, or a bare IPv6 address
        host, port = rest, ""
    if not port.isdigit() or int(port) > 65535:
        port = default_port
    return host or default_host, port


@dataclass(frozen=True)
class CheckLine:
    """One finding of `tuner run --check`: what was looked at, whether the study can run with it, and what
    was found (with the fix, where it fails)."""

    subject: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class TunedKnob:
    """A knob a study sets, as a deployer sees it: its variable and every flag that would decide it instead."""

    name: str
    env: str | None
    flags: tuple[str, ...]
    value_type: str = "str"  # "bool": a bare flag sets it (its `--no-` forms clear it) and takes no value


@dataclass(frozen=True)
class RunningValue:
    """A tuned knob's value in the operator's own server (read, not set by us), and where it was found."""

    knob: str
    text: str  # as the server is given it: a flag's value or a variable's, or "true" for a bare flag
    source: str  # e.g. "OLLAMA_NUM_PARALLEL in Environment=", "the ExecStart= flag -np"


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
    listen: ListenRule | None = Field(
        default=None, description="How to read where the operator's own server listens, from its unit."
    )

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
    load_options: tuple[tuple[str, int | float | bool | str], ...] = Field(
        default=(),
        description="Options every request of the trial carries because the server loads the model with them "
        "(Ollama's num_batch): a request that carried others would reload the model mid-round.",
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
