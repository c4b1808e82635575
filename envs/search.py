"""``dse/Recipe-v0``: the registered Gymnasium environment (one episode = one search), and its vector form over twins.

``import dse.envs`` registers it (``import dse`` alone does not: the controller's import stays light)::

    import gymnasium as gym
    import dse.envs  # registers dse/Recipe-v0

    env = gym.make("dse/Recipe-v0", space="conf/spaces/llama3_8b_space.toml", backend="sim", twin_seed=3, budget=30)
    vec = gym.make_vec("dse/Recipe-v0", num_envs=8, space="conf/spaces/llama3_8b_space.toml")  # twins 0..7

The game itself (action, observation, reward, ``terminated`` and ``truncated``) is :class:`dse.rl.searchgame.SearchGame`.
Its truth here is one of:

* a **twin** of the space (``backend="sim"`` with ``twin_seed``, or a space whose ``[backend] truth = "twin"``): in
  memory by default (``in_memory=True``): the simulated backend's log is written into a string and parsed, so each
  point gives exactly the figures a ``dse run`` on that twin records, without a run directory (the figures of a point
  are computed once per environment). ``in_memory=False`` runs each point through :class:`RecipeEnv` and the
  backend, logs on disk under ``out_dir``;
* the **model** itself (``backend="sim"`` on a space with ``truth = "exact"`` and no twin seed);
* a **replay** of a finished study (``backend="replay"`` on a space with ``[backend] replay = PATH``): the recorded
  outcome of each point, through :class:`RecipeEnv` and the replay backend (logs in ``out_dir``, each point run once
  per environment); the game's points are the valid points the table holds, and its best is the best recorded;
* any other backend of the registry (``local``, ``slurm``) through :class:`RecipeEnv`: real runs, in ``out_dir``.

The vector form (``gym.make_vec``; sub-environment ``i`` is the twin of seed ``twin_seed + i``) shares the space's
table of valid points and forecasts between its sub-environments.

Every argument is checked before the space's table is built (:func:`check_args`): a wrong type is a ``TypeError``,
a value out of range a ``ValueError``, each naming the argument and what it takes (the game's own arguments:
:func:`dse.rl.searchgame.game_args`).
"""

from __future__ import annotations

import io
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import gymnasium as gym

from dse import registry as reg
from dse.backends.base import Backend
from dse.envs.recipe_env import RecipeEnv
from dse.errors import UserError
from dse.execute import parse_context
from dse.logs.parse import parse_log
from dse.perfmodel import predict
from dse.perfmodel.calibrate import calibrated_params
from dse.perfmodel.simulate import simulate
from dse.perfmodel.twin import Twin, make_twin, valid_trials
from dse.recipes.sim.logwriter import write_log
from dse.rl.searchgame import Forecast, Key, Outcome, SearchGame, check_int, game_args
from dse.rules.space import WALK_LIMIT, Space, load_space
from dse.rules.trial import TrialConfig

ENV_ID = "dse/Recipe-v0"
MAX_SEED = 2**32 - 1  # a twin's seed and the jitter's, as [backend] twin_seed: unsigned 32-bit
MAX_ENVS = 1024  # sub-environments of the vector form: each keeps its twin's outcome of every valid point in memory


@dataclass(frozen=True)
class Table:
    """A space's valid points (keys: one value index per knob, in the space file's order), resolved, and the
    model's forecast of each: what every environment of the space shares."""

    space: Space
    keys: list[Key]
    trials: list[TrialConfig]
    forecasts: dict[Key, Forecast]

    @property
    def sizes(self) -> list[int]:
        return [len(self.space.knobs[n]) for n in self.space.knob_names]


def as_space(space: Space | str | Path) -> Space:
    """A :class:`Space`, or the path of a space file (a shipped one found by its ``conf/spaces/...`` path)."""
    if not isinstance(space, Space | str | Path):
        raise TypeError(f"space takes a dse.rules.space.Space or the path of a space file; got {type(space).__name__}")
    return space if isinstance(space, Space) else load_space(space)


