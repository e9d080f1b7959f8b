"""What a study stores about each trial and about itself: one typed, versioned record under one key of
Optuna's user attributes, so that the search loop, the leaderboard and `tuner apply` read the same fields
by the same names.

Runs made before the records existed (serve-tuner 0.1.0) stored about twenty loose keys instead; reading
a record falls back to those keys, so such a run still opens, resumes and shows its leaderboard. A record
written by a newer serve-tuner (a higher `version`) is refused with a line that says to upgrade, instead
of being read wrongly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Self, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from tuner.config import ParamValue
from tuner.errors import StudyError
from tuner.faults import crash_point

__all__ = [
    "end_trial",
    "HOST_KEY_PREFIX",
    "INTERRUPTED",
    "LEASE_KEY",
    "RECORD_KEY",
    "RECORD_VERSION",
    "STOP_REASONS",
    "Confirmation",
    "StopReason",
    "HostRecord",
    "RoundMetrics",
    "StudyRecord",
    "TrialRecord",
    "new_trial_attrs",
    "host_records",
    "update_host_record",
    "update_study_record",
    "update_trial_record",
]

RECORD_KEY = "serve_tuner"
# 2: a trial's `host` and `requeued_from`, the study's `objectives`, and each fleet host's own record
# (`HostRecord`, under HOST_KEY_PREFIX + its name). A version-1 record lacks those fields and reads with
# their defaults; a version-2 record must have every field.
# 3: a confirmation's `planned_pairs` and `stopped` (the sequential confirmation). Optional in every version
# (all pairs ran before it), but a version-2 reader would call a record holding them damaged; this way it
# asks for an upgrade instead.
# 4: a trial's `predicted` (the study's predicted best, queued after the baseline), likewise optional.
RECORD_VERSION = 4
# The fields each version added, which a record of an older version may lack.
_ADDED_IN = {2: {"host", "requeued_from", "objectives"}}
# Per-host study state: each host is driven by exactly one controller (its lock), so no two controllers
# rewrite the same key.
HOST_KEY_PREFIX = "serve_tuner:host:"
# A running trial's lease: {"host": name, "at": wall-clock seconds}, rewritten while the trial runs.
LEASE_KEY = "serve_tuner:lease"

# The fail reason of a trial the controller's stop cut short (or kept from starting): not the config's fault.
INTERRUPTED = "interrupted: the controller stopped during this trial"

# One measured round: metric name -> value, None where the round had no data for it.
RoundMetrics = dict[str, float | None]


class _Record(BaseModel):
    # Not a user's file (config.StrictModel): scores may be infinite (a metric at zero), and are kept as
    # they were computed. Strict, with unknown keys refused: what we wrote reads back exactly, and a
    # "1.5" where a number was, or a key we never write, means a damaged journal or a newer writer.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True, strict=True)

    version: int = Field(default=RECORD_VERSION, ge=1, description="The record's format; newer ones are refused.")

    def stored(self) -> dict[str, Any]:
        # Python values, not pydantic's JSON text: Optuna serializes the value itself (an infinite score
        # as JSON's Infinity), where pydantic's text would turn it into null.
        return self.model_dump()

    def updated(self, **changes: Any) -> Self:
        """The record with `changes`, validated: a wrong value is a bug of the caller's, raised here,
        before anything is stored."""
        try:
            return self.model_validate({**self.model_dump(), **changes})
        except ValidationError as exc:
            raise ValueError(f"invalid {type(self).__name__} update: {_first_problem(exc)}") from None


RecordT = TypeVar("RecordT", bound=_Record)


class TrialRecord(_Record):
    """One trial: what it set, whether it reached the host, what it measured and how it ended."""

    baseline: bool = Field(default=False, description="Trial 0: the engine's base settings, nothing tuned.")
    settings: dict[str, ParamValue] | None = Field(
        default=None, description="The knobs the trial sets, decoded from Optuna's params; None until asked."
    )
    deployed: bool = Field(default=False, description="Started on the host; counts against the budget.")
    rounds: list[RoundMetrics] = Field(default_factory=list, description="Each measured round's metrics.")
    round_scores: list[float] = Field(default_factory=list, description="Each round's score.")
    score: float | None = Field(default=None, description="The median of the round scores.")
    noisy: list[str] = Field(default_factory=list, description="Objective metrics whose rounds differ by 20%+.")
    fail_reason: str | None = None
    prune_reason: str | None = None
    saved_s: float = Field(default=0.0, description="Measurement time pruning saved.")
    skip_reason: str | None = Field(default=None, description="Why a proposal was never deployed.")
    duplicate_of: int | None = Field(default=None, description="The trial measured with the same settings.")
    constraint_violations: list[float] = Field(default_factory=list, description="By how much, per constraint.")
    violates: list[str] = Field(default_factory=list, description="The constraints the trial breaks, as text.")
    answer_agreement: list[float] | None = Field(default=None, description="Per probe, against the baseline.")
    answers_changed: float | None = Field(default=None, description="Share of requests a LoRA policy changes.")
    answers_changed_note: str | None = None
    host: str | None = Field(default=None, description="The fleet host that measured it; None: a one-host study.")
    requeued_from: int | None = Field(
        default=None, description="The failed trial whose settings this one measures again (a dead controller's)."
    )
    predicted: bool = Field(
        default=False, description="The config the study's prediction (search.predicted_from) expects to win."
    )

    @classmethod
    def of(cls, trial: FrozenTrial | optuna.Trial) -> Self:
        return _read(cls, trial.user_attrs, where=f"trial {trial.number}")


# Why a confirmation's pairs stopped (tuner.sequential decides), and how the leaderboard and report say it.
StopReason = Literal["above", "below", "futile", "all pairs"]
STOP_REASONS: dict[StopReason, str] = {
    "above": "its interval cleared the minimum effect",
    "below": "its interval fell below the minimum effect",
    "futile": "the pairs left could not lift its interval above the minimum effect",
    "all pairs": "all pairs ran",
}


class Confirmation(BaseModel):
    """The paired re-measurement of one candidate against the baseline."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True, strict=True)

    differences: list[float] = Field(description="Candidate's score minus the baseline's, per pair.")
    mean: float
    # A list, not a tuple: the journal hands back JSON arrays, which strict validation keeps as lists.
    ci: list[float] = Field(
        min_length=2,
        max_length=2,
        description="The interval of the mean difference at the last look: 95% jointly over all its looks "
        "(tuner/sequential.py); an ordinary 95% interval in runs before the sequential confirmation.",
    )
    # Both absent in runs of serve-tuner before the sequential confirmation: all its pairs ran.
    planned_pairs: int | None = Field(default=None, ge=2, description="The most pairs the confirmation would run.")
    stopped: StopReason | None = Field(default=None, description="Why the pairs stopped (STOP_REASONS).")

    def pairs_told(self) -> str:
        """How many pairs ran and why they stopped, as the leaderboard and the report say it."""
        ran = len(self.differences)
        if self.planned_pairs is None or self.stopped is None:
            return f"{ran} alternating pairs"
        if self.stopped == "all pairs":
            return f"{ran} alternating pairs (all that were planned)"
        if ran >= self.planned_pairs:  # decided at the last look: no pair was saved
            return f"{ran} alternating pairs (all that were planned; {STOP_REASONS[self.stopped]})"
        return f"{ran} of at most {self.planned_pairs} alternating pairs (stopped early: {STOP_REASONS[self.stopped]})"


