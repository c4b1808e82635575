"""``dse bench-agents``: the agent leaderboard. Every registered agent searches the twins of each benchmark through
the environment itself (:class:`dse.rl.searchgame.SearchGame`, ``dse/Recipe-v0``), and is scored by runs to 99% of
the twin's true best and the GPU-hours spent until then, with 95% bootstrap intervals.

One episode: an agent (built as a study builds it, with the environment's forecasts and its rules as the mask) on
one twin, with one seed (the agent's seed; for the ``policy`` agent, the policy file of one training seed). Each of
its proposals is one ``step`` of the environment, which charges what it charges: a refused proposal (a point the
rules reject, or a point already run) launches nothing and costs no run, but it counts against the episode's
``4 x budget`` proposals; a launched run costs its simulated GPU-hours (``info["gpu_hours"]``); the agent's own stop
ends the episode (the ``stop`` action). The episode is scored when the best found first reaches ``target`` (99%)
of the twin's true best (``info["solved"]``): the launched runs and the GPU-hours so far. An episode that ends
(budget spent, proposals spent, the agent stopped) without reaching it is censored: its runs count as
``budget + 1`` and its GPU-hours as infinite, so a median or 90th percentile above the budget reads ``>budget``.

The intervals: scipy's percentile bootstrap (``scipy.stats.bootstrap``, 2,000 resamples, seeded) of each statistic
over the episodes of a benchmark and agent, i.e. over twins and seeds together (every (twin, seed) pair is one
draw). Nothing here is a real run: every figure is measured on simulated twins.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dse.errors import UserError
from dse.rl.searchgame import DEFAULT_BUDGET, STOP, CachedDraw, SearchGame, action_of
from dse.rules.space import Space

# name shown -> (registered agent, options beyond the space's): as bench/search_efficiency.py names them
AGENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "grid": ("grid", {}),
    "random": ("random", {}),
    "tpe": ("optuna", {"warm_start": "none"}),
    "guided": ("guided", {}),
    "policy": ("policy", {}),
}
DEFAULT_AGENTS = ("grid", "random", "tpe", "guided")  # and "policy" when policy files are given
# Bounds of the inputs: a typo cannot start a run of days. Episodes are twins x seeds per benchmark and agent.
MAX_TWINS = 200
MAX_SEEDS = 20
MAX_BUDGET = 1_000
MAX_POLICIES = MAX_SEEDS
RESAMPLES = 2_000
CONFIDENCE = 0.95
NOT_REACHED_HOURS = math.inf
COLUMNS = (
    "benchmark",
    "agent",
    "episodes",
    "twins",
    "seeds",
    "budget",
    "solved_share",
    "runs_to_99_median",
    "runs_to_99_median_lo",
    "runs_to_99_median_hi",
    "runs_to_99_p90",
    "runs_to_99_p90_lo",
    "runs_to_99_p90_hi",
    "gpu_hours_to_99_median",
    "gpu_hours_to_99_median_lo",
    "gpu_hours_to_99_median_hi",
    "refused_median",
    "truth",
)
TRUTH = "simulated twins"  # what a twin benchmark's figures are measured on
REPLAY_TRUTH = "replayed real runs"  # a replay's: the recorded outcome of each point (its target: the best measured)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the leaderboard: an id, how to make its environment (``make(budget)``; None: the
    benchmark's own budget), the twins (seeds) it is judged on (empty for a replay: one truth), and what it holds out
    (the suite's ``held_out``: None for a training space)."""

    id: str
    make: Callable[[int | None], SearchGame]
    twins: tuple[int, ...]
    held_out: str | None = None


def space_benchmark(space: Space, twins: int) -> Benchmark:
    """A space file as a benchmark of its own: twins 0..``twins``-1 (what ``--space`` runs)."""
    from dse.envs.search import make_env, table

    def make(budget: int | None) -> SearchGame:
        return make_env(space, "sim", twin_seed=0, budget=budget or DEFAULT_BUDGET, table_=table(space))

    return Benchmark(space.name, make, tuple(range(twins)))


