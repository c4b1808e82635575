"""``dse export minari``: a study as a Minari dataset, loaded back with Minari and checked against the store."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.envs.search import table
from dse.logs.parse import UNLAUNCHED_STATUSES
from dse.rl.searchgame import RUN_COST, WASTE_COST, features, reference
from dse.rules.space import load_space
from dse.study.loop import open_store

minari = pytest.importorskip("minari", reason="the rl extra (minari) is not installed")
pytest.importorskip("h5py", reason="the rl extra (minari's HDF5 storage) is not installed")

SPACE = "conf/spaces/nemotron3_8b_space.toml"


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    out = tmp_path / "study"
    args = ["run", "--space", SPACE, "--agent", "random", "--trials", "12", "--twin-seed", "3", "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return out


def test_a_study_round_trips_through_minari(study, tmp_path):
    res = CliRunner().invoke(app, ["export", "minari", str(study), "--dataset-id", "dse/test/study-v0"])
    assert res.exit_code == 0, res.output
    ds = minari.load_dataset("dse/test/study-v0")
    store, _ = open_store(study)
    records = list(store.iter_records())
    store.close()
    space = load_space(SPACE)
    assert ds.total_episodes == 1 and ds.total_steps == len(records)
    ep = next(ds.iterate_episodes())
    want = [[space.knobs[n].index(r.knobs[n]) for n in space.knob_names] + [0] for r in records]  # 0: no stop
    assert ep.actions.tolist() == want
    assert ep.infos["trial"].tolist() == [-1] + [r.number for r in records]
    for v, r in zip(ep.infos["value"][1:], records):
        assert (math.isnan(v) and not r.ok) or v == pytest.approx(r.metrics["tflops_per_gpu"])
    statuses = {r.status for r in records}
    assert "ok" in statuses and statuses & set(UNLAUNCHED_STATUSES)  # this seed's random search meets both
    launched = ep.infos["launched"][1:]
    assert launched.tolist() == [int(r.status not in UNLAUNCHED_STATUSES) for r in records]
    # the observation after each step says how many runs were launched so far (/100), and the last status
    sizes = [len(space.knobs[n]) for n in space.knob_names]
    runs = ep.observations[:, features(space.knob_names, sizes).index("runs")]
    assert np.allclose(runs, np.concatenate([[0], np.cumsum(launched)]) / 100)
    assert ep.truncations[-1] and not ep.terminations.any()
    # the return is the best found (a fraction of the model's best forecast) less the cost of the proposals
    ref = reference(table(space).forecasts)
    best = max(r.reward for r in records if r.ok) / ref
    cost = RUN_COST * launched.sum() + WASTE_COST * (len(records) - launched.sum())
    assert ep.rewards.sum() == pytest.approx(best - cost)
    # the environment spec travels with the dataset: the same twin, the same spaces
    env = ds.recover_environment()
    assert env.unwrapped.spec.kwargs == {"space": SPACE, "backend": "sim", "twin_seed": 3}
    assert env.observation_space == ds.observation_space and env.action_space == ds.action_space


def test_an_id_already_taken_is_a_one_line_error(study):
    runner = CliRunner()
    assert runner.invoke(app, ["export", "minari", str(study)]).exit_code == 0
    res = runner.invoke(app, ["export", "minari", str(study)])
    assert res.exit_code == 2 and "already exists" in res.output and "Traceback" not in res.output


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "study" not in p.relative_to(root).parts[:1])


@pytest.mark.parametrize(
    "bad", ["../escape-v0", "dse/../../escape-v0", "/tmp/escape-v0", "a//b-v0", "noversion", "a/b.c-v0", "x" * 300]
)
def test_a_dataset_id_that_is_no_plain_relative_path_is_refused_before_anything_is_created(study, tmp_path, bad):
    before = tree(tmp_path)
    res = CliRunner().invoke(app, ["export", "minari", str(study), "--dataset-id", bad])
    assert res.exit_code == 2 and "--dataset-id" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert tree(tmp_path) == before  # not even the datasets folder
    assert not (tmp_path.parent / "escape-v0").exists() and not (tmp_path / "escape-v0").exists()


def test_a_datasets_path_that_cannot_be_made_is_one_line(study, tmp_path):
    (tmp_path / "file").write_text("x")
    before = tree(tmp_path)
    for bad in ("/proc/x", str(tmp_path / "file"), str(tmp_path / "file" / "sub")):
        res = CliRunner().invoke(app, ["export", "minari", str(study), "--datasets-path", bad])
        assert res.exit_code == 2 and bad in res.output and "--datasets-path" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert tree(tmp_path) == before
    # a folder that is not there yet is made: the named output, and nothing beside it
    res = CliRunner().invoke(app, ["export", "minari", str(study), "--datasets-path", str(tmp_path / "new" / "ds")])
    assert res.exit_code == 0, res.output
    new = set(tree(tmp_path)) - set(before)
    assert "new/ds" in new and all(p == "new" or p.startswith("new/ds") for p in new), new