class StudyRecord(_Record):
    """The study as a whole: what its verdicts need beside the trials."""

    min_effect: float = Field(default=0.0, description="The smallest score difference called a win.")
    allow_answer_changes: bool = False
    reference_answers: list[list[int]] | None = Field(
        default=None, description="The baseline's answers to the correctness probes."
    )
    # Keyed by candidate trial number; JSON object keys are strings, so the key alone is read laxly.
    confirmations: dict[Annotated[int, Strict(False)], Confirmation] = Field(default_factory=dict)
    objectives: list[str] = Field(default_factory=list, description="The objective metrics (the host spread's).")

    @classmethod
    def of(cls, study: optuna.Study) -> Self:
        return _read(cls, study.user_attrs, where=f"study {study.study_name!r}")


class HostRecord(_Record):
    """One fleet host's part of the study: what its baseline answered and its confirmations, and why it was
    dropped if it was. Only the controller holding the host's lock writes it."""

    reference_answers: list[list[int]] | None = None
    confirmations: dict[Annotated[int, Strict(False)], Confirmation] = Field(default_factory=dict)
    dropped: str | None = Field(default=None, description="Why the fleet went on without this host.")

    @classmethod
    def of(cls, study: optuna.Study, host: str) -> Self:
        return cls.read(study.user_attrs, host, where=f"study {study.study_name!r}")

    @classmethod
    def read(cls, attrs: Mapping[str, Any], host: str, *, where: str) -> Self:
        stored = attrs.get(HOST_KEY_PREFIX + host)
        if stored is None:
            return cls()
        return _read(cls, {RECORD_KEY: stored}, where=f"{where}, host {host!r}")