def suite_benchmarks(split: str, twins: int, ids: Sequence[str] = (), held_out_only: bool = False) -> list[Benchmark]:
    """The suite's benchmarks of ``split`` (:func:`dse.envs.suite.benchmarks`), each judged on the first ``twins``
    twins of the split (a replay: its one truth); ``ids``: only these (a one-line error for an unknown one)."""
    from dse.envs import suite

    known = suite.benchmarks(split)
    unknown = [i for i in ids if i not in {b.id for b in known}]
    if unknown:
        raise UserError(
            f"no benchmark {unknown[0]!r} in the {split} split; its ids: {', '.join(b.id for b in known)}",
            param="benchmark",
        )
    out = []
    for b in known:
        if (ids and b.id not in ids) or (held_out_only and b.held_out is None):
            continue
        rng = b.twin_range(split)

        def make(budget: int | None, b: Any = b) -> SearchGame:
            return suite.make_benchmark(b.id, split, **({"budget": budget} if budget else {}))

        seeds = () if rng is None else tuple(range(rng[0], min(rng[0] + twins, rng[1] + 1)))
        out.append(Benchmark(b.id, make, seeds, b.held_out))
    return out


@dataclass(frozen=True)
class Episode:
    """One agent's search of one twin: runs and GPU-hours to the target (None: not reached), what it spent."""

    benchmark: str
    agent: str
    twin: int | None  # None: a replay's one truth
    seed: int
    runs_to_target: int | None
    gpu_hours_to_target: float | None
    runs: int
    proposals: int
    refused: int
    gpu_hours: float
    best_of_true: float | None
    end: str  # "solved", "stopped" (the agent), "budget" (runs or proposals spent), "exhausted" (every point run)
    budget: int = DEFAULT_BUDGET  # the episode's launched runs


@dataclass(frozen=True)
class Row:
    """One line of the leaderboard (:data:`COLUMNS`)."""

    benchmark: str
    agent: str
    episodes: int
    twins: int
    seeds: int
    budget: int
    solved_share: float
    runs_to_99_median: float
    runs_to_99_median_lo: float
    runs_to_99_median_hi: float
    runs_to_99_p90: float
    runs_to_99_p90_lo: float
    runs_to_99_p90_hi: float
    gpu_hours_to_99_median: float
    gpu_hours_to_99_median_lo: float
    gpu_hours_to_99_median_hi: float
    refused_median: float
    truth: str = TRUTH


