"""Throughput of the performance model on one core; prints figures, asserts nothing.

    python bench/model_speed.py

1. ``predict`` on pre-resolved TrialConfigs (the simulated backend's and ``dse predict``'s path).
2. A grid over a ~120,000-point llama3_405b space on 128 x 8 H100 (tp, pp, vp, cp, mbs, gbs, recompute,
   precision, fsdp): TrialConfig construction, then ``predict`` on every point, timed apart.
3. ``dse calibrate``'s path: points prepared once (``dse.perfmodel.model.prepare``), their step time alone and their
   peak memory alone under a parameter set the fit has not seen.

The per-call figures are the best of five passes, in wall-clock and in CPU time: on a shared machine the CPU time
says more about the model than the wall clock, which says as much about the load.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dse.perfmodel import DEFAULT_PARAMS, predict  # noqa: E402
from dse.perfmodel.model import prepare  # noqa: E402
from dse.perfmodel.trials import make_trial  # noqa: E402
from dse.recipes.models import RECIPES  # noqa: E402

GRID = dict(
    tp=(1, 2, 4, 8),
    pp=(1, 2, 4, 8, 16),
    vp=(1, 2, 4, 8),
    cp=(1, 2, 4, 8),
    mbs=(1, 2, 4, 8),
    gbs=(128, 256, 512, 1024),
    recompute=("none", "selective", "full"),
    precision=("bf16", "fp8"),
    fsdp=(False, True),
    tp_comm_overlap=(False, True),
)


def main() -> None:
    recipe = RECIPES["llama3_405b"]
    names = list(GRID)
    points = [dict(zip(names, combo)) for combo in itertools.product(*GRID.values())]
    print(f"grid: {len(points):,} points (llama3_405b, 1024 x h100)")

    t0 = time.perf_counter()
    trials = [make_trial(recipe, "h100", 1024, **pt) for pt in points]
    t_build = time.perf_counter() - t0

    t0 = time.perf_counter()
    fits = sum(predict(t).fits for t in trials)
    t_pred = time.perf_counter() - t0

    sample = trials[:2000]
    wall, cpu = best_of_five(lambda: [predict(t) for t in sample])
    print(f"TrialConfig construction: {t_build:.2f} s ({len(points) / t_build:,.0f} per s)")
    print(
        f"predict over the grid:    {t_pred:.2f} s ({len(points) / t_pred:,.0f} predictions per s; "
        f"{fits:,} fit in memory)"
    )
    print(
        f"predict, pre-resolved:    {len(sample) / wall:,.0f} predictions per s "
        f"({1e6 * wall / len(sample):.1f} us each; CPU {1e6 * cpu / len(sample):.1f} us; goal >= 20,000 per s)"
    )
    prepared = [prepare(t) for t in sample]
    fitted = DEFAULT_PARAMS.with_values(elementwise_scale=1.7)  # other parameters than the shipped, as a fit tries
    for what, run in (
        ("step time", lambda: [p.step_time_s(fitted) for p in prepared]),
        ("peak memory", lambda: [p.peak_memory_gib(fitted) for p in prepared]),
    ):
        wall, cpu = best_of_five(run)
        print(
            f"prepared, {what + ':':12s} {len(sample) / wall:,.0f} per s "
            f"({1e6 * wall / len(sample):.1f} us each; CPU {1e6 * cpu / len(sample):.1f} us)"
        )


def best_of_five(run) -> tuple[float, float]:
    """The best wall-clock and the best CPU seconds of five calls of ``run``: the per-call cost without noise."""
    wall = cpu = float("inf")
    for _ in range(5):
        w, c = time.perf_counter(), time.process_time()
        run()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu


if __name__ == "__main__":
    main()
