"""The ``twin`` truth of the simulated backend: a seeded machine that differs from the model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dse.backends.sim import SimBackend
from dse.cli import app
from dse.perfmodel import predict
from dse.perfmodel.simulate import simulate
from dse.perfmodel.twin import TARGET_MAPE, make_twin, mape, valid_trials
from dse.rules.space import load_space
from dse.rules.trial import resolve
from dse.study import loop as study_mod
from tests.helpers import SMALL_SPACE, write_space

runner = CliRunner()
SPACE_70B = "conf/spaces/llama3_70b_space.toml"


@pytest.fixture(scope="module")
def space70():
    space = load_space(SPACE_70B)
    return space, valid_trials(space)


def _best(trials, figure):
    fits = [t for t in trials if figure(t).fits]
    return max(fits, key=lambda t: figure(t).tflops_per_gpu)


def test_twin_is_deterministic_for_its_seed(space70):
    space, trials = space70
    a, b, c = make_twin(space, 4, trials=trials), make_twin(space, 4, trials=trials), make_twin(space, 5, trials=trials)
    assert a == b and a != c
    sample = trials[::97]
    assert [a.predict(t) for t in sample] == [b.predict(t) for t in sample]
    assert [a.predict(t).step_time_s for t in sample] != [c.predict(t).step_time_s for t in sample]


def test_twin_mape_against_the_model_is_in_the_documented_band(space70):
    space, trials = space70
    for seed in range(4):
        err = mape(make_twin(space, seed, trials=trials), trials)
        assert 0.08 <= err <= 0.10, (seed, err)
        assert err == pytest.approx(TARGET_MAPE, abs=0.005)


def test_most_twins_have_a_best_layout_other_than_the_models(space70):
    space, trials = space70
    model_best = _best(trials, predict)
    differ = 0
    for seed in range(10):
        twin = make_twin(space, seed, trials=trials)
        differ += _best(trials, twin.predict) is not model_best
    assert differ >= 6


def test_twin_moves_the_memory_border(space70):
    space, trials = space70
    moved = 0
    for seed in range(6):
        twin = make_twin(space, seed, trials=trials)
        moved += sum(twin.predict(t).fits != predict(t).fits for t in trials) > 0
    assert moved >= 3


def test_default_truth_is_the_exact_model(tmp_path):
    space = load_space(write_space(tmp_path))
    assert space.backend.truth == "exact"
    backend = SimBackend.from_space(space)
    assert backend.twin is None
    trial = resolve(space, {"tp": 2, "pp": 2, "vp": 1, "mbs": 1})
    assert simulate(trial).step_time_s == predict(trial).step_time_s


def test_a_twin_study_goes_through_the_ordinary_log_parser_store_path(tmp_path):
    text = SMALL_SPACE + '\n[backend]\nkind = "sim"\ntruth = "twin"\ntwin_seed = 3\n'
    space = load_space(write_space(tmp_path, text))
    twin = make_twin(space, 3)
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid"))
    ok = [r for r in res.records if r.ok]
    assert ok and all((tmp_path / "out" / "trials" / f"{r.number:05d}" / "log.txt.gz").exists() for r in ok)
    off_model = 0
    for r in ok:
        trial = resolve(space, r.knobs)
        # the parsed figure is the twin's (up to the simulated per-step jitter), not the model's
        assert r.metrics["step_time_s"] == pytest.approx(twin.predict(trial).step_time_s, rel=0.01)
        off_model += abs(r.metrics["step_time_s"] / predict(trial).step_time_s - 1) > 0.02
    assert off_model > len(ok) / 2


def test_cli_twin_seed_for_run_and_space(tmp_path):
    path = write_space(tmp_path)
    r = runner.invoke(app, ["space", str(path), "--twin-seed", "2", "--json"])
    assert r.exit_code == 0, r.output
    tw = json.loads(r.stdout)["twin"]
    assert tw["seed"] == 2 and 0.08 <= tw["step_time_mape"] <= 0.10
    out = tmp_path / "o"
    r = runner.invoke(app, ["run", "--space", str(path), "--out", str(out), "--agent", "grid", "--twin-seed", "2"])
    assert r.exit_code == 0, r.output
    space = load_space(path)
    twin = make_twin(space, 2)
    store, _ = study_mod.open_store(out)
    rec = next(r for r in store.records() if r.ok)
    store.close()
    assert rec.metrics["step_time_s"] == pytest.approx(twin.predict(resolve(space, rec.knobs)).step_time_s, rel=0.01)


def test_unknown_truth_is_a_one_line_error(tmp_path):
    path = write_space(tmp_path, SMALL_SPACE + '\n[backend]\ntruth = "twn"\n')
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 2 and "backend.truth" in r.output and "twin" in r.output
