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


def replays_exactly(ds, ep, options=None):
    """Replaying ``ep``'s actions in the dataset's own environment gives its observations, rewards and ends."""
    env = ds.recover_environment()
    obs, _ = env.reset(options=options)
    assert np.array_equal(obs, ep.observations[0])
    for i, action in enumerate(ep.actions):
        obs, reward, terminated, truncated, _ = env.step(action)
        assert np.array_equal(obs, ep.observations[i + 1]), i
        assert reward == pytest.approx(ep.rewards[i], abs=1e-9), i
        assert (terminated, truncated) == (ep.terminations[i], ep.truncations[i]), i
    assert terminated or truncated  # the episode ends where the environment ends it


def test_a_study_round_trips_through_minari_by_the_environments_rules(study, tmp_path):
    res = CliRunner().invoke(app, ["export", "minari", str(study), "--dataset-id", "dse/test/study-v0"])
    assert res.exit_code == 0, res.output
    ds = minari.load_dataset("dse/test/study-v0")
    store, _ = open_store(study)
    records = list(store.iter_records())
    store.close()
    space = load_space(SPACE)
    seen = [r for r in records if r.status != "screened"]  # the environment has no screen
    launched = {tuple(r.knobs.values()) for r in records if r.status not in UNLAUNCHED_STATUSES}
    assert ds.total_episodes == 1
    ep = next(ds.iterate_episodes())
    # the study's launched runs are the budget: the step that launches the last one ends the episode (truncated)
    assert ep.truncations[-1] and not ep.terminations.any() and ep.infos["launched"].sum() == len(launched)
    steps = len(ep.actions)
    want = [[space.knobs[n].index(r.knobs[n]) for n in space.knob_names] + [0] for r in seen][:steps]
    assert ep.actions.tolist() == want
    assert ep.infos["trial"].tolist() == [-1] + [r.number for r in seen][:steps]
    for v, r in zip(ep.infos["value"][1:], seen):
        assert (math.isnan(v) and not r.ok) or v == pytest.approx(r.metrics["tflops_per_gpu"])
    statuses = {r.status for r in records}
    assert "ok" in statuses and statuses & set(UNLAUNCHED_STATUSES)  # this seed's random search meets both
    # the observation after each step says how many runs were launched so far (/100)
    sizes = [len(space.knobs[n]) for n in space.knob_names]
    runs = ep.observations[:, features(space.knob_names, sizes).index("runs")]
    assert np.allclose(runs, np.concatenate([[0], np.cumsum(ep.infos["launched"][1:])]) / 100)
    # the return is the best found (a fraction of the model's best forecast) less the cost of the proposals
    ref = reference(table(space).forecasts)
    best = max(r.reward for r in seen[:steps] if r.ok) / ref
    n_launched = ep.infos["launched"][1:].sum()
    cost = RUN_COST * n_launched + WASTE_COST * (steps - n_launched)
    assert ep.rewards.sum() == pytest.approx(best - cost)
    # the full spec travels with the dataset, and the environment it rebuilds replays the episode exactly
    spec = ds.recover_environment().unwrapped.spec.kwargs
    assert spec == {
        "space": SPACE,
        "backend": "sim",
        "twin_seed": 3,
        "seed": 0,
        "budget": len(launched),
        "target": 0.99,
        "run_cost": RUN_COST,
        "waste_cost": WASTE_COST,
    }
    env = ds.recover_environment()
    assert env.observation_space == ds.observation_space and env.action_space == ds.action_space
    replays_exactly(ds, ep)


def test_a_study_that_stopped_before_the_budget_ends_with_the_stop_action(study):
    res = CliRunner().invoke(
        app, ["export", "minari", str(study), "--dataset-id", "dse/test/long-v0", "--budget", "40"]
    )
    assert res.exit_code == 0, res.output
    ds = minari.load_dataset("dse/test/long-v0")
    ep = next(ds.iterate_episodes())
    assert ep.terminations[-1] and not ep.truncations.any() and ep.actions[-1][-1] == 1  # stop
    assert ds.recover_environment().unwrapped.budget == 40
    replays_exactly(ds, ep)
    res = CliRunner().invoke(app, ["export", "minari", str(study), "--dataset-id", "dse/test/bad-v0", "--budget", "0"])
    assert res.exit_code == 2 and "--budget" in res.output and "Traceback" not in res.output


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


# the smallest of each kind: a training space, a held-out space, a replay of real runs
SUITE_IDS = ["dse/Nemotron3-8B-H100-v0", "dse/Llama405B-2Node-H100-v0", "dse/Replay-Llama8B-4L-H200-v0"]


