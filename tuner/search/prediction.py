"""A study that starts from a prediction (`search.predicted_from`): the simulated llama-server, calibrated from
the server's own log, replays the study's workload for every config of its space (`tuner.predict`); the
predicted best is queued right after the baseline, and the prediction is stored in the run directory for the
leaderboard and the report. Computed once, at the study's first start; a resume reads it back.

Then the prediction learns from the night (`PredictionRefits`): once the study's measured trials ran passes
of two widths or more (the baseline's n_ubatch and the predicted best's), their logs fit the cost of a pass
by width (`tuner.trial_calibration`), which one log cannot show, and the prediction made again queues its
best unless a trial measured it or is queued for it. A fleet's hosts differ (its host effect), so one host's
trials do not fit another's curve: a fleet study is not refitted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from tuner.config import ParamValue
from tuner.observers import StudyObserver
from tuner.prediction_record import PredictionRecord, read_prediction, write_prediction
from tuner.runs import RunDirectory
from tuner.study_record import INTERRUPTED, TrialRecord, new_trial_attrs
from tuner.trial_runner import PreparedStudy

if TYPE_CHECKING:
    from tuner.predict import Prediction
    from tuner.trial_calibration import TrialLog

__all__ = [
    "LLAMA_SERVER_BATCH_DEFAULTS",
    "PredictionRefits",
    "queue_predicted_best",
    "start_from_prediction",
    "study_prediction",
]

# What llama-server runs with where neither the study nor its space sets the knob.
LLAMA_SERVER_BATCH_DEFAULTS: dict[str, ParamValue] = {"n_batch": 2048, "n_ubatch": 512}


def start_from_prediction(
    study: optuna.Study, prepared: PreparedStudy, run_dir: RunDirectory, observer: StudyObserver
) -> None:
    """A study with `search.predicted_from`: its prediction made (or read back) and its best queued, each told."""
    path = prepared.predicted_from
    if path is None:
        return
    stored = read_prediction(run_dir.prediction_path)
    note = None
    if stored is not None and stored.log != str(path):
        note = f"kept from its first start: remove {run_dir.prediction_path} to predict from {path}"
    if stored is None:
        observer.predicting(log=str(path))
    prediction = stored or _predict(prepared, path, run_dir)
    best = None if prediction.best is None else prediction.best.settings
    queued = queue_predicted_best(study, prepared, prediction)
    observer.predicted(log=prediction.log, best=best, queued=queued, note=note)


def study_prediction(prepared: PreparedStudy, run_dir: RunDirectory) -> PredictionRecord | None:
    """The study's prediction: the run directory's, else made now from `search.predicted_from` and stored."""
    path = prepared.predicted_from
    if path is None:
        return None
    return read_prediction(run_dir.prediction_path) or _predict(prepared, path, run_dir)


def _predict(prepared: PreparedStudy, path: Path, run_dir: RunDirectory) -> PredictionRecord:
    """The study's prediction from the log at `path`, made now and stored in the run directory."""
    from tuner.predict import prediction_record

    record = prediction_record(_prediction(prepared, path), log=str(path))
    write_prediction(run_dir.prediction_path, record)
    return record


def _server_settings(prepared: PreparedStudy) -> dict[str, ParamValue]:
    """The baseline's server settings, llama-server's defaults where neither the study nor its space sets one."""
    return {**LLAMA_SERVER_BATCH_DEFAULTS, **prepared.engine.effective_settings(prepared.baseline_settings)}


