"""Steps per second of ``dse/Recipe-v0`` (random actions), as a learner drives it.

Three forms on the same space: one environment on a twin in memory (the simulated log written into a string and
parsed: each point's figures computed once per environment, then looked up), the vector form over ``--envs`` twins
(``gym.make_vec``), and one environment whose every launched run goes through the simulated backend and a run
directory on disk (``in_memory=False``: the study's own path, logs written, compressed and parsed). Rejected points
and repeats cost no run in any form. Also printed: the time to build the environment (the space's table of valid
points and forecasts, the twin's calibration). Steps per CPU-second (this process's CPU time) is the figure a busy
shared machine does not change: steps per second of wall time is that figure times the share of a core the process
got; the load average at the end says how busy the machine was.

    python bench/rl_env_speed.py [--space conf/spaces/nemotron3_8b_space.toml] [--steps 5000] [--envs 8]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import gymnasium as gym
import numpy as np

import dse.envs  # noqa: F401  (registers dse/Recipe-v0)


def drive(env, steps: int, rng: np.random.Generator, vector: bool = False) -> tuple[float, float, int]:
    """Random actions for ``steps`` steps (per sub-environment for a vector env); (wall seconds, CPU seconds of
    this process, launched runs)."""
    env.reset(seed=0)
    runs = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        n = env.action_space.nvec if not vector else env.single_action_space.nvec
        if vector:
            action = rng.integers(0, n, size=(env.num_envs, len(n)))
            action[:, -1] = 0  # never stop: a random stop would end most episodes in two steps
            _, _, term, trunc, info = env.step(action)
            runs += int(np.sum(info["launched"]))
        else:
            action = rng.integers(0, n)
            action[-1] = 0
            _, _, term, trunc, info = env.step(action)
            runs += int(info["launched"])
            if term or trunc:
                env.reset()
    return time.perf_counter() - t0, time.process_time() - c0, runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="conf/spaces/nemotron3_8b_space.toml")
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--budget", type=int, default=50)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| form | build s | steps | steps/s | steps per CPU-second | launched runs/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    t0 = time.perf_counter()
    env = gym.make("dse/Recipe-v0", space=a.space, twin_seed=0, budget=a.budget)
    built = time.perf_counter() - t0
    s, cpu, runs = drive(env, a.steps, rng)
    print(
        f"| one twin, in memory | {built:.1f} | {a.steps} | {a.steps / s:,.0f} | {a.steps / cpu:,.0f} | {runs / s:,.0f} |"
    )
    t0 = time.perf_counter()
    vec = gym.make_vec("dse/Recipe-v0", num_envs=a.envs, space=a.space, budget=a.budget)
    built = time.perf_counter() - t0
    per = max(1, a.steps // a.envs)
    s, cpu, runs = drive(vec, per, rng, vector=True)
    total = per * a.envs
    print(
        f"| {a.envs} twins, vector, in memory | {built:.1f} | {total} | {total / s:,.0f} | {total / cpu:,.0f} "
        f"| {runs / s:,.0f} |"
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        disk = gym.make("dse/Recipe-v0", space=a.space, twin_seed=0, budget=a.budget, in_memory=False, out_dir=tmp)
        built = time.perf_counter() - t0
        n = max(1, a.steps // 10)
        s, cpu, runs = drive(disk, n, rng)
        print(f"| one twin, runs on disk | {built:.1f} | {n} | {n / s:,.0f} | {n / cpu:,.0f} | {runs / s:,.0f} |")
    print(f"measured on {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
