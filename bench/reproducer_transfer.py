"""The reproducer teaches the full-scale search: launched runs of the guided agent to 99% of the twin's best on
the full-scale space, with the shipped model and with the model calibrated on the 2-node reproducer's grid.

For each (reproducer, full) pair of shipped spaces and each twin seed, the documented workflow runs as a user
runs it, with the ``dse`` command on the simulated backend measuring the twin truth of that seed:

    dse run --space REPRODUCER --agent grid --twin-seed S --out DIR
    dse calibrate DIR --out cal.toml

The twin of the reproducer space and the twin of the full space share the physics draws of the seed (the fitted
parameters, the memory reserve and fragmentation, the per knob-value layout effects: ``dse.perfmodel.twin``
draws them from the seed alone); only the layout-effect scale (set per space to the model's typical error) and
the per-point noise differ. The full-scale guided search then runs against that seed's twin of the full space
twice: the shipped model as its forecast and memory screen, and the calibration (``[backend] calibration``);
a third row adds ``--warm-start`` from the reproducer's study (its best 8 points carried into the full space,
``dse.study.generations.carry_points``, run first).
As in bench/search_efficiency.py the full-scale outcomes come straight from the twin (no log round trip) and
a run counts when launched (a screened or rejected point costs nothing). A search that never reaches 99% within
the budget counts as more than the budget (">B").

    python bench/reproducer_transfer.py [--seeds 10] [--budget 60] [--pairs 70b 405b]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
from gymnasium import spaces

from dse.agents.base import load_agents, make_agent
from dse.forecast import Screen, model_forecaster
from dse.perfmodel.twin import make_twin, valid_trials
from dse.rules.space import load_space
from dse.study.generations import carry_points
from dse.study.loop import agent_settings, space_options

SPACES = Path(__file__).resolve().parent.parent / "conf" / "spaces"
PAIRS = {
    "70b": ("llama3_70b_2node_space.toml", "llama3_70b_space.toml"),
    "405b": ("llama3_405b_2node_space.toml", "llama3_405b_space.toml"),
    "340b": ("nemotron4_340b_2node_space.toml", "nemotron4_340b_space.toml"),
}
WARM = "reproducer-calibrated + --warm-start"
DSE = [sys.executable, "-m", "dse"]


def calibrate_on_reproducer(reproducer: Path, seed: int, tmp: Path) -> tuple[Path, Path]:
    """The reproducer's grid on the twin of ``seed`` and ``dse calibrate`` on it, as the user runs them."""
    study, cal = tmp / f"repro{seed}", tmp / f"cal{seed}.toml"
    grid = ["run", "--space", str(reproducer), "--agent", "grid", "--twin-seed", str(seed), "--out", str(study)]
    subprocess.run([*DSE, *grid], check=True, capture_output=True)
    subprocess.run([*DSE, "calibrate", str(study), "--out", str(cal)], check=True, capture_output=True)
    return study, cal


def twin_table(space, trials, keys, seed: int) -> tuple[dict, float]:
    """The twin's outcome of every valid point of ``space`` (by index key) and the twin's best reward."""
    twin = make_twin(space, seed, trials=trials)
    table = {k: twin.predict(t, flops_convention=space.backend.flops_convention) for k, t in zip(keys, trials)}
    sign = 1 if space.objective.sense == "maximize" else -1
    best = max(sign * getattr(p, space.objective.metric) for p in table.values() if p.fits)
    return table, best


def guided_runs_to_99(
    space, table: dict, best: float, seed: int, budget: int, trials, keys, seeds: list[dict] | None = None
) -> tuple[float, int]:
    """Launched runs until the guided agent's best is >= 99% of ``best`` (inf if never), and its OOM runs;
    ``space``'s calibration (or none) is the agent's forecast and the memory screen's model. ``seeds``: points
    run first (``--warm-start``), shown to the agent through ``observe`` as the study shows them."""
    registry = load_agents()
    opts = space_options(space, "guided", agent_settings(space, "guided", None, registry), registry)
    act = spaces.Dict(OrderedDict((k, spaces.Discrete(len(v))) for k, v in space.knobs.items()))
    names = space.knob_names
    screen = Screen(space)
    screened = {k for k, t in zip(keys, trials) if screen.point(t).screened}
    agent = make_agent(
        "guided", registry, act, seed=seed, action_mask=lambda a: tuple(int(a[n]) for n in names) in table,
        forecast=model_forecaster(space), **opts,
    )  # fmt: skip
    sign = 1 if space.objective.sense == "maximize" else -1
    fail, metric = space.objective.failed_reward, space.objective.metric
    launched = ooms = 0
    queue = [OrderedDict((n, space.knobs[n].index(p[n])) for n in names) for p in seeds or []]
    while launched < budget and (action := queue.pop(0) if queue else agent.propose()) is not None:
        key = tuple(int(action[n]) for n in names)
        p = table.get(key)
        if p is None or key in screened:
            agent.observe(action, fail, False, status="rejected" if p is None else "screened", metrics={})
            continue
        launched += 1
        if not p.fits:
            ooms += 1
            agent.observe(action, fail, False, status="oom", metrics={})
            continue
        reward = sign * getattr(p, metric)
        agent.observe(action, reward, True, status="ok", metrics={"peak_memory_gib": p.peak_memory_gib, metric: reward})
        if (reward / best if best > 0 else best / reward) >= 0.99:
            return launched, ooms
    return math.inf, ooms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", nargs="+", default=["70b", "405b"], choices=list(PAIRS))
    ap.add_argument("--seeds", type=int, default=10, help="twin seeds per pair (0..N-1)")
    ap.add_argument("--budget", type=int, default=60, help="launched runs per full-scale search")
    args = ap.parse_args()
    t0 = time.perf_counter()
    print("| full-scale space | model | runs to 99% median | p90 | OOM runs (mean) | seeds |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as d:
        for pair in args.pairs:
            reproducer, full_name = (SPACES / f for f in PAIRS[pair])
            full = load_space(full_name)
            trials = valid_trials(full)
            keys = [tuple(full.knobs[n].index(t.values[n]) for n in full.knob_names) for t in trials]
            rows: dict[str, list[tuple[float, int]]] = {"shipped": [], "reproducer-calibrated": [], WARM: []}
            for seed in range(args.seeds):
                table, best = twin_table(full, trials, keys, seed)
                study, cal = calibrate_on_reproducer(reproducer, seed, Path(d) / pair)
                calibrated = full.model_copy(
                    update={"backend": full.backend.model_copy(update={"calibration": str(cal)})}
                )
                for label, space in (("shipped", full), ("reproducer-calibrated", calibrated)):
                    rows[label].append(guided_runs_to_99(space, table, best, seed, args.budget, trials, keys))
                seeds = carry_points(calibrated, study).points
                rows[WARM].append(guided_runs_to_99(calibrated, table, best, seed, args.budget, trials, keys, seeds))
            for label, res in rows.items():
                to99 = [r for r, _ in res]
                med, p90 = float(np.median(to99)), float(np.percentile(to99, 90, method="higher"))

                def show(x: float) -> str:
                    return f">{args.budget}" if math.isinf(x) else f"{x:.0f}"

                print(
                    f"| {full.name} | {label} | {show(med)} | {show(p90)} | {np.mean([o for _, o in res]):.1f} | "
                    f"{args.seeds} |",
                    flush=True,
                )
    print(f"\nguided agent, budget {args.budget} launched runs; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