def _prediction(prepared: PreparedStudy, path: Path, trials: Sequence[TrialLog] = ()) -> Prediction:
    """The study's prediction from the log at `path`, its costs fitted to the trials' logs where they time
    two widths of pass or more."""
    from tuner.diagnose import diagnose_log
    from tuner.predict import StudyTraffic, predict

    spec = prepared.spec
    diagnosis = diagnose_log(
        path, long_prompt_tokens=spec.metrics.long_prompt_tokens, min_overlap_s=spec.metrics.min_overlap_s
    )
    settings = _server_settings(prepared)
    ctx = settings.get("ctx_size")
    traffic = StudyTraffic(
        trace=prepared.trace,
        baseline=settings,
        ctx_size=int(str(ctx)) if ctx is not None else None,
        workload_seed=spec.workload.seed,
        time_scale=spec.workload.time_scale,
        objectives=spec.objectives,
        constraints=spec.constraints,
        trials=trials,
    )
    return predict(
        diagnosis,
        path,
        space=prepared.space,
        study=traffic,
        long_prompt_tokens=spec.metrics.long_prompt_tokens,
        min_overlap_s=spec.metrics.min_overlap_s,
    )


class PredictionRefits:
    """The study's prediction made again from its measured trials' logs, each time they have run a pass
    width they had not: its best queued unless a trial has those settings (see the module's docstring)."""

    def __init__(self, prepared: PreparedStudy, run_dir: RunDirectory, observer: StudyObserver) -> None:
        self._prepared = prepared
        self._run_dir = run_dir
        self._observer = observer
        self._fitted: frozenset[int] = frozenset()  # the widths of the last refit

    def after_trials(self, study: optuna.Study, *, fleet: bool) -> None:
        """Refits and queues where the measured trials have run a new width; nothing otherwise."""
        path = self._prepared.predicted_from
        if path is None or fleet:
            return
        # The simulator and the log reader, for such a study alone.
        from tuner.predict import prediction_record
        from tuner.trial_calibration import TrialLog, timed_widths, width_of

        measured = self._measured(study)
        widths = frozenset(width_of(settings) for _, settings in measured)
        if len(widths) < 2 or widths <= self._fitted:
            return
        self._fitted = widths
        logs = [
            TrialLog(number=number, settings=settings, lines=lines)
            for number, settings in measured
            if (lines := self._log_lines(number)) is not None
        ]
        if len(timed_widths(logs)) < 2:
            return
        record = prediction_record(_prediction(self._prepared, path, logs), log=str(path))
        queued = queue_predicted_best(study, self._prepared, record)
        best = None if record.best is None else record.best.settings
        self._observer.prediction_refitted(trials=[log.number for log in logs], best=best, queued=queued)

    def _measured(self, study: optuna.Study) -> list[tuple[int, dict[str, ParamValue]]]:
        """The deployed trials with a round measured (pruned ones too), with their server's settings."""
        base = _server_settings(self._prepared)
        measured = []
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            record = TrialRecord.of(trial)
            if record.deployed and (record.baseline or record.settings is not None):
                measured.append((trial.number, {**base, **({} if record.baseline else record.settings or {})}))
        return measured

    def _log_lines(self, number: int) -> list[str] | None:
        """The trial's server log, None where it kept none (a reused server's trial keeps its starter's)."""
        try:
            return self._run_dir.server_log_path(number).read_text(errors="replace").splitlines()
        except OSError:
            return None


def queue_predicted_best(study: optuna.Study, prepared: PreparedStudy, prediction: PredictionRecord | None) -> bool:
    """Queues the predicted best (the baseline's value for every knob it leaves alone) unless a trial of those
    settings exists already, other than one the controller's stop interrupted: queued once across resumes,
    and by one controller for all its hosts. Returns whether it queued it now."""
    if prediction is None or prediction.best is None:
        return False
    settings = {**prepared.baseline_settings, **prediction.best.settings}
    if not all(prepared.space.params[name].allows(value) for name, value in settings.items()):
        return False  # a knob's value the space no longer offers (narrowed since): the sampler searches as usual
    for trial in study.get_trials(deepcopy=False):
        record = TrialRecord.of(trial)
        interrupted = trial.state == TrialState.FAIL and (record.fail_reason or "").startswith(INTERRUPTED)
        if record.settings == settings and not interrupted:
            return False
    record = TrialRecord(settings=settings, predicted=True)  # the line walk starts beside it (tuner/sampling.py)
    study.enqueue_trial(prepared.space.encode(settings), user_attrs=new_trial_attrs(record))
    return True
