"""The search as a reinforcement-learning episode: one episode is one search of a space, one step one proposed point.

:class:`SearchGame` is the environment behind ``gym.make("dse/Recipe-v0")`` (registered by :mod:`dse.envs`), and
the one a learned policy is trained on (:mod:`dse.rl.policy`). Where :class:`dse.envs.RecipeEnv` is the study's
environment (its reward is one run's objective; it never ends by itself), the game is a whole search:

* **action**: ``MultiDiscrete(sizes + [2])``: one entry per knob the space varies (the index of its value in the
  space file), so that any library's policy (Stable-Baselines3's included) can emit it, and a last entry, ``stop``:
  1 ends the search there (the knob entries are then ignored and nothing is launched);
* **action mask** (:meth:`SearchGame.action_masks`, and ``info["action_mask"]``): one bool per point of the space,
  flattened in C order, then one for ``stop`` (always true): true where a step would launch a run;
* **observation**: a flat ``Box`` vector (:func:`features` names its entries): the last proposed point and the best
  point so far (indices scaled to 0..1), the last proposal's status (one-hot over :data:`GAME_STATUSES`: the run's
  statuses, ``rejected`` by the rules, and ``repeat`` for a point already run; "none" before the first step), its
  value and the best value as fractions of the model's best forecast over the space, the model's forecast for the
  last point (the same fraction; its peak memory as a fraction of the GPU's), the launched runs so far (/100, capped
  at 1) and the share of the budget spent, and the tried set: per knob value, the share of the space's valid points
  with that value already run (so the observation holds what the mask says, and a value's exhaustion);
* **reward**: the gain of the best value found (as that fraction of the model's forecast, known to the agent, never
  the truth's best) minus ``run_cost`` per launched run and ``waste_cost`` for a proposal that launched nothing (a
  point the rules reject, or one already run); ``stop`` is free: the return of an episode is the best found, less
  what finding it cost;
* **terminated**: the agent stops (the ``stop`` entry), or every valid point has run;
* **truncated**: the budget of launched runs is spent (the step that launches the last run says so), or
  ``4 x budget`` proposals were made. A step after the end is a ``RuntimeError``: nothing launches past the budget.

Nothing of the truth's best (an oracle, known only in simulation) enters the observation, the reward or the end of
an episode; ``info`` reports it for scoring (``of_true_best``: the best found as a fraction of the truth's best,
``solved``: within ``target`` of it; ``of_true_best`` is left out, and ``solved`` False, when unknown or nothing
ran yet).

Every entry of ``info`` keeps one type from step to step, so that Gymnasium's vector forms
(``gym.make_vec(..., vectorization_mode="sync" | "async")``) can batch it: a number that is not there is left out
(``reward`` of a proposal that gave no objective, ``of_true_best`` while unknown; ``info.get`` gives None, and a
vector form's ``_reward`` mask says which sub-environments have one), and ``metrics`` (the run's figures, whose
fields differ by outcome) is a read-only mapping (:class:`Figures`), batched as one object per sub-environment.

Arguments are checked where they enter (:func:`check_int`, :func:`check_number`): a wrong type is a ``TypeError``
and a value out of range a ``ValueError``, each naming the argument and what it takes. An action not in the action
space (not one integer per knob plus the stop entry, or an index out of range; a float, a bool or a complex number is
no index, however integral) is a ``ValueError`` from ``step``, never truncated or run, as Gymnasium's environments
refuse an action outside their action space.

The truth is a function ``key -> Outcome``: a twin's figures (:func:`dse.envs.twin_truth`, in memory), or a run on a
backend through :class:`dse.envs.RecipeEnv`. The forecast is the shipped model's, as a study hands it to agents.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dse.logs.parse import STATUSES, UNLAUNCHED_STATUSES

Key = tuple[int, ...]
RUN_SCALE = 100.0  # launched runs are observed as runs / RUN_SCALE, capped at 1
OBS_HIGH = 10.0  # fractions of the model's best above this are clipped (a twin is within tens of percent)
RUN_COST = 0.005  # the reward's cost of one launched run (a fraction of the model's best)
WASTE_COST = 0.01  # the reward's cost of a proposal that launched nothing (rejected, or already run)
MAX_BUDGET = 1_000_000  # launched runs per episode: ten times the points of the largest walkable space
DEFAULT_BUDGET = 50  # launched runs per episode unless told (dse train-policy's default too)
TARGET = 0.99  # info's ``solved``: the best found within 1% of the truth's best
REPEAT = "repeat"  # a proposal of a point already run: nothing launched (not ``rejected``: the rules accept it)
STOP = "stop"  # the status of the stop action's step
GAME_STATUSES = (*STATUSES, REPEAT)  # what the observation's status one-hot covers
_STATUS_INDEX = {s: i + 1 for i, s in enumerate(GAME_STATUSES)}  # 0 = no step yet


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as an int when it is an integer (a bool is not) from ``lo`` to ``hi``; else TypeError/ValueError."""
    allowed = f"{name} takes an integer from {lo:,} to {hi:,}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{allowed}; got {value!r} ({type(value).__name__})")
    if not lo <= value <= hi:
        raise ValueError(f"{allowed}; got {value!r}")
    return int(value)


