"""Search efficiency against the twin truth: launched runs until the best found is >= 99% of the twin's best.

For each space and twin seed, the twin's true best is the exhaustive grid on that twin (every valid point,
the twin's figures). Each agent then searches with a budget of ``--budget`` launched runs (rejected points
cost nothing and count for nothing; the guided agent may stop earlier by itself). Printed per space and
agent: launched runs to 99% (median and 90th percentile over twin seeds; a seed that never gets there
counts as more than the budget, shown ">B"), GPU-hours spent up to that run, the best found after 10 and
25 launched runs (fraction of the twin's best, median), and the share of launched runs that ran out of memory.
Each agent runs with the memory screen on (as ``dse run`` by default: a point the model predicts beyond the GPU's
memory by more than the space's ``screen_margin`` is shown to the agent as ``screened``, costs nothing and is
no launched run) and off (``[search] screen = "none"``); ``--screen`` picks one.

The ``policy`` agent (experimental; the rl extra) searches with a policy trained once per space by ``dse
train-policy``'s code on twins 1000.. (``--policy-steps`` PPO steps over ``--policy-twins`` twins): never the
twins 0..N-1 it is judged on here. Its training time is printed beside the table; it is left out of the default
agents when Stable-Baselines3 is not installed.

The outcomes come straight from the twin (``dse.perfmodel.twin``: the figures the simulated backend
writes into its logs), without the log / parser / store round trip of ``dse run`` (the same numbers up to
the 1% per-step jitter that the parser averages away), so that the table takes minutes, not hours.
GPU-hours per run: GPUs x (step time x max_steps + the system's start-up time) / 3600, as ``dse run``
records them.

    python bench/search_efficiency.py [--seeds 20] [--budget 150] [--spaces a.toml b.toml ...] [--screen on off]

``--replay [SPACE ...]`` judges the agents on real runs instead: each replay space (default: the real one-H200
studies shipped in ``bench/data/*/replay_space.toml``) is searched by each agent through ``dse run``'s own loop
on the replay backend (the recorded outcome of each point, the study's memory screen and refits as ``dse run``
has them), seeds 0..``--seeds``-1. Printed per space, agent and screen: launched runs to the measured best (the
best recorded ``ok`` figure of the objective among the space's points; median and max over seeds; ">N" when a
seed never found it), GPU-hours (recorded) spent up to it, and the runs that ran out of memory (median).

    python bench/search_efficiency.py --replay [--seeds 5] [--budget 30] [--agents grid guided] [--screen on off]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
from gymnasium import spaces

from dse.agents.base import load_agents, make_agent
from dse.forecast import Screen, model_forecaster
from dse.perfmodel.twin import make_twin, valid_trials
from dse.rules.space import load_space
from dse.study.loop import agent_settings, space_options

REPLAYS = tuple(str(p) for p in sorted((Path(__file__).parent / "data").glob("*/replay_space.toml")))
SPACES = ("conf/spaces/llama3_405b_space.toml", "conf/spaces/llama3_70b_space.toml", "conf/spaces/llama3_8b_space.toml")
AGENTS = {
    "grid": ("grid", {}),
    "random": ("random", {}),
    "tpe": ("optuna", {"warm_start": "none"}),
    "tpe+warm": ("optuna", {"warm_start": "model"}),
    # TPE with a joint density over the knobs ([search.options] tpe_multivariate = true)
    "tpe+mv": ("optuna", {"warm_start": "none", "tpe_multivariate": True}),
    "guided": ("guided", {}),
    "policy": ("policy", {}),  # its policy file is trained per space in main() (POLICY_FILES)
}
POLICY_FILES: dict[str, str] = {}  # space name -> the policy trained on its twins 1000..


def screened_keys(space, keys, trials) -> set:
    """The points the memory screen removes (the space's margin, the screen on whatever the space says)."""
    screen = Screen(space.model_copy(update={"search": space.search.model_copy(update={"screen": "memory"})}))
    return {k for k, t in zip(keys, trials) if screen.point(t).screened}


def search(space, agent_key, twin_table, seed, budget, forecast, screened=frozenset()):
    """Run one agent against a twin; the list of (reward-or-None, gpu_hours, oom) per launched run. A point in
    ``screened`` is shown to the agent as the study shows it (a failure, status ``screened``) and not run."""
    name, extra = AGENTS[agent_key]
    act = spaces.Dict(OrderedDict((k, spaces.Discrete(len(v))) for k, v in space.knobs.items()))
    registry = load_agents()
    opts = space_options(space, name, agent_settings(space, name, None, registry), registry)
    opts.update(extra)
    if name == "policy":
        opts["policy"] = POLICY_FILES[space.name]
    if not screened and "screen_margin" in opts:
        opts["screen_margin"] = None  # the screen off: the guided agent ranks every valid point
    names = space.knob_names

    def mask(action):
        return tuple(int(action[n]) for n in names) in twin_table

    agent = make_agent(name, registry, act, seed=seed, action_mask=mask, forecast=forecast, **opts)
    runs = []
    fail = space.objective.failed_reward
    sense = space.objective.sense
    metric = space.objective.metric
    while len(runs) < budget:
        action = agent.propose()
        if action is None:
            break
        key = tuple(int(action[n]) for n in names)
        row = twin_table.get(key)
        if row is None:
            agent.observe(action, fail, False, status="rejected", metrics={})
            continue
        if key in screened:
            agent.observe(action, fail, False, status="screened", metrics={})
            continue
        pred, gpu_hours = row
        if pred.fits:
            value = getattr(pred, metric)
            reward = value if sense == "maximize" else -value
            agent.observe(
                action, reward, True, status="ok", metrics={"peak_memory_gib": pred.peak_memory_gib, metric: value}
            )
            runs.append((reward, gpu_hours, False))
        else:
            agent.observe(action, fail, False, status="oom", metrics={})
            runs.append((None, gpu_hours, True))
    return runs, getattr(agent, "stop_reason", None)


def default_agents() -> list[str]:
    """Every agent, the policy agent only where its extra (Stable-Baselines3) is installed."""
    from dse.rl.policy import available

    return [a for a in AGENTS if a != "policy" or available()]


def train_policy_for(space, path: str, steps: int, twins: int) -> None:
    """Train the policy agent's policy on twins 1000.. of ``space`` (once per space), as dse train-policy does."""
    import os
    import tempfile

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as dse train-policy: torch's small MLP is faster on one thread
    from dse.rl.training import train_policy

    t0 = time.perf_counter()
    out = Path(tempfile.mkdtemp(prefix="dse-policy-")) / f"{space.name}.safetensors"
    done = train_policy(path, out, twins=twins, steps=steps)
    POLICY_FILES[space.name] = str(done.path)
    print(
        f"(policy for {space.name}: {steps:,} PPO steps on twins {done.twins[0]}..{done.twins[-1]}, "
        f"{time.perf_counter() - t0:.0f} s)",
        flush=True,
    )


def replay_best(space) -> float:
    """The best recorded ``ok`` reward of the objective among ``space``'s points in its replay table."""
    from dse.backends.replay import read_table
    from dse.rules.trial import resolve

    table = read_table(space.backend.replay, varied=space.knob_names, gpu=space.system.gpu)
    points = {table.key(resolve(space, p)) for p in space.points()}
    sign = 1 if space.objective.sense == "maximize" else -1
    metric = space.objective.metric
    values = [
        sign * getattr(o, metric)
        for key, o in table.rows.items()
        if o.status == "ok" and getattr(o, metric, None) is not None and key in points
    ]
    if not values:
        raise SystemExit(f"{space.source}: no recorded ok run of the objective's metric {metric} among its points")
    return max(values)


def replay_search(space, agent_key: str, screen: str, seed: int, budget: int, best: float) -> tuple[float, float, int]:
    """One agent's study of a replay space through dse run's loop: (launched runs to the measured best, or inf;
    recorded GPU-hours up to it; runs out of memory)."""
    import csv
    import tempfile

    from dse.study.loop import Request, run_study

    name, extra = AGENTS[agent_key]
    search_ = space.search.model_copy(update={"screen": "memory" if screen == "on" else "none", "options": extra})
    sp = space.model_copy(update={"search": search_})
    sign = 1 if space.objective.sense == "maximize" else -1
    with tempfile.TemporaryDirectory(prefix="dse-replay-") as tmp:
        run_study(sp, Request(out_dir=Path(tmp) / "study", agent=name, seed=seed, trials=budget))
        with open(Path(tmp) / "study" / "leaderboard.csv", newline="") as fh:
            rows = sorted(csv.DictReader(fh), key=lambda r: int(r["trial"]))
    launched = [r for r in rows if r["status"] not in ("rejected", "screened")]
    hours, ooms = 0.0, sum(r["status"] == "oom" for r in launched)
    for i, r in enumerate(launched, 1):
        hours += float(r["gpu_hours"] or 0.0)
        value = r.get(space.objective.metric) or ""
        if r["status"] == "ok" and value and sign * float(value) >= best * (1 - 1e-9 if best > 0 else 1 + 1e-9):
            return i, hours, ooms
    return math.inf, math.inf, ooms


def replay_main(args) -> None:
    """``--replay``: every agent on the replay spaces, launched runs to the measured best."""
    t0 = time.perf_counter()
    agents = [a for a in args.agents if a != "policy"]  # a policy is trained on twins, not on a replay
    print(
        "| replayed study | agent | screen | runs to the measured best (median) | max | GPU-h to it (median) | OOM runs (median) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for path in args.replay or REPLAYS:
        space = load_space(path)
        best = replay_best(space)
        for a in agents:
            for sc in args.screen:
                got = [replay_search(space, a, sc, seed, args.budget, best) for seed in range(args.seeds)]
                runs = [g[0] for g in got]

                def show(x: float, fmt: str = "{:.0f}") -> str:
                    return f">{args.budget}" if math.isinf(x) else fmt.format(x)

                print(
                    f"| {space.name} | {a} | {sc} | {show(float(np.median(runs)))} | {show(max(runs))} | "
                    f"{show(float(np.median([g[1] for g in got])), '{:.3f}')} | "
                    f"{np.median([g[2] for g in got]):.0f} |",
                    flush=True,
                )
    print(f"\nmeasured: replayed real runs; {args.seeds} seeds, budget {args.budget}; {time.perf_counter() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spaces", nargs="+", default=list(SPACES))
    ap.add_argument("--seeds", type=int, default=20, help="twin seeds per space (0..N-1)")
    ap.add_argument("--budget", type=int, default=150, help="launched runs per search")
    ap.add_argument("--agents", nargs="+", default=default_agents(), choices=list(AGENTS))
    ap.add_argument("--policy-steps", type=int, default=60_000, help="PPO steps training the policy agent's policy")
    ap.add_argument("--policy-twins", type=int, default=8, help="twins (seeds 1000..) the policy trains on")
    ap.add_argument("--screen", nargs="+", default=["on", "off"], choices=["on", "off"], help="the memory screen")
    ap.add_argument("--replay", nargs="*", default=None, help="judge the agents on replayed real studies (spaces)")
    args = ap.parse_args()
    if args.replay is not None:
        replay_main(args)
        return
    t0 = time.perf_counter()
    print(
        "| space | agent | screen | runs to 99% median | p90 | GPU-h to 99% median | best@10 | best@25 | OOM share |"
        " guided stopped after (median) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in args.spaces:
        space = load_space(path)
        trials = valid_trials(space)
        names = space.knob_names
        keys = [tuple(space.knobs[n].index(t.values[n]) for n in names) for t in trials]
        forecast = model_forecaster(space)
        startup = space.system.startup_s
        runs_of = [(a, sc) for a in args.agents for sc in args.screen]
        results = {r: [] for r in runs_of}
        screened = screened_keys(space, keys, trials)
        if "policy" in args.agents:
            train_policy_for(space, path, args.policy_steps, args.policy_twins)
        for tseed in range(args.seeds):
            twin = make_twin(space, tseed, trials=trials)
            table = {}
            for k, t in zip(keys, trials):
                p = twin.predict(t, flops_convention=space.backend.flops_convention)
                steps = t.values["max_steps"] if p.fits else 0
                table[k] = (p, t.num_gpus * (p.step_time_s * steps + startup) / 3600.0)
            sense = space.objective.sense
            rewards = [
                (getattr(p, space.objective.metric) * (1 if sense == "maximize" else -1))
                for p, _ in table.values()
                if p.fits
            ]
            best = max(rewards)
            for a, sc in runs_of:
                runs, stop = search(space, a, table, tseed, args.budget, forecast, screened if sc == "on" else set())
                results[a, sc].append((runs, best, stop))
        for a, sc in runs_of:
            to99, gpuh, at10, at25, ooms, stops = [], [], [], [], [], []
            for runs, best, _stop in results[a, sc]:
                # fraction of the best: rewards are positive rates, or negated step times
                def frac(r, best=best):
                    return r / best if best > 0 else best / r

                found, n99, h, hsum = -math.inf, None, None, 0.0
                curve = []
                for i, (r, gh, _) in enumerate(runs, 1):
                    hsum += gh
                    if r is not None:
                        found = max(found, r)
                    curve.append(frac(found) if found > -math.inf else 0.0)
                    if n99 is None and found > -math.inf and frac(found) >= 0.99:
                        n99, h = i, hsum
                to99.append(n99 if n99 is not None else math.inf)
                gpuh.append(h if h is not None else math.inf)
                at10.append(curve[min(9, len(curve) - 1)] if curve else 0.0)
                at25.append(curve[min(24, len(curve) - 1)] if curve else 0.0)
                ooms.append(sum(o for *_, o in runs) / max(len(runs), 1))
                stops.append(len(runs))

            def show(x, fmt="{:.0f}"):
                return (f">{args.budget}" if fmt == "{:.0f}" else "n/a") if math.isinf(x) else fmt.format(x)

            med = float(np.median(to99))
            p90 = float(np.percentile(to99, 90, method="higher"))
            print(
                f"| {space.name} | {a} | {sc} | {show(med)} | {show(p90)} | {show(float(np.median(gpuh)), '{:,.0f}')} | "
                f"{np.median(at10):.3f} | {np.median(at25):.3f} | {100 * np.mean(ooms):.0f}% | "
                f"{np.median(stops):.0f} |"
                if a == "guided"
                else f"| {space.name} | {a} | {sc} | {show(med)} | {show(p90)} | {show(float(np.median(gpuh)), '{:,.0f}')} | "
                f"{np.median(at10):.3f} | {np.median(at25):.3f} | {100 * np.mean(ooms):.0f}% | |",
                flush=True,
            )
    print(f"\n{args.seeds} twin seeds per space, budget {args.budget} launched runs; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