def host_records(study: optuna.Study) -> dict[str, HostRecord]:
    """Every fleet host's record, by name."""
    attrs = study.user_attrs
    return {
        key.removeprefix(HOST_KEY_PREFIX): HostRecord.read(attrs, key.removeprefix(HOST_KEY_PREFIX), where="study")
        for key in attrs
        if key.startswith(HOST_KEY_PREFIX)
    }


def update_host_record(study: optuna.Study, host: str, **changes: Any) -> HostRecord:
    record = HostRecord.of(study, host).updated(**changes)
    study.set_user_attr(HOST_KEY_PREFIX + host, record.stored())
    return record


def update_trial_record(trial: optuna.Trial, **changes: Any) -> TrialRecord:
    """Stores the trial's record with `changes`; the whole record is rewritten under its one key."""
    record = TrialRecord.of(trial).updated(**changes)
    trial.set_user_attr(RECORD_KEY, record.stored())
    return record


def update_study_record(study: optuna.Study, **changes: Any) -> StudyRecord:
    record = StudyRecord.of(study).updated(**changes)
    study.set_user_attr(RECORD_KEY, record.stored())
    return record


def new_trial_attrs(record: TrialRecord) -> dict[str, Any]:
    """The user attributes of a trial created with `record` (an enqueued baseline, a test's trial)."""
    return {RECORD_KEY: record.stored()}


def _read(model: type[RecordT], attrs: Mapping[str, Any], *, where: str) -> RecordT:
    if RECORD_KEY not in attrs:
        return _validated(model, _legacy_fields(model, attrs), where=where)
    stored = attrs[RECORD_KEY]
    if not isinstance(stored, dict):
        raise _damaged(where, f"not an object but {type(stored).__name__}")
    version = stored.get("version")
    if type(version) is int and version > RECORD_VERSION:
        raise StudyError(
            f"{where} was stored by a newer serve-tuner (record version {version}, this one reads "
            f"{RECORD_VERSION}); upgrade serve-tuner to open this run"
        )
    # Every field we write is there: a record without `deployed` would silently drop a measured trial
    # from the leaderboard and the budget. Defaults serve new records and 0.1.0's loose keys only.
    # A record of an older version may lack only the fields a later version added (read with their defaults).
    optional = {
        name for added, names in _ADDED_IN.items() if type(version) is int and version < added for name in names
    }
    missing = sorted(set(model.model_fields) - set(stored) - optional)
    if missing:
        raise _damaged(where, f"{missing[0]}: missing")
    return _validated(model, stored, where=where)


def _validated(model: type[RecordT], data: object, *, where: str) -> RecordT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _damaged(where, _first_problem(exc)) from None


def _first_problem(exc: ValidationError) -> str:
    problem = exc.errors()[0]
    field = ".".join(str(part) for part in problem["loc"]) or "the record"
    return f"{field}: {problem['msg']}"


def _damaged(where: str, problem: str) -> StudyError:
    return StudyError(
        f"{where}: the stored {RECORD_KEY!r} record is damaged ({problem}); the run's optuna.journal was changed "
        "by something other than serve-tuner: restore it from a backup, or move the run directory aside and "
        "start the study again"
    )


# serve-tuner 0.1.0 stored each field as a user attribute of its own, and a confirmation as a study
# attribute "confirmation_<trial number>".
_LEGACY_CONFIRMATION = "confirmation_"


def _legacy_fields(model: type[_Record], attrs: Mapping[str, Any]) -> dict[str, Any]:
    fields = {name: attrs[name] for name in model.model_fields if name != "version" and name in attrs}
    if model is StudyRecord:
        fields["confirmations"] = {
            int(key.removeprefix(_LEGACY_CONFIRMATION)): value
            for key, value in attrs.items()
            if key.startswith(_LEGACY_CONFIRMATION) and key.removeprefix(_LEGACY_CONFIRMATION).isdigit()
        }
    return fields


def end_trial(
    study: optuna.Study,
    trial: optuna.Trial,
    values: float | Sequence[float] | None = None,
    *,
    state: TrialState | None = None,
    first_score: float | None = None,
    **record: Any,
) -> None:
    """Writes `record` to the trial's record, then tells Optuna `values` or `state` (as `Study.tell`).
    `first_score`: reported as the trial's step 0 before the tell (the baseline's, which the pruner
    compares later first rounds with)."""
    if record:
        update_trial_record(trial, **record)
    if "score" in record:  # a measured outcome, written and not yet told: what the crash tests interrupt
        crash_point("before-tell")
    if first_score is not None:
        trial.report(first_score, step=0)
    study.tell(trial, values, state=state)