def check_args(
    *,
    backend: Any = "sim",
    twin_seed: Any = None,
    budget: Any = 50,
    in_memory: Any = True,
    out_dir: Any = None,
    seed: Any = 0,
    **options: Any,
) -> dict[str, Any]:
    """:func:`make_env`'s arguments checked (the game's in :func:`dse.rl.searchgame.game_args`); the game's, normalised."""
    if not isinstance(backend, str):
        raise TypeError(f"backend takes a backend's name (sim, local, slurm); got {backend!r}")
    if twin_seed is not None:
        check_int("twin_seed", twin_seed, 0, MAX_SEED)
    check_int("seed", seed, 0, MAX_SEED)
    if not isinstance(in_memory, bool):
        raise TypeError(f"in_memory takes True or False; got {in_memory!r} ({type(in_memory).__name__})")
    if out_dir is not None and not isinstance(out_dir, str | Path):
        raise TypeError(f"out_dir takes a directory's path or None; got {type(out_dir).__name__}")
    unknown = sorted(set(options) - {"target", "run_cost", "waste_cost"})
    if unknown:
        raise TypeError(f"dse/Recipe-v0 takes no argument {unknown[0]!r}; the game's: target, run_cost, waste_cost")
    return game_args(budget, **options)


def table(space: Space) -> Table:
    """Every valid point of ``space`` and the model's forecast of each (the space must be small enough to walk)."""
    if space.size > WALK_LIMIT:
        raise UserError(
            f"the environment walks every point; this space has {space.size:,} raw points (at most {WALK_LIMIT:,})",
            field="space",
        )
    trials = valid_trials(space)
    names = space.knob_names
    keys = [tuple(space.knobs[n].index(t.values[n]) for n in names) for t in trials]
    metric, sense = space.objective.metric, space.objective.sense
    params = calibrated_params(space.backend.calibration)
    forecasts = {}
    for k, t in zip(keys, trials):
        p = predict(t, flops_convention=space.backend.flops_convention, params=params)
        value = float(getattr(p, metric))
        forecasts[k] = Forecast(value if sense == "maximize" else -value, p.peak_memory_gib, p.gpu_memory_gib)
    return Table(space, keys, trials, forecasts)


def signed(space: Space, value: float | None) -> float | None:
    """A metric's value as a reward: negated when the objective minimises it (as :mod:`dse.reward` signs it)."""
    if value is None:
        return None
    return float(value) if space.objective.sense == "maximize" else -float(value)


def simulated_outcome(space: Space, trial: TrialConfig, twin: Twin | None, seed: int = 0) -> Outcome:
    """The outcome ``dse run`` records for ``trial`` on the simulated backend (``twin``'s truth, or the model's when
    None): its log written into memory and parsed as the study parses it, with the same seed and context."""
    settings = space.backend
    run = simulate(trial, seed, flops_convention=settings.flops_convention, twin=twin)
    buf = io.StringIO()
    code = write_log(run, buf)
    metrics = parse_log(buf.getvalue().splitlines(), exit_code=code, context=parse_context(trial, settings))
    # the run's wall time as the simulated backend reports it (start-up, then the steps until the end or the OOM)
    wall = space.system.startup_s + (run.oom_after if run.oom else run.max_steps) * run.step_time_s
    return Outcome(
        metrics.status,
        signed(space, getattr(metrics, space.objective.metric)) if metrics.ok else None,
        metrics.peak_memory_gib,
        {**metrics.to_dict(), "wall_s": wall, "gpu_hours": trial.num_gpus * wall / 3600.0},
    )


class InMemoryTruth:
    """``key -> Outcome`` on the simulated backend, computed once per point (a class, not a closure: the
    environment pickles, as an async vector environment needs)."""

    def __init__(self, tab: Table, twin: Twin | None, seed: int = 0):
        self.space, self.twin, self.seed = tab.space, twin, seed
        self.by_key = dict(zip(tab.keys, tab.trials))
        self.outcomes: dict[Key, Outcome] = {}

    def __call__(self, key: Key) -> Outcome:
        if key not in self.outcomes:
            self.outcomes[key] = simulated_outcome(self.space, self.by_key[key], self.twin, self.seed)
        return self.outcomes[key]


def in_memory_truth(tab: Table, twin: Twin | None, seed: int = 0) -> Callable[[Key], Outcome]:
    """``key -> Outcome`` on the simulated backend, computed once per point."""
    return InMemoryTruth(tab, twin, seed)


