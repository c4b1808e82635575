"""The benchmark suite: one Gymnasium id per benchmark (``dse/Llama70B-H100-v0``, ...), twin splits, held-out spaces,
replays of real runs, and the shared encoding that lets one policy act on spaces with different knob sets.

``import dse.envs`` registers every id of :data:`SUITE`::

    import gymnasium as gym
    import dse.envs
    from dse.envs.suite import benchmarks

    env = gym.make("dse/Llama70B-H100-v0", split="train")  # reset(seed=s) draws a twin of the train split
    for b in benchmarks("test"):                              # what a leaderboard runs agents on
        env = b.make("test")

A **benchmark** is a shipped space and how it is played (:class:`Benchmark`): on the simulated backend, a fresh
twin truth of the space per episode (``reset(seed=s)`` draws one; ``reset(options={"twin_seed": N})`` pins one);
or a **replay** of a study measured on real GPUs (``bench/data/*/``: each point's recorded outcome, one truth).

**Splits.** A twin benchmark's twin seeds are split into disjoint ranges (:data:`TWIN_SPLITS`): ``test`` twins
0..9,999 (the twins ``bench/search_efficiency.py`` judges on), ``validation`` 10,000..19,999, ``train`` 20,000 and
up. An environment made for a split draws only that split's twins, and refuses to pin a twin outside it. A
**training space** is in every split (its own twins); a **held-out space** (``held_out``: the axis it differs on,
another model, GPU generation or scale than every training space) and every replay are in ``test`` only, so
training never sees them: ``benchmarks("train")`` and ``benchmarks("validation")`` list training spaces only, and
making a held-out id for another split is a ``ValueError``.

**The shared encoding** (:class:`Candidates`, :func:`point_features`): a space's action is one index per knob it
varies, so two spaces' actions mean different things. :class:`Candidates` wraps any environment of the suite as a
choice among its valid points: ``Discrete(N + 1)`` (the N valid points, in the table's order, then stop), and an
observation of one row per point, the same columns for every space: the point's resolved layout as values (every
knob of :data:`ENCODED_KNOBS`, whether the space varies it or fixes it; integers as log2, choices one-hot), the
system and model it runs on, the model's forecast of it, what the search has seen of it, and the search's progress.
A policy that scores rows with shared weights acts on every space of the suite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dse.envs.search import MAX_SEED, Table, as_space, make_env, table
from dse.facts import hardware, knobs
from dse.rl.searchgame import DEFAULT_BUDGET, OBS_HIGH, SearchGame, action_of, check_int, fraction

SPLITS = ("train", "validation", "test")
#: Disjoint twin seed ranges (inclusive) of the splits.
TWIN_SPLITS: dict[str, tuple[int, int]] = {
    "test": (0, 9_999),
    "validation": (10_000, 19_999),
    "train": (20_000, MAX_SEED),
}
HELD_OUT_AXES = ("model", "gpu", "scale", "real runs")
#: Where the measured studies a replay benchmark plays live: the source checkout's ``bench/data`` (not installed
#: with the wheel; :func:`benchmarks` lists a replay only where its table is found).
BENCH_DATA = Path(__file__).resolve().parents[1] / "bench" / "data"


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the suite: its Gymnasium id, the space it plays, and how.

    ``space``: a shipped space (``conf/spaces/NAME.toml``) or, for a replay, the measured study's replay space
    (relative to :data:`BENCH_DATA`). ``held_out``: None for a training space; else the axis on which it differs
    from every training space (:data:`HELD_OUT_AXES`). ``budget``: launched runs per episode."""

    id: str
    space: str
    held_out: str | None = None
    budget: int = DEFAULT_BUDGET
    replay: bool = False
    about: str = ""

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits this benchmark is in: every split for a training space, ``test`` for a held-out one."""
        return SPLITS if self.held_out is None else ("test",)

    @property
    def space_path(self) -> str:
        """The space file: a shipped space's ``conf/spaces/...`` path, or a replay's file under ``bench/data``."""
        return str(BENCH_DATA / self.space) if self.replay else self.space

    @property
    def available(self) -> bool:
        """False for a replay whose measured table is not here (an installed wheel carries no ``bench/data``)."""
        return not self.replay or Path(self.space_path).is_file()

    def check_split(self, split: Any) -> str:
        if split not in SPLITS:
            raise ValueError(f"split takes one of {', '.join(SPLITS)}; got {split!r}")
        if split not in self.splits:
            what = "a replay of real runs" if self.replay else f"a held-out space (another {self.held_out})"
            raise ValueError(f"{self.id} is {what}: it is in the test split only, never in {split!r}")
        return str(split)

    def twin_range(self, split: str) -> tuple[int, int] | None:
        """The twin seeds (inclusive) an environment of ``split`` draws from; None for a replay (one truth)."""
        self.check_split(split)
        return None if self.replay else TWIN_SPLITS[split]

    def kwargs(self, split: str) -> dict[str, Any]:
        """:func:`dse.envs.make_env`'s arguments for this benchmark in ``split`` (JSON-serialisable)."""
        rng = self.twin_range(split)
        if rng is None:
            return {"space": self.space_path, "backend": "replay", "budget": self.budget}
        return {"space": self.space, "backend": "sim", "budget": self.budget, "twin_seed": rng[0], "twin_range": rng}

    def make(self, split: str = "test", **kw: Any) -> gym.Env:
        """``gym.make(self.id, split=split, **kw)``."""
        return gym.make(self.id, split=split, **kw)


