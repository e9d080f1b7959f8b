"""A study that starts from a prediction (`search.predicted_from`): the simulated llama-server, calibrated from
the server's own log, replays the study's workload for every config of its space (`tuner.predict`); the
predicted best is queued right after the baseline, and the prediction is stored in the run directory for the
leaderboard and the report. Computed once, at the study's first start; a resume reads it back."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.config import ParamValue
from tuner.observers import StudyObserver
from tuner.prediction_record import PredictionRecord, read_prediction, write_prediction
from tuner.runs import RunDirectory
from tuner.study_record import INTERRUPTED, TrialRecord, new_trial_attrs
from tuner.trial_runner import PreparedStudy

__all__ = ["LLAMA_SERVER_BATCH_DEFAULTS", "queue_predicted_best", "start_from_prediction", "study_prediction"]

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
    note = "; ".join(text for text in (prediction.why_none, note) if text) or None
    observer.predicted(log=prediction.log, best=best, queued=queued, note=note)


def study_prediction(prepared: PreparedStudy, run_dir: RunDirectory) -> PredictionRecord | None:
    """The study's prediction: the run directory's, else made now from `search.predicted_from` and stored."""
    path = prepared.predicted_from
    if path is None:
        return None
    return read_prediction(run_dir.prediction_path) or _predict(prepared, path, run_dir)


def _predict(prepared: PreparedStudy, path: Path, run_dir: RunDirectory) -> PredictionRecord:
    """The study's prediction from the log at `path`, made now and stored in the run directory."""
    from tuner.diagnose import diagnose_log
    from tuner.predict import StudyTraffic, predict, prediction_record

    spec = prepared.spec
    diagnosis = diagnose_log(
        path, long_prompt_tokens=spec.metrics.long_prompt_tokens, min_overlap_s=spec.metrics.min_overlap_s
    )
    settings = {**LLAMA_SERVER_BATCH_DEFAULTS, **prepared.engine.effective_settings(prepared.baseline_settings)}
    ctx = settings.get("ctx_size")
    traffic = StudyTraffic(
        trace=prepared.trace,
        baseline=settings,
        ctx_size=int(str(ctx)) if ctx is not None else None,
        workload_seed=spec.workload.seed,
        time_scale=spec.workload.time_scale,
        objectives=spec.objectives,
        constraints=spec.constraints,
        engine=prepared.engine,
    )
    prediction = predict(
        diagnosis,
        path,
        space=prepared.space,
        study=traffic,
        long_prompt_tokens=spec.metrics.long_prompt_tokens,
        min_overlap_s=spec.metrics.min_overlap_s,
    )
    record = prediction_record(prediction, log=str(path))
    write_prediction(run_dir.prediction_path, record)
    return record


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
