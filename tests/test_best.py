"""``best/``: launch.sh only for a one-node best, the sbatch time limit derived from the step time."""

from __future__ import annotations

import re

import pytest

from dse.rules.space import load_space
from dse.study import best as best_mod
from dse.study import loop as study_mod
from tests.helpers import SMALL_SPACE, write_space
from tests.trials import DATA, system, trial


def _time(sbatch: str) -> str:
    return re.search(r"^#SBATCH --time=(\S+)$", sbatch, re.M).group(1)


def test_one_node_best_gets_launch_sh_and_the_readme_offers_both(tmp_path):
    space = load_space(write_space(tmp_path, SMALL_SPACE.replace("num_nodes = 2", "num_nodes = 1")))
    study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid"))
    d = tmp_path / "out" / "best"
    sh = (d / "launch.sh").read_text()
    assert "torchrun" in sh and "trainer.num_nodes=1 " in sh
    readme = (d / "README").read_text()
    assert "bash launch.sh" in readme and "sbatch launch.sbatch" in readme and "No launch.sh" not in readme


def test_a_multi_node_best_that_was_one_node_before_loses_its_launch_sh(tmp_path):
    one = load_space(write_space(tmp_path, SMALL_SPACE.replace("num_nodes = 2", "num_nodes = 1")))
    study_mod.run_study(one, study_mod.Request(out_dir=tmp_path / "out", agent="grid"))
    assert (tmp_path / "out" / "best" / "launch.sh").exists()
    two = load_space(write_space(tmp_path, name="two.toml"))
    store, _ = study_mod.open_store(tmp_path / "out")
    records = store.records()
    store.close()
    best_mod.write_best(two, records, tmp_path / "out")  # the same knobs on two nodes
    assert not (tmp_path / "out" / "best" / "launch.sh").exists()
    assert "needs 2 nodes" in (tmp_path / "out" / "best" / "README").read_text()


@pytest.mark.parametrize(
    ("step_s", "max_steps", "limit"),
    [
        (13.4, 50, "00:40:00"),  # 670 s x 2 + 15 min = 37.3 min -> 40 min (the 128-node case)
        (60.0, 100, "03:35:00"),  # 6000 s x 2 + 15 min = 215 min
        (1.0, 50, "00:30:00"),  # 17 min estimated: the system file's 30 min is longer, and kept
    ],
)
def test_time_limit_is_the_run_time_with_a_margin_or_the_system_files_when_longer(step_s, max_steps, limit):
    t = trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml", slurm={"time_limit": "00:30:00"}),
        num_nodes=2,
        tp=2,
        pp=2,
        cp=1,
        vp=1,
        gbs=32,
        max_steps=max_steps,
    )
    got, why = best_mod.time_limit(t, {"step_time_s": step_s})
    assert got == limit
    assert f"{max_steps} steps x {step_s:.3g} s" in why
    assert ("the system file's" in why.split(";")[0]) == (limit == "00:30:00")


def test_time_limit_without_a_step_time_uses_the_models_prediction():
    from dse.perfmodel import predict

    t = trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml", slurm={"time_limit": "5"}),
        num_nodes=2,
        tp=2,
        pp=2,
        cp=1,
        vp=1,
        gbs=32,
        max_steps=50,
    )
    got, why = best_mod.time_limit(t, {})
    assert "predicted by the performance model" in why
    expect = -(-(2 * 50 * predict(t).step_time_s + 900) // 300) * 300
    assert best_mod.slurm_seconds(got) == expect


def test_the_best_sbatch_carries_the_derived_limit_and_the_readme_says_why(tmp_path):
    space = load_space(write_space(tmp_path, SMALL_SPACE.replace("max_steps = 20", "max_steps = 5000")))
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="grid"))
    top = max((r for r in res.records if r.ok), key=lambda r: r.reward)
    d = tmp_path / "out" / "best"
    limit = _time((d / "launch.sbatch").read_text())
    assert best_mod.slurm_seconds(limit) >= 2 * 5000 * top.metrics["step_time_s"] + best_mod.START_UP_S
    assert f"Time limit {limit}: 5000 steps x" in (d / "README").read_text()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("30:10", 1810), ("01:00:00", 3600), ("1-02", 93600), ("1-02:03:04", 93784), ("UNLIMITED", None)],
)
def test_slurm_time_formats(text, seconds):
    assert best_mod.slurm_seconds(text) == seconds
    if seconds is not None:
        assert best_mod.slurm_seconds(best_mod.slurm_time(seconds)) == seconds