def _b(id_: str, space: str, held_out: str | None = None, about: str = "", **kw: Any) -> Benchmark:
    return Benchmark(f"dse/{id_}-v0", f"conf/spaces/{space}_space.toml", held_out, about=about, **kw)


def _replay(id_: str, folder: str, about: str, budget: int) -> Benchmark:
    return Benchmark(f"dse/{id_}-v0", f"{folder}/replay_space.toml", "real runs", budget, True, about)


#: The suite, in order: training spaces, held-out spaces, replays of real runs.
SUITE: tuple[Benchmark, ...] = (
    _b("Llama8B-H100", "llama3_8b", about="Llama 3 8B, 8 H100, dense, 7 knobs incl. FSDP"),
    _b("Nemotron3-8B-H100", "nemotron3_8b", about="Nemotron 3 8B, 8 H100"),
    _b("Llama70B-H100", "llama3_70b", about="Llama 3 70B, 64 H100"),
    _b("Llama405B-H100", "llama3_405b", about="Llama 3 405B, 1,024 H100"),
    _b("Nemotron4-340B-H100", "nemotron4_340b", about="Nemotron 4 340B, 128 H100"),
    _b("Mixtral8x7B-H100", "mixtral_8x7b_h100_64", about="Mixtral 8x7B (MoE), 64 H100"),
    _b("DeepSeekV3-H100", "deepseek_v3_h100_1024", about="DeepSeek-V3 (MoE, MLA), 1,024 H100"),
    _b("Llama70B-B300-NVFP4", "llama3_70b_b300_nvfp4", about="Llama 3 70B, 64 B300, NVFP4/FP8, FSDP, offload, graphs"),
    # held out: training never sees these
    _b("Qwen3-30B-A3B-H100", "qwen3_30b_a3b_h100_8", "model", "Qwen3 30B-A3B (MoE), 8 H100: a model not trained on"),
    _b("Nemotron4-15B-B200", "nemotron4_15b", "model", "Nemotron 4 15B, 64 B200: a model and a GPU not trained on"),
    _b("Llama70B-GB300-NVFP4", "llama3_70b_gb300_nvfp4", "gpu", "Llama 3 70B, 64 GB300 NVL72: a GPU not trained on"),
    _b("DeepSeekV3-GB200", "deepseek_v3_gb200_256", "gpu", "DeepSeek-V3, 256 GB200 NVL72: a GPU not trained on"),
    _b("Llama405B-2Node-H100", "llama3_405b_2node", "scale", "Llama 3 405B (8 layers), 16 H100: another scale"),
    _b("Llama70B-16L-H200x8", "llama3_70b_16l_h200_x8_local", "scale", "Llama 3 70B (16 layers), one 8-H200 node"),
    # replays of studies measured on real GPUs: every point's recorded outcome
    _replay("Replay-Llama8B-4L-H100", "h100_mcore_grid", "9 real Megatron-Core runs, one H100", 9),
    _replay("Replay-Llama8B-4L-H200", "h200_local_study", "6 real NeMo runs, one H200", 6),
    _replay("Replay-Llama8B-4L-H200-TE", "h200_te_8b_4l_study", "24 real Transformer Engine runs, one H200", 24),
    _replay("Replay-Llama70B-4L-H200-TE", "h200_te_70b_4l_study", "6 real Transformer Engine runs, one H200", 6),
)
BY_ID = {b.id: b for b in SUITE}


def benchmarks(split: str = "test") -> list[Benchmark]:
    """The benchmarks of ``split`` (``train``, ``validation`` or ``test``), in suite order: training spaces in every
    split; held-out spaces and replays in ``test`` only (a replay only where its measured table is found)."""
    if split not in SPLITS:
        raise ValueError(f"split takes one of {', '.join(SPLITS)}; got {split!r}")
    return [b for b in SUITE if split in b.splits and b.available]