@dataclass
class Settings:
    """What one leaderboard runs: agents (names of :data:`AGENTS`), agent seeds, the budget of launched runs, the
    target fraction of the true best, the policy files (one per training seed) for the ``policy`` agent."""

    agents: Sequence[str] = DEFAULT_AGENTS
    seeds: int = 1
    budget: int | None = None  # launched runs per episode; None: each benchmark's own
    target: float = 0.99
    policies: Sequence[Path] = ()
    resamples: int = RESAMPLES
    extra: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def check(settings: Settings, benchmarks: Sequence[Benchmark]) -> None:
    """Every input within its bound; a one-line error naming the option otherwise."""

    def bounded(name: str, value: Any, lo: int, hi: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise UserError(f"{value!r} is out of range; give an integer from {lo:,} to {hi:,}", param=name)

    bounded("seeds", settings.seeds, 1, MAX_SEEDS)
    if settings.budget is not None:
        bounded("budget", settings.budget, 1, MAX_BUDGET)
    if not benchmarks:
        raise UserError("no benchmark to run; name at least one", param="benchmark")
    for b in benchmarks:
        if b.twins:
            bounded("twins", len(b.twins), 1, MAX_TWINS)
    unknown = [a for a in settings.agents if a not in AGENTS]
    if unknown:
        raise UserError(f"no agent {unknown[0]!r}; the leaderboard's agents: {', '.join(AGENTS)}", param="agent")
    if not settings.agents:
        raise UserError("no agent to run; name at least one", param="agent")
    if len(settings.policies) > MAX_POLICIES:
        raise UserError(f"{len(settings.policies)} policy files; give at most {MAX_POLICIES}", param="policy")
    if "policy" in settings.agents and not settings.policies:
        raise UserError("the policy agent needs a policy file (--policy FILE, one per training seed)", param="policy")
    if not 0 < settings.target <= 1:
        raise UserError(f"{settings.target!r} is out of range; give a fraction above 0, at most 1", param="target")


def _agent(game: SearchGame, shown: str, seed: int, policy: Path | None, extra: Mapping[str, Any]) -> Any:
    """The agent ``shown`` (a name of :data:`AGENTS`) for ``game``'s space, built as a study builds it: the space's
    options, the model's forecast (the environment's own, for an agent that uses a model) and the rules as its
    mask. The memory screen is off: the environment has none (a point that runs out of memory is a launched run)."""
    from collections import OrderedDict

    from gymnasium import spaces

    from dse.agents.base import Forecast, load_agents, make_agent
    from dse.study.loop import agent_settings, space_options

    space: Space = game.table.space
    name, options = AGENTS[shown]
    registry = load_agents()
    opts = space_options(space, name, agent_settings(space, name, None, registry), registry)
    opts.update(options)
    opts.update(extra)
    if "screen_margin" in opts:
        opts["screen_margin"] = None
    if policy is not None:
        opts["policy"] = str(policy)
        opts.pop("space_fingerprint", None)  # a suite's policy acts on every space (its encoding is any space's)
    names = game.names
    act = spaces.Dict(OrderedDict((n, spaces.Discrete(k)) for n, k in zip(names, game.sizes)))
    forecasts = game.forecasts

    def forecast(action: Mapping[str, int]) -> Forecast | None:
        f = forecasts.get(tuple(int(action[n]) for n in names))
        return None if f is None else Forecast(f.reward, f.peak_memory_gib, f.memory_gib)

    def mask(action: Mapping[str, int]) -> bool:
        return tuple(int(action[n]) for n in names) in forecasts

    return make_agent(name, registry, act, seed=seed, action_mask=mask, forecast=forecast, **opts)


def play(game: SearchGame, agent: Any, benchmark: str, shown: str, twin: int | None, seed: int) -> Episode:
    """One episode of ``agent`` on twin ``twin`` of ``game`` (None: its one truth, a replay; see the module
    docstring)."""
    game.reset(options={"twin_seed": twin} if twin is not None else None)
    names = game.names
    failed = game.table.space.objective.failed_reward
    runs_to: int | None = None
    hours_to: float | None = None
    info: dict[str, Any] = {}
    hours, refused, end = 0.0, 0, "budget"
    while True:
        action = agent.propose()
        if action is None:
            _, _, _, _, info = game.step(action_of([0] * len(names), stop=True))
            end = "stopped"
            break
        key = tuple(int(action[n]) for n in names)
        _, _, terminated, truncated, info = game.step(action_of(key))
        status = info["status"]
        hours += info["gpu_hours"]
        refused += not info["launched"]
        ok = status == "ok" and info.get("reward") is not None
        metrics = dict(info["metrics"]) if info["launched"] else {}
        agent.observe(action, info["reward"] if ok else failed, ok, status=status, metrics=metrics)
        if info["solved"]:
            runs_to, hours_to, end = info["runs"], hours, "solved"
            break
        if terminated or truncated:
            end = "exhausted" if terminated else "budget"
            break
    assert info.get("status") != STOP or end == "stopped"
    return Episode(
        benchmark,
        shown,
        twin,
        seed,
        runs_to,
        hours_to,
        game.history.runs,
        game.proposals,
        refused,
        hours,
        info.get("of_true_best"),
        end,
        game.budget,
    )


def episodes(
    benchmarks: Sequence[Benchmark],
    settings: Settings,
    *,
    on_episode: Callable[[Episode], None] | None = None,
) -> list[Episode]:
    """Every agent's episodes on every benchmark's twins (twins x seeds; the policy agent: twins x policy files)."""
    check(settings, benchmarks)
    out: list[Episode] = []
    for b in benchmarks:
        game = b.make(settings.budget)
        game.target = settings.target
        if game.redraw is not None:
            game.redraw = CachedDraw(game.redraw)  # each twin built once, for every agent and seed
        for shown in settings.agents:
            runs: list[tuple[int, Path | None]] = (
                list(enumerate(settings.policies)) if shown == "policy" else [(s, None) for s in range(settings.seeds)]
            )
            for seed, policy in runs:
                for twin in b.twins or (None,):
                    agent = _agent(game, shown, seed, policy, settings.extra.get(shown, {}))
                    ep = play(game, agent, b.id, shown, twin, seed)
                    out.append(ep)
                    if on_episode is not None:
                        on_episode(ep)
    return out


def interval(values: Sequence[float], statistic: Callable[..., Any], resamples: int, seed: int) -> tuple[float, ...]:
    """``statistic`` of ``values`` and its 95% percentile-bootstrap interval (the value itself when all are equal or
    there is one)."""
    from scipy.stats import bootstrap

    x = np.asarray(values, dtype=float)
    point = float(statistic(x, axis=-1))
    if len(x) < 2 or np.all(x == x[0]):
        return point, point, point
    res = bootstrap(
        (x,),
        statistic,
        n_resamples=resamples,
        confidence_level=CONFIDENCE,
        method="percentile",
        random_state=np.random.default_rng(seed),
        vectorized=True,
    )
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


def _median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The median, the higher middle value for an even count: an unreached target is never averaged with a figure."""
    return np.percentile(x, 50, axis=axis, method="higher")


def _p90(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.percentile(x, 90, axis=axis, method="higher")


def rows(eps: Sequence[Episode], resamples: int = RESAMPLES) -> list[Row]:
    """The leaderboard: one row per benchmark and agent, in the order the episodes came."""
    groups: dict[tuple[str, str], list[Episode]] = {}
    for e in eps:
        groups.setdefault((e.benchmark, e.agent), []).append(e)
    out = []
    for i, ((bench, agent), group) in enumerate(groups.items()):
        budget = max(e.budget for e in group)
        censor = float(budget + 1)
        runs = [float(e.runs_to_target) if e.runs_to_target is not None else censor for e in group]
        big = 1e12  # an unreached target's GPU-hours: above every real figure, and finite for the bootstrap
        hours = [e.gpu_hours_to_target if e.gpu_hours_to_target is not None else big for e in group]
        med, med_lo, med_hi = interval(runs, _median, resamples, seed=i)
        p90, p90_lo, p90_hi = interval(runs, _p90, resamples, seed=i)
        h = [v if v < big / 2 else NOT_REACHED_HOURS for v in interval(hours, _median, resamples, seed=i)]
        out.append(
            Row(
                bench,
                agent,
                len(group),
                len({e.twin for e in group if e.twin is not None}) or 1,
                len({e.seed for e in group}),
                budget,
                sum(e.runs_to_target is not None for e in group) / len(group),
                med,
                med_lo,
                med_hi,
                p90,
                p90_lo,
                p90_hi,
                h[0],
                h[1],
                h[2],
                float(np.median([e.refused for e in group])),
                TRUTH if any(e.twin is not None for e in group) else REPLAY_TRUTH,
            )
        )
    return out


def to_csv(table: Sequence[Row]) -> str:
    """The leaderboard as CSV (:data:`COLUMNS`; a figure above the budget, the target not reached, as ``inf``)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in table:
        d = asdict(r)
        for k, v in d.items():
            if k.startswith("runs_to_99") and v > r.budget:
                d[k] = math.inf
            if isinstance(d[k], float) and math.isfinite(d[k]):
                d[k] = f"{d[k]:.6g}"
        w.writerow(d)
    return buf.getvalue()


def shown(value: float, budget: int | None, fmt: str = "{:.0f}") -> str:
    """A figure as the page shows it: ``>budget`` for runs when the target was not reached within the budget, "-"
    for GPU-hours then (``budget`` None)."""
    if math.isinf(value) or (budget is not None and value > budget):
        return f">{budget}" if budget is not None else "-"
    return fmt.format(value)


def to_markdown(table: Sequence[Row]) -> str:
    """The leaderboard as a Markdown table (each figure with its 95% interval in brackets)."""
    lines = [
        "| benchmark | agent | episodes | solved | runs to 99% (median [95% CI]) | p90 [95% CI] | "
        "GPU-h to 99% (median [95% CI]) | refused proposals (median) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in table:
        b = r.budget

        def ci(v: float, lo: float, hi: float, fmt: str = "{:.0f}", b: int | None = b) -> str:
            return f"{shown(v, b, fmt)} [{shown(lo, b, fmt)}, {shown(hi, b, fmt)}]"

        lines.append(
            f"| {r.benchmark} | {r.agent} | {r.episodes} | {100 * r.solved_share:.0f}% | "
            f"{ci(r.runs_to_99_median, r.runs_to_99_median_lo, r.runs_to_99_median_hi)} | "
            f"{ci(r.runs_to_99_p90, r.runs_to_99_p90_lo, r.runs_to_99_p90_hi)} | "
            f"{ci(r.gpu_hours_to_99_median, r.gpu_hours_to_99_median_lo, r.gpu_hours_to_99_median_hi, '{:,.1f}', None)} | "
            f"{r.refused_median:.0f} |"
        )
    return "\n".join(lines) + "\n"