def check_number(name: str, value: Any, lo: float, hi: float, *, above: bool = False) -> float:
    """``value`` as a float when it is a finite real number (a bool is not) from ``lo`` (excluded when ``above``)
    to ``hi``; else TypeError/ValueError."""
    allowed = (
        f"{name} takes a finite number {'above' if above else 'from'} {lo:g} {'and at most' if above else 'to'} {hi:g}"
    )
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{allowed}; got {value!r} ({type(value).__name__})")
    try:
        v = float(value)
    except OverflowError:  # an int too large for a float
        raise ValueError(f"{allowed}; got an integer of {len(str(value))} digits") from None
    if not math.isfinite(v) or v > hi or v < lo or (above and v == lo):
        raise ValueError(f"{allowed}; got {value!r}")
    return v


def game_args(budget: Any = 50, target: Any = TARGET, run_cost: Any = RUN_COST, waste_cost: Any = WASTE_COST) -> dict:
    """The game's arguments, checked (see the module docstring): ``budget`` launched runs (1 to 1,000,000), the stop
    rule's ``target`` fraction of the truth's best (above 0, at most 1), the costs per run and per wasted proposal
    (0 to :data:`OBS_HIGH`, the largest value an observation holds)."""
    return {
        "budget": check_int("budget", budget, 1, MAX_BUDGET),
        "target": check_number("target", target, 0.0, 1.0, above=True),
        "run_cost": check_number("run_cost", run_cost, 0.0, OBS_HIGH),
        "waste_cost": check_number("waste_cost", waste_cost, 0.0, OBS_HIGH),
    }


def action_key(action: Any, sizes: Sequence[int], space: Any = None) -> tuple[Key, bool]:
    """The point ``action`` selects and whether it stops, when it is in the ``MultiDiscrete(sizes + [2])`` action
    space: one integer per knob (a list or tuple of ints, or an integer array), each from 0 to its size - 1, then the
    stop entry (0 or 1). A ValueError otherwise (see the module docstring): nothing is truncated."""

    def refuse(why: str) -> ValueError:
        return ValueError(
            f"action {action!r} is not in the action space {space if space is not None else sizes}: {why}; give one "
            f"integer per knob ({len(sizes)}), the i-th from 0 to its number of values - 1, then stop (0 or 1)"
        )

    if isinstance(action, list | tuple):
        if any(isinstance(a, bool) or not isinstance(a, int | np.integer) for a in action):
            raise refuse("not all integers")
        values = [int(a) for a in action]
    elif isinstance(action, np.ndarray):
        if action.dtype.kind not in "iu":
            raise refuse(f"an array of {action.dtype}, not of integers")
        if action.ndim != 1:
            raise refuse(f"an array of shape {action.shape}")
        values = [int(a) for a in action]
    else:
        raise refuse(f"a {type(action).__name__}")
    if len(values) != len(sizes) + 1:
        raise refuse(f"{len(values)} entries")
    if not all(0 <= a < n for a, n in zip(values, [*sizes, 2])):
        raise refuse("an index out of range")
    return tuple(values[:-1]), values[-1] == 1


def action_of(key: Sequence[int], stop: bool = False) -> np.ndarray:
    """The game's action for the point ``key`` (or the stop action): the key's indices, then the stop entry."""
    return np.array([*(int(i) for i in key), int(stop)], dtype=np.int64)


@dataclass(frozen=True)
class Outcome:
    """What the truth says of one point: its status, its reward (the objective's metric signed so that higher is
    better, as :mod:`dse.reward` signs it; None unless ``ok``), the peak memory and the parsed metrics."""

    status: str
    reward: float | None = None
    peak_memory_gib: float | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Forecast:
    """The model's view of one valid point: its reward (signed: higher is better), its peak and the GPU's memory."""

    reward: float
    peak_memory_gib: float
    memory_gib: float