@dataclass(frozen=True)
class TwinDraw:
    """The game's redraw on a twin: ``twin_seed -> (truth, best)`` for the twin of that seed (in memory);
    ``seeds``: the range (inclusive) a reset's seed draws a twin seed from (a split of the suite)."""

    tab: Table
    seed: int = 0
    seeds: tuple[int, int] = (0, MAX_SEED)

    def __call__(self, twin_seed: int) -> tuple[Callable[[Key], Outcome], float | None]:
        twin = make_twin(self.tab.space, twin_seed, trials=self.tab.trials)
        return InMemoryTruth(self.tab, twin, self.seed), twin_best(self.tab.space, self.tab, twin)


def backend_truth(space: Space, backend: Backend, out_dir: Path, seed: int = 0) -> Callable[[Key], Outcome]:
    """``key -> Outcome`` by running the point through :class:`RecipeEnv` on ``backend`` (run directories in
    ``out_dir/trials``; logs on disk, parsed as a study parses them)."""
    env = RecipeEnv(space, backend, out_dir)
    env.reset(seed=seed)
    names = space.knob_names

    def truth(key: Key) -> Outcome:
        _, _, _, _, info = env.step(dict(zip(names, key)))
        m = info["metrics"]
        reward = signed(space, m.get(space.objective.metric)) if info["status"] == "ok" else None
        wall = m.get("wall_s")
        hours = info["num_gpus"] * wall / 3600.0 if info["launched"] and wall is not None else None
        return Outcome(
            info["status"], reward, m.get("peak_memory_gib"), {"status": info["status"], **m, "gpu_hours": hours}
        )

    return truth


def twin_best(space: Space, tab: Table, twin: Twin) -> float | None:
    """The twin's best reward over the valid points (its own figures, as ``bench/search_efficiency.py`` takes it)."""
    sign = 1.0 if space.objective.sense == "maximize" else -1.0
    values = []
    for t in tab.trials:
        p = twin.predict(t, flops_convention=space.backend.flops_convention)
        if p.fits:
            values.append(sign * float(getattr(p, space.objective.metric)))
    return max(values, default=None)


def replay_parts(
    space: Space, tab: Table, out_dir: Path, seed: int = 0
) -> tuple[Table, Callable[[Key], Outcome], float]:
    """A replay's game parts: the valid points its table holds (the others are refused before launch, so the game
    treats them as rejected), the truth (each point replayed once, through :class:`RecipeEnv` as a study runs it)
    and the best recorded reward among them."""
    from dse.backends.replay import ReplayBackend

    backend = ReplayBackend.from_space(space, seed=seed)
    held = [(k, t) for k, t in zip(tab.keys, tab.trials) if backend.refusal(t) is None]
    if not held:
        raise UserError("the replayed study holds none of the space's valid points", field="backend.replay")
    sub = Table(space, [k for k, _ in held], [t for _, t in held], {k: tab.forecasts[k] for k, _ in held})
    truth = cache(backend_truth(space, backend, out_dir, seed))
    rewards = [o.reward for o in map(truth, sub.keys) if o.reward is not None]
    if not rewards:
        raise UserError("the replayed study has no ok run among the space's points", field="backend.replay")
    return sub, truth, max(rewards)


def _game(
    tab: Table, truth: Callable[[Key], Outcome], best: float | None, budget: int, options: dict[str, Any], **kw: Any
) -> SearchGame:
    s = tab.space
    game = SearchGame(s.knob_names, tab.sizes, tab.forecasts, truth, budget=budget, best=best, **options, **kw)
    game.table = tab  # the space's points, resolved: what the suite's shared encoding reads
    return game


