"""The start of the TPE sampler (tuner/sampling.py) on the demo's search space: the maximin design, the line's walk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.config import ParamValue, load_search_space
from tuner.sampling import SpaceFillingStart
from tuner.search.samplers import distribution
from tuner.study_record import INTERRUPTED, TrialRecord, new_trial_attrs, update_trial_record

DEMO_SPACE = load_search_space(
    Path(__file__).resolve().parents[2] / "search_spaces" / "llama-server.toml"
).restricted_to(["n_batch", "n_ubatch"])
# The maximin start is what a space without a line gets.
SPACE = DEMO_SPACE.model_copy(update={"line": []})


def _start(startup: int, seed: int = 0) -> tuple[optuna.Study, list[dict[str, ParamValue]]]:
    sampler = SpaceFillingStart(
        optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup), SPACE, startup=startup, seed=seed
    )
    study = optuna.create_study(sampler=sampler, direction="maximize")
    distributions = {name: distribution(p) for name, p in SPACE.params.items()}
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


def _line_study() -> tuple[optuna.Study, dict[str, Any]]:
    sampler = SpaceFillingStart(optuna.samplers.TPESampler(seed=0, n_startup_trials=3), DEMO_SPACE, startup=3, seed=0)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    study.enqueue_trial(
        DEMO_SPACE.encode({"n_batch": 2048, "n_ubatch": 512}),
        user_attrs=new_trial_attrs(TrialRecord(baseline=True, deployed=True)),
    )
    baseline = study.ask({name: distribution(p) for name, p in DEMO_SPACE.params.items()})
    update_trial_record(baseline, score=0.0)
    study.tell(baseline, 0.0)
    return study, {name: distribution(p) for name, p in DEMO_SPACE.params.items()}


def _ask(study: optuna.Study, distributions: dict[str, Any]) -> tuple[optuna.Trial, dict[str, ParamValue]]:
    trial = study.ask(distributions)
    update_trial_record(trial, deployed=True)
    return trial, DEMO_SPACE.decode(trial.params)


def test_a_space_with_a_line_starts_with_the_lines_middle_and_its_neighbours_in_one_batch() -> None:
    study, distributions = _line_study()
    # Asked together, as a batch of three is: no proposal waits for another's score.
    batch = [_ask(study, distributions) for _ in range(3)]
    # The middle of the n_batch ladder on n_ubatch = n_batch, then its neighbour farther from the baseline.
    assert [settings for _, settings in batch] == [
        {"n_batch": 256, "n_ubatch": 256},
        {"n_batch": 128, "n_ubatch": 128},
        {"n_batch": 512, "n_ubatch": 512},
    ]
    for (trial, _), score in zip(batch, (1.3, 1.6, 0.9), strict=True):
        update_trial_record(trial, score=score)
        study.tell(trial, score)
    # The best is at the measured segment's end: the walk goes on past it.
    trial, settings = _ask(study, distributions)
    assert settings == {"n_batch": 64, "n_ubatch": 64}
    update_trial_record(trial, score=0.5, violates=["prefill_tok_s 150 is not >= 221"])
    study.tell(trial, 0.5)
    # 128/128 is the best and both its neighbours are measured: the line's far end, once, in case the score
    # has a second peak there.
    trial, settings = _ask(study, distributions)
    assert settings == {"n_batch": 2048, "n_ubatch": 2048}
    update_trial_record(trial, score=0.7)
    study.tell(trial, 0.7)
    # It did not beat 128/128: the model proposes from here on.
    sampler = study.sampler
    assert isinstance(sampler, SpaceFillingStart)
    assert sampler._line_point(study, distributions) is None


def test_a_far_end_of_the_line_that_beats_the_best_is_walked_from() -> None:
    study, distributions = _line_study()
    for score in (1.3, 1.6, 0.9):  # 256, 128, 512 as above
        trial, _ = _ask(study, distributions)
        update_trial_record(trial, score=score)
        study.tell(trial, score)
    trial, _ = _ask(study, distributions)  # 64/64
    update_trial_record(trial, score=1.2)
    study.tell(trial, 1.2)
    trial, settings = _ask(study, distributions)
    assert settings == {"n_batch": 2048, "n_ubatch": 2048}
    update_trial_record(trial, score=2.2)  # a second peak at the top
    study.tell(trial, 2.2)
    _, settings = _ask(study, distributions)
    assert settings == {"n_batch": 1024, "n_ubatch": 1024}


def test_a_line_point_skipped_as_one_that_would_not_fit_is_not_proposed_again() -> None:
    """A point the memory check refuses is told PRUNED with its reason; proposing it again would spend the
    study's patience with skipped proposals (200 in a row end the search) on one config."""
    study, distributions = _line_study()
    trial = study.ask(distributions)
    first = DEMO_SPACE.decode(trial.params)
    update_trial_record(trial, skip_reason="would not fit: needs 9.00 GiB, over the 8 GiB budget")
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    proposed = [DEMO_SPACE.decode(study.ask(distributions).params) for _ in range(3)]
    assert first not in proposed, (first, proposed)


def test_a_line_point_the_controllers_stop_interrupted_is_proposed_again_on_resume() -> None:
    study, distributions = _line_study()
    batch = [_ask(study, distributions) for _ in range(3)]
    for trial, _ in batch:  # the controller stopped during the first batch
        update_trial_record(trial, fail_reason=INTERRUPTED)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    resumed = [settings for _, settings in (_ask(study, distributions) for _ in range(3))]
    assert resumed == [settings for _, settings in batch]
