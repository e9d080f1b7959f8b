"""The space-filling start of the TPE sampler (tuner/sampling.py), on the demo's search space."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.config import ParamValue, load_search_space
from tuner.sampling import SpaceFillingStart
from tuner.study import _distribution
from tuner.study_record import TrialRecord, new_trial_attrs, update_trial_record

SPACE = load_search_space(Path(__file__).resolve().parent.parent / "search_spaces" / "llama-server.toml").restricted_to(
    ["n_batch", "n_ubatch"]
)


def _start(startup: int, seed: int = 0) -> tuple[optuna.Study, list[dict[str, ParamValue]]]:
    sampler = SpaceFillingStart(
        optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup), SPACE, startup=startup, seed=seed
    )
    study = optuna.create_study(sampler=sampler, direction="maximize")
    distributions = {name: _distribution(p) for name, p in SPACE.params.items()}
    study.enqueue_trial(
        SPACE.encode({"n_batch": 2048, "n_ubatch": 512}), user_attrs=new_trial_attrs(TrialRecord(deployed=True))
    )
    proposed = []
    for number in range(startup + 1):
        trial = study.ask(distributions)
        update_trial_record(trial, deployed=True)
        settings = SPACE.decode(trial.params)
        proposed.append(settings)
        study.tell(trial, float(number))
    return study, proposed[1:]


def test_the_start_proposes_distinct_valid_configs_far_from_everything_tried() -> None:
    study, proposed = _start(startup=3)
    assert all(int(p["n_ubatch"]) <= int(p["n_batch"]) for p in proposed), proposed  # no skipped proposal
    assert len({tuple(sorted(p.items())) for p in proposed}) == 3
    # The valid config farthest from the baseline (2048/512) is the opposite corner.
    assert proposed[0] == {"n_batch": 32, "n_ubatch": 32}
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


def test_after_the_start_the_model_proposes() -> None:
    study, _ = _start(startup=2, seed=1)
    sampler = study.sampler
    assert isinstance(sampler, SpaceFillingStart)
    assert not sampler._in_startup(study)  # the next proposal is TPE's
