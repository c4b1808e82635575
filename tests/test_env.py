"""RecipeEnv against Gymnasium's checker, and what one step does."""

from __future__ import annotations

import numpy as np
from gymnasium.utils.env_checker import check_env

from dse.backends.scripts import run_log
from dse.backends.sim import SimBackend
from dse.envs.recipe_env import RecipeEnv
from dse.rules.space import load_space
from tests.helpers import write_space


def make_env(tmp_path):
    space = load_space(write_space(tmp_path))
    return RecipeEnv(space, SimBackend(seed=0), tmp_path / "out")


def test_check_env_passes(tmp_path):
    env = make_env(tmp_path)
    check_env(env, skip_render_check=True)


def test_step_launches_a_valid_point_and_rewards_its_metric(tmp_path):
    env = make_env(tmp_path)
    env.reset(seed=0)
    action = env.encode({"tp": 4, "pp": 2, "vp": 1, "mbs": 1})
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["status"] == "ok" and not terminated and not truncated
    assert reward == info["metrics"]["tflops_per_gpu"] > 0
    assert obs["tflops_per_gpu"][0] == np.float64(reward)
    assert run_log(tmp_path / "out" / "trials" / "00000") is not None  # the simulated log, compressed


def test_rejected_point_is_never_launched(tmp_path):
    env = make_env(tmp_path)
    env.reset(seed=0)
    obs, reward, *_, info = env.step(env.encode({"tp": 4, "pp": 1, "vp": 2, "mbs": 1}))
    assert info["status"] == "rejected" and info["reason"].startswith("vp_needs_pp")
    assert reward == 0.0 and not info["launched"]
    assert not (tmp_path / "out" / "trials").exists()
    assert obs["step_time_s"][0] == 0.0


def test_action_outside_the_space_is_refused(tmp_path):
    env = make_env(tmp_path)
    env.reset(seed=0)
    import pytest

    with pytest.raises(ValueError):
        env.step({"tp": 9, "pp": 0, "vp": 0, "mbs": 0})


def test_a_log_outside_the_run_directory_is_never_read(tmp_path):
    from dse.backends.base import RunResult

    class Stray(SimBackend):
        def run(self, plan, run_dir):
            res = super().run(plan, run_dir)
            stray = tmp_path / "elsewhere.log.gz"
            stray.write_bytes(res.log_path.read_bytes())
            return RunResult(run_dir=run_dir, log_path=stray, exit_code=0)

    space = load_space(write_space(tmp_path))
    env = RecipeEnv(space, Stray(seed=0), tmp_path / "out")
    env.reset(seed=0)
    _, reward, *_, info = env.step(env.encode({"tp": 4, "pp": 2, "vp": 1, "mbs": 1}))
    assert info["status"] == "failed" and "outside the run directory" in info["reason"] and reward == 0.0


def test_a_run_directory_left_by_a_killed_run_is_set_aside(tmp_path):
    env = make_env(tmp_path)
    env.reset(seed=0)
    stale = tmp_path / "out" / "trials" / "00000"
    stale.mkdir(parents=True)
    (stale / "log.txt").write_text("Training epoch 0, iteration 0/9 | train_step_timing in s: 99.0\n")
    _, reward, *_, info = env.step(env.encode({"tp": 4, "pp": 2, "vp": 1, "mbs": 1}))
    assert info["status"] == "ok" and reward > 0
    assert not (stale / "log.txt").exists() and run_log(stale)  # this trial's own log, not the stale one
    assert "99.0" in (tmp_path / "out" / "trials" / "00000.orphan0" / "log.txt").read_text()
