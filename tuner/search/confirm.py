"""The confirmation: the best trials re-measured against the baseline, alternating B C C B B C ..., and the
paired score differences stored with their 95% interval.

Alternating the order keeps a slow drift of the machine from favouring either side, and both members of a
pair replay the same prompts. The pairs stop as soon as the answer is decided (`tuner.sequential`): on a
host where a restart loads a large model, each pair not run is minutes of the night.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial

from tuner.config import ParamValue
from tuner.observers import StudyObserver
from tuner.runs import RunDirectory
from tuner.scoring import median_metrics, min_effect, score_round
from tuner.sequential import look
from tuner.server_reuse import Servers
from tuner.study_record import Confirmation as Confirmed
from tuner.study_record import TrialRecord
from tuner.study_view import StudyView
from tuner.trial_runner import TrialRunner

if TYPE_CHECKING:
    from tuner.config import StudySpec
    from tuner.search.peers import Peers

__all__ = ["Confirmation"]


class Confirmation:
    def __init__(
        self,
        spec: StudySpec,
        *,
        study: optuna.Study,
        observer: StudyObserver,
        runner: TrialRunner,
        servers: Servers,
        peers: Peers,
    ) -> None:
        self.spec = spec
        self.study = study
        self.observer = observer
        self.runner = runner
        self.servers = servers
        self.peers = peers  # on a fleet's host: against this host's baseline, stored in its host record

    async def run(self, baseline: FrozenTrial | None) -> None:
        if baseline is None or self.spec.confirm.top == 0:
            return
        reference = median_metrics(TrialRecord.of(baseline).rounds)
        planned = self.spec.confirm.pairs
        smallest_win = min_effect(self.spec.objectives)
        for candidate in self.candidates():
            settings = dict(TrialRecord.of(candidate).settings or {})
            self.observer.confirm_started(number=candidate.number, settings=settings, pairs=planned)
            differences: list[float] = []
            for pair in range(planned):
                order = [(baseline.number, {}), (candidate.number, settings)]
                if pair % 2:
                    order.reverse()
                scores: dict[int, float] = {}
                for position, (number, trial_settings) in enumerate(order):
                    metrics = await self.measure(
                        number,
                        trial_settings,
                        candidate=candidate.number,
                        pair=pair,
                        baseline=baseline,
                        position=position,
                    )
                    scores[number] = score_round(metrics, reference, self.spec.objectives)
                differences.append(scores[candidate.number] - scores[baseline.number])
                decided = look(differences, planned=planned, min_effect=smallest_win)
                if decided.stop is not None:
                    break
            confirmed = Confirmed(
                differences=differences,
                mean=decided.mean,
                ci=[decided.low, decided.high],
                planned_pairs=planned,
                stopped=decided.stop,
            )
            confirmations = self.peers.record().confirmations
            self.peers.update_record(confirmations={**confirmations, candidate.number: confirmed})
            self.observer.confirm_finished(number=candidate.number, result=confirmed)

    async def measure(
        self,
        number: int,
        settings: Mapping[str, ParamValue],
        *,
        candidate: int,
        pair: int,
        baseline: FrozenTrial,
        position: int,
    ) -> dict[str, float | None]:
        """One round of a pair; `position` (0 or 1) is its place in the pair, for the round's count."""
        pairs = self.spec.confirm.pairs
        label = f"pair {pair + 1}/{pairs}" + (" (baseline)" if number == baseline.number else "")
        self.observer.round_started(number=number, label=label, index=2 * pair + position + 1, total=2 * pairs)
        name = RunDirectory.confirmation_name(candidate, self.peers.host)
        variant = await self.servers.deploy(settings, number=number, log_name=f"{name}-server.log")
        measured = await self.runner.measure_round(
            settings=settings,
            number=number,
            prompts_index=self.spec.rounds + pair,
            prompts_variant=variant,
            label=label,
            records_name=f"{name}-{pair + 1}",
        )
        return measured.metrics

    def candidates(self) -> list[FrozenTrial]:
        """The best trials the recommendation could choose (one rule: `tuner.study_view.recommendable`) that
        scored above the baseline and were not re-measured yet on this host."""
        view = StudyView.of(self.study)
        return [t.trial for t in view.to_confirm(top=self.spec.confirm.top, host=self.peers.host)]