def get(benchmark: str) -> Benchmark:
    """The benchmark of id ``benchmark``; a ValueError naming the ids otherwise."""
    if benchmark not in BY_ID:
        raise ValueError(f"no benchmark {benchmark!r}; the suite's: {', '.join(BY_ID)}")
    return BY_ID[benchmark]


@cache
def _table(space: str) -> Table:
    """A shipped space's table, built once per process (every environment of the benchmark shares it)."""
    return table(as_space(space))


def default_split(b: Benchmark) -> str:
    return b.splits[0]


def make_benchmark(benchmark: str, split: str | None = None, **kw: Any) -> SearchGame:
    """The entry point of every suite id: :func:`dse.envs.make_env` on the benchmark's space for ``split``
    (default: ``train`` for a training space, ``test`` for a held-out one or a replay); ``kw``: the environment's
    other arguments (``budget``, ``seed``, ``target``, ``run_cost``, ``waste_cost``)."""
    b = get(benchmark)
    split = b.check_split(default_split(b) if split is None else split)
    args = {**b.kwargs(split), **kw}
    if not b.available:
        raise ValueError(f"{b.id} replays {b.space_path}, which is not here (the source checkout's bench/data)")
    if b.replay:
        return make_env(args.pop("space"), **args)
    rng = args.pop("twin_range")
    if not rng[0] <= args["twin_seed"] <= rng[1]:
        raise ValueError(f"twin_seed of {b.id}'s {split} split takes {rng[0]:,} to {rng[1]:,}; got {args['twin_seed']}")
    return make_env(args.pop("space"), table_=_table(b.space), twin_range=rng, **args)


def make_benchmark_vec(num_envs: int, benchmark: str, split: str | None = None, **kw: Any) -> gym.vector.SyncVectorEnv:
    """The vector entry point of every twin id: ``num_envs`` sub-environments on the first twins of ``split``
    (twin ``lo + i``), sharing the space's table; a seeded reset draws each its own twin of the split."""
    b = get(benchmark)
    check_int("num_envs", num_envs, 1, 1024)
    split = b.check_split(default_split(b) if split is None else split)
    rng = b.twin_range(split)
    if rng is None:
        raise ValueError(f"{b.id} replays real runs (one truth): make it with gym.make, not make_vec")
    return gym.vector.SyncVectorEnv([_one(benchmark, split, rng[0] + i, kw) for i in range(num_envs)])


def _one(benchmark: str, split: str, twin_seed: int, kw: dict[str, Any]):
    return lambda: make_benchmark(benchmark, split, twin_seed=twin_seed, **kw)


def register() -> None:
    """Register every id of the suite (idempotent)."""
    for b in SUITE:
        if b.id not in gym.registry:
            gym.register(
                b.id,
                entry_point=f"{__name__}:make_benchmark",
                vector_entry_point=None if b.replay else f"{__name__}:make_benchmark_vec",
                kwargs={"benchmark": b.id},
            )


# -- the shared encoding ------------------------------------------------------------------------------------------

#: The knobs every row encodes, by name (the catalogue's, in its order): a space that fixes one still gives its value.
ENCODED_KNOBS: tuple[str, ...] = tuple(
    n for n, k in knobs.CATALOGUE.items() if k.kind in ("int", "bool", "choice", "modules")
)
INT_SCALE = 10.0  # an integer knob is observed as log2(1 + value) / INT_SCALE (1,024 -> 1.0)
GPUS = tuple(hardware.HARDWARE)
ROW_STATUSES = ("ok", "oom", "failed")  # a run's outcome in a row: ok, out of memory, any other failure


def knob_columns() -> list[str]:
    """The names of the knob part of a row (:func:`point_features`)."""
    cols: list[str] = []
    for n in ENCODED_KNOBS:
        k = knobs.CATALOGUE[n]
        if k.kind in ("int", "bool"):
            cols.append(n)
        else:
            cols += [f"{n}={c}" for c in k.choices] + [f"{n}=other"]
    return cols


CONTEXT_COLUMNS = ("log2_gpus", "gpu_memory", "log2_layers", "log2_hidden", "moe", *(f"gpu={g}" for g in GPUS))
SEARCH_COLUMNS = (
    "forecast",
    "forecast_memory",
    "tried",
    "value",
    *(f"status={s}" for s in ROW_STATUSES),
    "is_best",
    "best_value",
    "runs_share",
    "proposals_share",
)


def columns() -> list[str]:
    """The names of a row's entries, in order: knobs, context, search."""
    return [*knob_columns(), *CONTEXT_COLUMNS, *SEARCH_COLUMNS]