def make_env(
    space: Space | str | Path,
    backend: str = "sim",
    *,
    twin_seed: int | None = None,
    budget: int = 50,
    in_memory: bool = True,
    out_dir: str | Path | None = None,
    seed: int = 0,
    table_: Table | None = None,
    twin_range: tuple[int, int] = (0, MAX_SEED),
    **options: Any,
) -> SearchGame:
    """The entry point of ``dse/Recipe-v0`` (see the module docstring). ``options``: the game's ``target``,
    ``run_cost``, ``waste_cost``; ``twin_range``: the twin seeds a reset's seed draws from (inclusive)."""
    args = check_args(
        backend=backend, twin_seed=twin_seed, budget=budget, in_memory=in_memory, out_dir=out_dir, seed=seed, **options
    )
    budget, options = args.pop("budget"), args
    if not isinstance(twin_range, tuple | list) or len(twin_range) != 2:
        raise TypeError(f"twin_range takes (first, last) twin seeds; got {twin_range!r}")
    lo = check_int("twin_range[0]", twin_range[0], 0, MAX_SEED)
    twin_range = (lo, check_int("twin_range[1]", twin_range[1], lo, MAX_SEED))
    s = as_space(space)
    if twin_seed is None and backend == "sim" and s.backend.truth == "twin":
        twin_seed = s.backend.twin_seed
    if twin_seed is not None and backend != "sim":
        raise UserError(f"a twin is the simulated backend's truth; got backend {backend!r}", field="twin_seed")
    tab = table_ or table(s)
    twin = make_twin(s, twin_seed, trials=tab.trials) if twin_seed is not None else None
    best = twin_best(s, tab, twin) if twin is not None else None
    if backend == "sim" and in_memory:
        redraw = TwinDraw(tab, seed, twin_range) if twin is not None else None
        return _game(tab, in_memory_truth(tab, twin, seed), best, budget, options, redraw=redraw, twin_seed=twin_seed)
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="dse-env-"))
    try:
        game = _disk_game(s, tab, backend, twin, best, out, seed, budget, options)
    except BaseException:
        if out_dir is None:
            shutil.rmtree(out, ignore_errors=True)
        raise
    if out_dir is None and backend in ("sim", "replay"):
        # the logs of a simulated or replayed game no one asked to keep: gone when it is closed, collected or the
        # process exits (tests and benchmarks make many such games); a real backend's runs keep theirs
        game.scratch = out
        weakref.finalize(game, shutil.rmtree, out, ignore_errors=True)
    return game


def _disk_game(
    s: Space,
    tab: Table,
    backend: str,
    twin: Twin | None,
    best: float | None,
    out: Path,
    seed: int,
    budget: int,
    options: dict[str, Any],
) -> SearchGame:
    """A game whose runs write their logs under ``out`` and are parsed from there: a replay, the simulated backend
    on disk, or another registered backend."""
    if backend == "replay":
        sub, truth, best = replay_parts(s, tab, out, seed)
        return _game(sub, truth, best, budget, options)
    if backend == "sim":
        from dse.backends.sim import SimBackend

        b: Backend = SimBackend(
            seed=seed, flops_convention=s.backend.flops_convention, twin=twin, startup_s=s.system.startup_s
        )
    else:
        b = reg.get(reg.load(reg.BACKENDS), backend, Backend, group=reg.BACKENDS, field="backend").from_space(
            s, seed=seed
        )
    return _game(tab, backend_truth(s, b, out, seed), best, budget, options)


def make_vec(
    num_envs: int, space: Space | str | Path, *, twin_seed: int = 0, twin_seeds: Sequence[int] | None = None, **kw: Any
) -> gym.vector.SyncVectorEnv:
    """The vector entry point of ``dse/Recipe-v0``: ``num_envs`` sub-environments, the i-th on the twin of seed
    ``twin_seed + i`` (or ``twin_seeds[i]``), sharing one table of the space."""
    check_int("num_envs", num_envs, 1, MAX_ENVS)
    if twin_seeds is None:
        check_int("twin_seed", twin_seed, 0, MAX_SEED - num_envs + 1)  # the last sub-environment's too
        seeds = [twin_seed + i for i in range(num_envs)]
    else:
        seeds = [check_int("twin_seeds[]", ts, 0, MAX_SEED) for ts in twin_seeds]
    if len(seeds) != num_envs:
        raise ValueError(f"twin_seeds has {len(seeds)} seeds for num_envs={num_envs}; give one per environment")
    check_args(**kw)  # before the table is built, as make_env does
    s = as_space(space)
    tab = table(s)

    def one(ts: int) -> Callable[[], SearchGame]:
        return lambda: make_env(s, "sim", twin_seed=ts, table_=tab, **kw)

    return gym.vector.SyncVectorEnv([one(ts) for ts in seeds])


def register() -> None:
    """Register ``dse/Recipe-v0`` with Gymnasium (idempotent: once per process)."""
    if ENV_ID not in gym.registry:
        # entry points as strings: the spec serialises (Minari keeps it with a dataset, to recover the environment)
        gym.register(ENV_ID, entry_point=f"{__name__}:make_env", vector_entry_point=f"{__name__}:make_vec")
