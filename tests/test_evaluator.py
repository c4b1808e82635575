"""The evaluator (dse.evaluator): a point resolved, checked and predicted once per model, its predictions dropped when
a refit changes the model (its trials and checks kept), and one evaluator shared by everything a study asks before
its first trial (the cost forecast, the checks, the baseline, the agent's forecasts, the environment)."""

from __future__ import annotations

import sys

import pytest

from dse.envs import recipe_env
from dse.evaluator import Evaluator
from dse.perfmodel import DEFAULT_PARAMS, predict
from dse.perfmodel.model import Prepared
from dse.perfmodel.refit import StudyModel
from dse.rules import constraints
from dse.rules.space import load_space
from dse.rules.trial import resolve
from dse.study import loop as study_mod
from tests.helpers import SMALL_SPACE, write_space

TWIN = SMALL_SPACE.replace('screen = "none"', "") + '\n[backend]\nkind = "sim"\ntruth = "twin"\ntwin_seed = 1\n'


def _space(tmp_path, text=TWIN):
    return load_space(write_space(tmp_path, text))


def _valid(space):
    return next(p for p in space.points() if constraints.check(resolve(space, p)) is None)


def test_a_point_is_resolved_checked_and_predicted_once(tmp_path):
    space = _space(tmp_path)
    ev = Evaluator(space)
    point = _valid(space)
    first = ev.predict(point)
    assert ev.check(dict(point)) is None and ev.predict(dict(point)) is first and ev.trial(point) is ev.trial(point)
    assert ev.computed == {"resolve": 1, "check": 1, "predict": 1}
    # the same figures as the model asked directly
    assert first == predict(resolve(space, point), flops_convention=space.backend.flops_convention)
    ev.forecast(point), ev.point(point), ev.reason(point)
    assert ev.computed == {"resolve": 1, "check": 1, "predict": 1}


def test_a_refit_drops_the_kept_predictions_and_keeps_the_trials(tmp_path):
    space = _space(tmp_path)
    model = StudyModel(space, DEFAULT_PARAMS, learns=True)
    ev = Evaluator(space, model)
    point = _valid(space)
    before = ev.predict(point)
    assert ev.predict(point) is before
    trial = ev.trial(point)
    line = model.observe(0, trial, "ok", {"step_time_s": before.step_time_s * 1.5, "peak_memory_gib": 40.0})
    assert line is not None  # refit
    after = ev.predict(point)
    assert after.step_time_s > 1.3 * before.step_time_s  # the refit model's figure, not the kept one
    assert after == model.predict(trial)
    assert ev.computed == {"resolve": 1, "predict": 2}
    assert ev.predict(point) is after  # kept again until the next refit


class _FirstTrial(Exception):
    pass


def test_a_study_asks_one_evaluator_for_every_point_before_its_first_trial(tmp_path, monkeypatch):
    """Every resolve and every prediction before the first launch is the evaluator's: each point of the space once
    (the cost forecast, the guided agent's forecasts, the baseline and the checks share them). The exact truth: a
    twin truth's backend walks the space for its own calibration."""
    space = _space(tmp_path, TWIN.replace('truth = "twin"', 'truth = "exact"'))
    ev = study_mod.study_evaluator(space)
    calls = {"resolve": 0, "predict": 0}
    codes = {resolve.__code__: "resolve", Prepared.predict.__code__: "predict"}

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            calls[codes[frame.f_code]] += 1

    def first(*a, **k):
        raise _FirstTrial

    monkeypatch.setattr(recipe_env, "run_trial", first)
    sys.setprofile(hook)
    try:
        study_mod.forecast_cost(space, agent="guided", evaluator=ev)
        with pytest.raises(_FirstTrial):
            study_mod.run_study(
                space, study_mod.Request(out_dir=tmp_path / "out", agent="guided", trials=3, evaluator=ev)
            )
    finally:
        sys.setprofile(None)
    assert calls["resolve"] == ev.computed["resolve"]
    # the one prediction besides: the simulated run's figures in the launch plan the preflight checks (the backend's)
    assert calls["predict"] == ev.computed["predict"] + 1
    assert space.size <= ev.computed["resolve"] <= space.size + 2  # each point once; the baseline's layout besides
    assert ev.computed["check"] <= ev.computed["resolve"]


def test_the_study_loop_uses_the_evaluator_it_is_given(tmp_path):
    space = _space(tmp_path)
    ev = study_mod.study_evaluator(space)
    lines: list[str] = []
    study_mod.run_study(
        space,
        study_mod.Request(out_dir=tmp_path / "out", agent="guided", trials=3, evaluator=ev, on_model=lines.append),
    )
    assert ev.model.runs and any(x.startswith("model: ") for x in lines)  # the loop's model is the evaluator's
    with pytest.raises(ValueError, match="another space"):
        study_mod.run_study(_space(tmp_path), study_mod.Request(out_dir=tmp_path / "other", evaluator=ev))