def _knob_value(k: knobs.Knob, v: Any) -> list[float]:
    if k.kind == "bool":
        return [1.0 if v else 0.0]
    if k.kind == "int":
        return [math.log2(1 + max(int(v), 0)) / INT_SCALE if v is not None else 0.0]
    hot = [0.0] * (len(k.choices) + 1)
    given = str(v).split(",") if k.kind == "modules" and v else [v]
    for g in given:
        hot[k.choices.index(g) if g in k.choices else len(k.choices)] = 1.0
    return hot


def point_features(trial: Any) -> np.ndarray:
    """The static part of one point's row: its resolved knob values (:data:`ENCODED_KNOBS`) and its context (the
    GPU, the scale, the model), independent of which knobs the space varies and in which order."""
    row: list[float] = []
    for n in ENCODED_KNOBS:
        row += _knob_value(knobs.CATALOGUE[n], trial.values.get(n))
    gpu = hardware.HARDWARE[trial.system.gpu]
    arch = trial.arch
    row += [
        math.log2(trial.num_gpus) / INT_SCALE,
        gpu.memory_gib / 300.0,
        math.log2(max(arch.num_layers, 1)) / INT_SCALE,
        math.log2(max(arch.hidden_size, 1)) / 20.0,
        1.0 if getattr(arch, "num_experts", 0) else 0.0,
        *(1.0 if g == trial.system.gpu else 0.0 for g in GPUS),
    ]
    return np.asarray(row, dtype=np.float32)


class Candidates(gym.Wrapper):
    """The suite's shared encoding of one environment (see the module docstring): ``Discrete(N + 1)`` over its N
    valid points (then stop) and a ``Box(N, len(columns()))`` observation, one row per point. ``action_masks()``
    is true for the points not yet run and for stop. Stepping it steps the wrapped game with the point's action, so
    rewards, termination and ``info`` are the game's own."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        game = env.unwrapped
        if not isinstance(game, SearchGame) or game.table is None:
            raise TypeError("Candidates wraps an environment of dse/Recipe-v0 or of the suite")
        self.game: SearchGame = game
        self.keys: list[tuple[int, ...]] = list(game.forecasts)
        tab: Table = game.table
        by_key = dict(zip(tab.keys, tab.trials))
        self.static = np.stack([point_features(by_key[k]) for k in self.keys]).astype(np.float32)
        self.forecast = np.array(
            [
                [
                    fraction(game.forecasts[k].reward, game.ref),
                    game.forecasts[k].peak_memory_gib / game.forecasts[k].memory_gib,
                ]
                for k in self.keys
            ],
            dtype=np.float32,
        ).clip(0, OBS_HIGH)
        self.index = {k: i for i, k in enumerate(self.keys)}
        n = len(self.keys)
        self.action_space = spaces.Discrete(n + 1)
        self.observation_space = spaces.Box(0.0, OBS_HIGH, shape=(n, len(columns())), dtype=np.float32)
        self._reset_search()

    def _reset_search(self) -> None:
        n = len(self.keys)
        self.seen = np.zeros((n, 3 + len(ROW_STATUSES)), dtype=np.float32)  # tried, value, statuses, is_best
        self.best: int | None = None

    def observation(self) -> np.ndarray:
        g = self.game
        progress = np.array(
            [g.history.best_value, min(g.history.runs / g.budget, 1.0), min(g.proposals / (4 * g.budget), 1.0)],
            dtype=np.float32,
        )
        n = len(self.keys)
        return np.concatenate([self.static, self.forecast, self.seen, np.broadcast_to(progress, (n, 3))], axis=1).clip(
            0, OBS_HIGH
        )

    def action_masks(self) -> np.ndarray:
        """True for each point not yet run, then True for stop."""
        return np.append(self.seen[:, 0] == 0, True)

    def reset(self, **kw: Any) -> tuple[np.ndarray, dict[str, Any]]:
        _, info = self.env.reset(**kw)
        self._reset_search()
        return self.observation(), {**info, "candidate_mask": self.action_masks()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = int(action)
        n = len(self.keys)
        if not 0 <= a <= n:
            raise ValueError(
                f"action {action!r} is not in Discrete({n + 1}): a point's index 0..{n - 1}, or {n} (stop)"
            )
        inner = action_of(self.keys[0], stop=True) if a == n else action_of(self.keys[a])
        _, reward, terminated, truncated, info = self.env.step(inner)
        if a < n and info["launched"]:
            row = self.seen[a]
            row[0] = 1.0
            status = info["status"] if info["status"] in ROW_STATUSES else "failed"
            row[2 + ROW_STATUSES.index(status)] = 1.0
            if status == "ok":
                row[1] = fraction(info["reward"], self.game.ref)
            if self.game.history.best == self.keys[a]:
                if self.best is not None:
                    self.seen[self.best, -1] = 0.0
                self.best = a
                row[-1] = 1.0
        return self.observation(), float(reward), terminated, truncated, {**info, "candidate_mask": self.action_masks()}