def test_the_suite_exports_episodes_that_obey_the_environment_and_replay_exactly(tmp_path, monkeypatch):
    from dse.envs import suite
    from dse.results.offline import to_minari_suite

    ids = [i for i in SUITE_IDS if suite.get(i).available]
    out = to_minari_suite("test", episodes=3, only=ids, datasets_path=tmp_path / "ds")
    assert out.episodes == 6 * len(ids) and [d[0] for d in out.datasets] == [
        f"dse/suite/{i[4:-3]}/test-v0" for i in ids
    ]
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "ds"))
    for dataset_id, n, ref_min, ref_max in out.datasets:
        ds = minari.load_dataset(dataset_id)
        b = suite.get("dse/" + dataset_id.split("/")[2] + "-v0")
        assert ds.total_episodes == n == 6
        spec = ds.recover_environment().unwrapped.spec.kwargs
        assert spec == {
            "benchmark": b.id,
            "split": "test",
            "seed": 0,
            "budget": b.budget,
            "target": 0.99,
            "run_cost": RUN_COST,
            "waste_cost": WASTE_COST,
        }
        eps = list(ds.iterate_episodes())
        returns = np.array([e.rewards.sum() for e in eps])
        agent = np.array([e.infos["agent"][0] for e in eps])
        assert agent.tolist() == [0, 1] * 3  # each twin played by random, then guided
        # the reference scores are the agents' mean returns: normalised, random is 0 and guided 1
        assert ref_min == pytest.approx(returns[agent == 0].mean()) and ref_max == pytest.approx(
            returns[agent == 1].mean()
        )
        norm = minari.get_normalized_score(ds, returns)
        assert norm[agent == 0].mean() == pytest.approx(0) and norm[agent == 1].mean() == pytest.approx(1)
        twins = [int(e.infos["twin_seed"][0]) for e in eps]
        if b.replay:
            assert twins == [-1] * 6
        else:  # the test split's twins 0, 1, 2, each by both agents
            assert twins == [0, 0, 1, 1, 2, 2]
        for e, ts in zip(eps, twins):
            # the environment's rules: one end, at the last step; never more launched runs than the budget
            ends = e.terminations | e.truncations
            assert ends[-1] and not ends[:-1].any() and e.infos["launched"].sum() <= b.budget
            replays_exactly(ds, e, None if ts < 0 else {"twin_seed": ts})


def test_the_whole_test_split_exports_over_a_thousand_episodes_that_reload_and_replay(tmp_path, monkeypatch):
    """The benchmark's dataset at its size: every benchmark of the test split, 28 twins (a replay: 28 agent seeds)
    each played by random and guided (1,008 episodes over 18 benchmarks), reloaded with Minari; every episode
    obeys the environment's rules and the first twin's two episodes of each dataset replay exactly."""
    from dse.envs import suite
    from dse.results.offline import to_minari_suite

    ids = [b.id for b in suite.benchmarks("test") if b.available]
    out = to_minari_suite("test", episodes=28, datasets_path=tmp_path / "ds")
    assert out.episodes == 56 * len(ids) and len(out.datasets) == len(ids)
    if len(ids) == len(suite.benchmarks("test")):
        assert out.episodes >= 1_000
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "ds"))
    total = 0
    for (dataset_id, n, _, _), bid in zip(out.datasets, ids):
        ds = minari.load_dataset(dataset_id)
        b = suite.get(bid)
        assert ds.total_episodes == n == 56
        eps = list(ds.iterate_episodes())
        total += len(eps)
        returns = np.array([e.rewards.sum() for e in eps])
        agent = np.array([e.infos["agent"][0] for e in eps])
        norm = minari.get_normalized_score(ds, returns)
        assert norm[agent == 0].mean() == pytest.approx(0) and norm[agent == 1].mean() == pytest.approx(1)
        for e in eps:
            ends = e.terminations | e.truncations
            assert ends[-1] and not ends[:-1].any() and e.infos["launched"].sum() <= b.budget
        for e in eps[:2]:
            ts = int(e.infos["twin_seed"][0])
            replays_exactly(ds, e, None if ts < 0 else {"twin_seed": ts})
    assert total == out.episodes


def test_the_suite_export_refuses_bad_arguments_in_one_line(tmp_path):
    runner = CliRunner()
    base = ["export", "minari-suite", "--datasets-path", str(tmp_path), "--episodes", "1"]
    for extra, field in (
        (["--split", "dev"], "--split"),
        (["--benchmark", "dse/Nope-v0"], "--benchmark"),
        (["--benchmark", "dse/Qwen3-30B-A3B-H100-v0", "--split", "train"], "--benchmark"),  # held out: test only
        (["--agent", "random"], "--agent"),  # guided is the reference max
        (["--agent", "random", "--agent", "guided", "--agent", "random"], "--agent"),
        (["--prefix", "../up"], "--prefix"),
    ):
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 2 and field in res.output and "Traceback" not in res.output, (extra, res.output)
    assert not any(tmp_path.iterdir())
    ok = base + ["--benchmark", SUITE_IDS[0]]
    assert runner.invoke(app, ok).exit_code == 0
    res = runner.invoke(app, ok)  # the dataset is there: refused before anything is played
    assert res.exit_code == 2 and "already exists" in res.output