def features(names: Sequence[str], sizes: Sequence[int]) -> list[str]:
    """The names of the observation's entries, in order, for a space varying ``names`` over ``sizes`` values."""
    return (
        [f"last.{n}" for n in names]
        + [f"best.{n}" for n in names]
        + ["status.none"]
        + [f"status.{s}" for s in GAME_STATUSES]
        + ["last_value", "best_value", "last_forecast", "last_forecast_memory", "runs", "budget_spent"]
        + [f"tried.{n}[{i}]" for n, k in zip(names, sizes) for i in range(k)]
    )


def observation_space(sizes: Sequence[int]) -> spaces.Box:
    """The observation space of a space whose knobs have ``sizes`` values."""
    dim = len(features([str(i) for i in range(len(sizes))], sizes))
    return spaces.Box(low=0.0, high=OBS_HIGH, shape=(dim,), dtype=np.float32)


def value_counts(keys: Sequence[Key] | np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """Per knob, how many of ``keys`` (the valid points) take each of its values: the tried set's denominators."""
    arr = np.asarray(list(keys) if not isinstance(keys, np.ndarray) else keys, dtype=np.int64)
    arr = arr.reshape(len(arr), len(sizes))
    return [np.bincount(arr[:, j], minlength=n).astype(float) for j, n in enumerate(sizes)]


def fraction(reward: float | None, ref: float) -> float:
    """A reward as a fraction of the reference (the model's best): ``r/ref`` for rates, ``ref/r`` for negated times."""
    if reward is None or not math.isfinite(reward) or reward == 0 or ref == 0:
        return 0.0
    f = reward / ref if ref > 0 else ref / reward
    return float(min(max(f, 0.0), OBS_HIGH))


@dataclass
class History:
    """What a search has seen, in the terms of the observation: the agent keeps one, and so does the game.
    ``valid``: per knob, the valid points with each value (:func:`value_counts`; every raw point when None);
    ``budget``: the episode's launched runs."""

    sizes: Sequence[int]
    valid: Sequence[np.ndarray] | None = None
    budget: int = DEFAULT_BUDGET
    last: Key | None = None
    best: Key | None = None
    status: str | None = None
    last_value: float = 0.0
    best_value: float = 0.0
    last_forecast: float = 0.0
    last_memory: float = 0.0
    runs: int = 0
    counts: list[np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        self.counts = [np.zeros(n) for n in self.sizes]
        if self.valid is None:
            total = math.prod(self.sizes)
            self.valid = [np.full(n, total / n) for n in self.sizes]

    def record(self, key: Key, status: str, value: float, forecast: Forecast | None, ref: float) -> float:
        """Note one proposal's outcome (``value``: the fraction of the reference, 0 unless ok); the best's gain."""
        self.last, self.status, self.last_value = key, status, value
        self.last_forecast = fraction(forecast.reward, ref) if forecast else 0.0
        self.last_memory = min(forecast.peak_memory_gib / forecast.memory_gib, OBS_HIGH) if forecast else 0.0
        if status not in UNLAUNCHED_STATUSES and status != REPEAT:
            self.runs += 1
            for j, i in enumerate(key):
                self.counts[j][i] += 1
        gain = max(0.0, value - self.best_value)
        if value > self.best_value:
            self.best, self.best_value = key, value
        return gain

    def vector(self) -> np.ndarray:
        """The observation (:func:`features` names its entries)."""

        def scaled(key: Key | None) -> list[float]:
            if key is None:
                return [0.0] * len(self.sizes)
            return [i / (n - 1) if n > 1 else 0.0 for i, n in zip(key, self.sizes)]

        onehot = [0.0] * (len(GAME_STATUSES) + 1)
        onehot[_STATUS_INDEX.get(self.status, 0) if self.status else 0] = 1.0
        runs = [min(self.runs / RUN_SCALE, 1), min(self.runs / self.budget, 1)]
        tail = [self.last_value, self.best_value, self.last_forecast, self.last_memory, *runs]
        valid = self.valid or []
        tried = [c / np.maximum(v, 1) for c, v in zip(self.counts, valid)]
        head = np.array(scaled(self.last) + scaled(self.best) + onehot + tail, dtype=np.float32)
        return np.clip(np.concatenate([head, *tried]).astype(np.float32), 0, OBS_HIGH)


class CachedDraw:
    """A game's redraw (``twin_seed -> (truth, best)``) that keeps each twin it drew: a benchmark or a training run
    that comes back to a twin does not build it again (each twin's truth keeps its outcomes of the points run)."""

    def __init__(self, draw: Callable[[int], tuple[Callable[[Key], Outcome], float | None]]):
        self.draw, self.cache = draw, {}  # type: ignore[var-annotated]
        self.seeds = getattr(draw, "seeds", (0, 2**32 - 1))

    def __call__(self, twin_seed: int) -> tuple[Callable[[Key], Outcome], float | None]:
        if twin_seed not in self.cache:
            self.cache[twin_seed] = self.draw(twin_seed)
        return self.cache[twin_seed]


class Figures(Mapping[str, Any]):
    """A run's figures in ``info["metrics"]``: a read-only mapping (``info["metrics"]["peak_memory_gib"]``,
    ``.get``, ``dict(...)``). Not a ``dict``, so that Gymnasium's vector forms batch it as one object per
    sub-environment instead of field by field (whose fields and types differ by outcome); it pickles, as the async
    form needs."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None):
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Figures({self._data!r})"

    def __getstate__(self) -> dict[str, Any]:
        return self._data

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._data = state


def reference(forecasts: Mapping[Key, Forecast]) -> float:
    """The model's best reward over the valid points: what values are observed as fractions of (1.0 when none)."""
    return max((f.reward for f in forecasts.values()), default=1.0) or 1.0


class SearchGame(gym.Env):
    """One episode = one search (see the module docstring). ``forecasts``: the model's view of every valid point
    (a point missing is one the rules reject); ``truth``: the outcome of running a valid point; ``best``: the truth's
    best reward when known (a twin's), reported in ``info`` for scoring, never used by the game itself."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        names: Sequence[str],
        sizes: Sequence[int],
        forecasts: Mapping[Key, Forecast],
        truth: Callable[[Key], Outcome],
        *,
        budget: int = DEFAULT_BUDGET,
        best: float | None = None,
        target: float = TARGET,
        run_cost: float = RUN_COST,
        waste_cost: float = WASTE_COST,
        redraw: Callable[[int], tuple[Callable[[Key], Outcome], float | None]] | None = None,
        twin_seed: int | None = None,
    ):
        args = game_args(budget, target, run_cost, waste_cost)
        self.names, self.sizes = list(names), [int(n) for n in sizes]
        self.forecasts, self.truth = forecasts, truth
        self.budget, self.true_best, self.target = args["budget"], best, args["target"]
        self.run_cost, self.waste_cost = args["run_cost"], args["waste_cost"]
        self.ref = reference(forecasts)
        self.action_space = spaces.MultiDiscrete([*self.sizes, 2])
        self.observation_space = observation_space(self.sizes)
        self.redraw, self.twin_seed, self.base_twin_seed = redraw, twin_seed, twin_seed or 0
        self._valid = np.zeros(math.prod(self.sizes) + 1, dtype=bool)
        self._valid[-1] = True  # stop
        if forecasts:
            self._valid[np.ravel_multi_index(np.array(list(forecasts), dtype=np.int64).T, self.sizes)] = True
        self.valid_counts = value_counts(list(forecasts), self.sizes)
        self.table: Any = None  # the space's resolved points, when the environment was made from a space
        # a temporary directory of run logs made for this game alone (no out_dir given), removed by close();
        # never a directory the caller named
        self.scratch: Path | None = None
        self._new_episode()

    def close(self) -> None:
        """Remove :attr:`scratch`, the run directories made for this game alone (a pickled copy names the same
        directory: close one of them, not both, while the other still runs)."""
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None
        super().close()

    def _new_episode(self) -> None:
        self._mask = self._valid.copy()
        self.history = History(self.sizes, self.valid_counts, self.budget)
        self.tried: set[Key] = set()
        self.proposals, self.over = 0, False
        self.best_reward: float | None = None  # the best ok run's reward (signed), for info's scores

    def action_masks(self) -> np.ndarray:
        """One bool per point of the space, flattened in C order (``np.ravel_multi_index(key, sizes)``), then one for
        ``stop`` (always true): True where the point is valid (the rules accept it) and not yet tried, i.e. where a
        step would launch a run."""
        return self._mask.copy()

    def _info(self) -> dict[str, Any]:
        return {"action_mask": self.action_masks(), "twin_seed": self.twin_seed}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """A new search. On a twin with a redraw, ``seed`` draws a new twin (the same seed, the same twin: a function
        of the constructor's ``twin_seed`` and ``seed``) and ``options={"twin_seed": N}`` pins twin N; ``reset()``
        without either keeps the current twin."""
        super().reset(seed=seed)
        pin = self._pinned(options)
        if self.redraw is not None and (pin is not None or seed is not None):
            # the drawn twin's seed mixes the constructor's twin seed in: sub-environments built on distinct twin
            # seeds draw distinct twins even from one reset seed
            lo, hi = getattr(self.redraw, "seeds", (0, 2**32 - 1))  # the twins of a split, when drawn from one
            rng = np.random.default_rng([self.base_twin_seed, int(seed or 0)])
            ts = pin if pin is not None else lo + int(rng.integers(hi - lo + 1))
            if ts != self.twin_seed:  # the same twin keeps its truth (and the outcomes it has computed)
                self.truth, self.true_best = self.redraw(ts)
                self.twin_seed = ts
        self._new_episode()
        return self.history.vector(), self._info()

    def _pinned(self, options: dict[str, Any] | None) -> int | None:
        """The twin seed ``options`` pins (None when it pins none); a ValueError for options the game does not take."""
        options = dict(options or {})
        unknown = sorted(set(options) - {"twin_seed"})
        if unknown:
            raise ValueError(f"reset takes the option twin_seed only; got {unknown[0]!r}")
        if "twin_seed" not in options:
            return None
        if self.redraw is None:
            raise ValueError("the option twin_seed needs an environment on a twin (backend sim, in memory)")
        lo, hi = getattr(self.redraw, "seeds", (0, 2**32 - 1))  # a split's twins only, when drawn from one
        return check_int("options['twin_seed']", options["twin_seed"], lo, hi)

    def scores(self) -> dict[str, Any]:
        """What ``info`` reports for scoring against the truth's best (an oracle the game never uses itself)."""
        if self.true_best is None or self.best_reward is None:
            return {"solved": False}
        of_best = fraction(self.best_reward, self.true_best)
        return {"of_true_best": of_best, "solved": of_best >= self.target}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        key, stop = action_key(action, self.sizes, self.action_space)
        if self.over:
            raise RuntimeError("the episode has ended (stopped, every point run, or the budget spent); call reset()")
        self.proposals += 1
        if stop:
            self.over = True
            return self.history.vector(), 0.0, True, False, self._step_info(key, Outcome(STOP), False)
        forecast = self.forecasts.get(key)
        if forecast is None:
            outcome = Outcome("rejected")
        elif key in self.tried:
            outcome = Outcome(REPEAT)  # already run: nothing new is launched
        else:
            self.tried.add(key)
            self._mask[np.ravel_multi_index(key, self.sizes)] = False
            outcome = self.truth(key)
        ok = outcome.status == "ok"
        if ok and outcome.reward is not None and (self.best_reward is None or outcome.reward > self.best_reward):
            self.best_reward = outcome.reward
        value = fraction(outcome.reward, self.ref) if ok else 0.0
        status = outcome.status if outcome.status in _STATUS_INDEX else "rejected"
        gain = self.history.record(key, status, value, forecast, self.ref)
        launched = outcome.status not in UNLAUNCHED_STATUSES and outcome.status != REPEAT
        reward = gain - (self.run_cost if launched else self.waste_cost)
        terminated = len(self.tried) >= len(self.forecasts)
        truncated = not terminated and (self.history.runs >= self.budget or self.proposals >= 4 * self.budget)
        self.over = terminated or truncated
        return self.history.vector(), float(reward), terminated, truncated, self._step_info(key, outcome, launched)

    def _step_info(self, key: Key, outcome: Outcome, launched: bool) -> dict[str, Any]:
        return {
            "status": outcome.status,
            "action": key,
            "stop": outcome.status == STOP,
            **({} if outcome.reward is None else {"reward": float(outcome.reward)}),
            "launched": launched,
            "gpu_hours": float(outcome.metrics.get("gpu_hours") or 0.0) if launched else 0.0,
            "metrics": Figures(outcome.metrics),
            "best_fraction": self.history.best_value,
            "runs": self.history.runs,
            **self.scores(),
            **self._info(),
        }
