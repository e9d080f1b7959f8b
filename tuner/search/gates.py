"""What a trial's answers say before it is measured: the correctness gate (the baseline's answers are the
reference; `MeasurementError` when a trial's differ too much) and, for a LoRA policy, the share of the
workload's requests whose answers it would change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import optuna

from tuner.config import ParamValue
from tuner.errors import MeasurementError
from tuner.gate import judge, lora_answer_changes
from tuner.observers import StudyObserver
from tuner.study_record import update_trial_record
from tuner.trial_runner import PreparedStudy, TrialRunner

if TYPE_CHECKING:
    from tuner.search.peers import Peers

__all__ = ["GATE_FAILURE", "Gates"]

GATE_FAILURE = "correctness gate"  # how a trial the gate failed starts its reason


class Gates:
    def __init__(self, prepared: PreparedStudy, runner: TrialRunner, peers: Peers, observer: StudyObserver) -> None:
        self.prepared = prepared
        self.gate = prepared.spec.gate
        self.runner = runner
        self.peers = peers  # where this host's reference answers are kept
        self.observer = observer

    def probes(self, settings: Mapping[str, ParamValue], *, baseline: bool) -> bool:
        """Whether the trial's first round asks the correctness probes: the baseline's give the reference; a
        trial whose server settings equal the baseline's (one differing only in request-scope knobs, such as
        a LoRA policy) would get the baseline's answers back, since the probes set no request-scope knob."""
        if not self.gate.enabled:
            return False
        engine = self.prepared.engine
        return baseline or engine.server_settings(settings) != engine.server_settings({})

    async def check(
        self, trial: optuna.Trial, settings: Mapping[str, ParamValue], *, baseline: bool, probing: bool
    ) -> None:
        if probing:
            await self.correctness(trial, baseline=baseline)
        if not baseline:
            prepared = self.prepared
            changed = await lora_answer_changes(
                self.runner, prepared.trace, prepared.engine, settings, tokens=self.gate.tokens
            )
            if changed is not None:
                update_trial_record(trial, answers_changed=changed[0], answers_changed_note=changed[1])

    async def correctness(self, trial: optuna.Trial, *, baseline: bool) -> None:
        self.observer.probing(number=trial.number)
        # The baseline's reference one at a time, as a single user gets its answers; a trial's together (one
        # batch, a second saved a trial), asked again one at a time before it is failed.
        answers = await self.runner.probe_answers(tokens=self.gate.tokens, together=not baseline)
        if baseline:
            self.peers.update_record(reference_answers=[list(a) for a in answers])
            return
        reference = self.peers.record().reference_answers
        if reference is None:
            return
        result = judge(answers, reference, min_agreement=self.gate.min_agreement)
        if not result.passed:
            answers = await self.runner.probe_answers(tokens=self.gate.tokens, together=False)
            result = judge(answers, reference, min_agreement=self.gate.min_agreement)
        update_trial_record(trial, answer_agreement=result.agreement)
        if not result.passed:
            raise MeasurementError(f"{GATE_FAILURE}: {result.reason}")
