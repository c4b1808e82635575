"""Steps per second of ``gym.make_vec("dse/Recipe-v0", ...)`` on the sim backend as the number of environments grows.

For each vectorisation mode (``sync``: the sub-environments stepped one after the other in this process;
``async``: one worker process each, stepped in parallel) and each ``num_envs`` N (1, 2, 4, 8, 16 by default), the
vector environment is made, reset with a seed (sub-environment i draws its own twin, seed + i), warmed up, and
stepped with random actions (never the stop entry) for ``--steps`` steps per sub-environment; episodes that end
are reset by the vector environment itself. Printed per row: steps/s of wall time (all sub-environments'
steps together), the speed-up over N = 1 of the same mode, and steps per CPU-second (this process and, for
``async``, its workers: counted once they have exited). Every figure is measured; the header names the machine
(CPUs this process may use, the CPU model, the load average before and after), since on a shared machine the wall
clock is the share of the cores the run got.

It needs only dse and its runtime dependencies (``pip install .`` from the source checkout, or the wheel; no
extra): gymnasium and numpy come with dse, and the space is a shipped one.

    python bench/rl_vec_speed.py [--space conf/spaces/nemotron3_8b_space.toml] [--steps 1000]
                                 [--envs 1 2 4 8 16] [--modes sync async] [--on-disk]

``--on-disk`` gives each sub-environment a directory of its own where every point's run goes through the study's
own path (the log written, compressed and parsed), the heavier step that async workers share out.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import tempfile
import time

import gymnasium as gym
import numpy as np

import dse.envs  # noqa: F401  (registers dse/Recipe-v0)


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; the platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have exited (the async workers, once closed)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def make_vec(mode: str, n: int, space: str, budget: int, disk_root: str | None) -> gym.vector.VectorEnv:
    """``gym.make_vec`` in memory; on disk, the same vector form built from one ``gym.make`` per sub-environment,
    since each needs a directory of its own (``make_vec`` passes every sub-environment the same arguments)."""
    if disk_root is None:
        return gym.make_vec("dse/Recipe-v0", num_envs=n, vectorization_mode=mode, space=space, budget=budget)

    def one(i: int):
        out = os.path.join(disk_root, f"env{i}")
        return lambda: gym.make("dse/Recipe-v0", space=space, budget=budget, in_memory=False, out_dir=out)

    form = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    return form([one(i) for i in range(n)])


def measure(
    mode: str, n: int, space: str, steps: int, budget: int, warmup: int, disk_root: str | None = None
) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, steps) of ``steps`` random steps per sub-environment of one vector env."""
    vec = make_vec(mode, n, space, budget, disk_root)
    rng = np.random.default_rng(0)
    nvec = vec.single_action_space.nvec
    try:
        vec.reset(seed=0)
        for _ in range(warmup):  # the workers started, the first points of each twin computed
            vec.step(_actions(rng, nvec, n))
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        for _ in range(steps):
            vec.step(_actions(rng, nvec, n))
        wall = time.perf_counter() - t0
    finally:
        vec.close()
    return wall, cpu_seconds() - c0, steps * n


def _actions(rng: np.random.Generator, nvec: np.ndarray, n: int) -> np.ndarray:
    a = rng.integers(0, nvec, size=(n, len(nvec)))
    a[:, -1] = 0  # never stop: a random stop would end most episodes in two steps
    return a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="conf/spaces/nemotron3_8b_space.toml")
    ap.add_argument("--steps", type=int, default=1000, help="steps per sub-environment")
    ap.add_argument("--warmup", type=int, default=20, help="steps per sub-environment before the clock starts")
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    ap.add_argument("--budget", type=int, default=50)
    ap.add_argument(
        "--on-disk",
        action="store_true",
        help="each sub-environment runs its points through the study's own path (logs written, compressed, parsed)",
    )
    a = ap.parse_args()
    before = os.getloadavg()
    print(
        f"machine: {usable_cpus()} usable CPUs of {os.cpu_count()}, {cpu_model()}; load average "
        f"{before[0]:.1f} {before[1]:.1f} {before[2]:.1f} before"
    )
    where = "runs on disk, a directory per sub-environment" if a.on_disk else "sim backend in memory"
    print(f"space {a.space}, {where}, {a.steps} random steps per sub-environment (measured)")
    print("| mode | num_envs | steps | wall s | steps/s | speed-up over 1 | steps per CPU-second |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mode in a.modes:
        base = None
        for n in a.envs:
            with tempfile.TemporaryDirectory() as tmp:
                disk_root = tmp if a.on_disk else None
                wall, cpu, total = measure(mode, n, a.space, a.steps, a.budget, a.warmup, disk_root)
            rate = total / wall
            base = base or rate
            per_cpu = f"{total / cpu:,.0f}" if cpu > 0 else "-"
            print(f"| {mode} | {n} | {total} | {wall:.1f} | {rate:,.0f} | {rate / base:.2f}x | {per_cpu} |", flush=True)
    after = os.getloadavg()
    print(f"load average {after[0]:.1f} {after[1]:.1f} {after[2]:.1f} after")


if __name__ == "__main__":
    main()
