"""``dse export minari``: a study written as a Minari dataset (Farama's offline-RL format for Gymnasium environments);
``dse export minari-suite``: the benchmark suite written as Minari datasets, one episode per twin and agent.

A study is one episode of ``dse/Recipe-v0`` (:mod:`dse.envs.search`), played by the game's own rules
(:func:`episode`): each stored trial, in number order, is proposed to a :class:`dse.rl.searchgame.SearchGame` whose
truth is the study's record of that point, so its observations, rewards and ends are the game's. A screened trial
is left out (the environment has no screen: the study's agent never proposed the point to the environment), a
point already run is the game's ``repeat``, and the episode ends where the game ends it: every valid point run
(``terminated``) or the budget of launched runs spent (``truncated``; the budget is the study's launched runs unless
given); a study that ended before either ends with the stop action (``terminated``). The infos carry, per step, the
trial's number (-1 for a stop step), whether it launched, and the objective's metric (NaN unless ``ok``); the first
entry (the reset's) is -1, 0 and NaN.

The dataset keeps the environment's spec, every argument spelled out (``gym.make("dse/Recipe-v0", space=...,
backend=..., twin_seed=..., seed=..., budget=..., target=..., run_cost=..., waste_cost=...)``, the space as the
study's ``dse.json`` names it), so ``dataset.recover_environment()`` builds the environment again where that space
file is found; on a simulated study's twin, the episode's actions replayed in it give its observations and rewards.
Minari writes under ``MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``); the ``datasets_path`` parameter (``--datasets-path``) sets it for the
export. Needs the ``rl`` extra (Minari with its HDF5 storage).

The suite (:func:`to_minari_suite`): per benchmark of a split (:mod:`dse.envs.suite`), one dataset of the twins of
the split times the agents (random and guided at least), each episode played by the agent through the benchmark's
environment (:func:`agent_episode`); the reference min and max scores the mean returns of random and guided, so
``minari.get_normalized_score`` works; the spec the benchmark's id with every argument.

Minari makes a dataset's directories from its id before it checks the id's syntax, so the id is checked here first
(:func:`check_dataset_id`: letters, digits, ``_`` and ``-`` in ``/``-separated parts, ending in ``-vN``; never ``.``
or ``..``), before anything is created; the datasets folder is created (or found) next, with one line when it cannot
be (``/proc/x``). A dataset whose writing fails is removed, so no half of one is left under its id.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dse.envs.search import ENV_ID, Table, table
from dse.errors import UserError
from dse.logs.parse import UNLAUNCHED_STATUSES
from dse.rl.searchgame import MAX_BUDGET, REPEAT, RUN_COST, TARGET, WASTE_COST, Key, Outcome, SearchGame, action_of
from dse.rules.space import Space, load_space
from dse.study.loop import open_store
from dse.study.store import TrialRecord

MINARI_EXTRA = "dse export minari needs the rl extra: pip install 'dse[rl]' (Minari with its HDF5 storage)"
# A subset of Minari's (namespace/)name-vN syntax that is also a relative path inside the datasets folder: no '.',
# no empty part, no leading '/'; 200 characters at most (a file name's limit is 255)
DATASET_ID = re.compile(r"[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*-v[0-9]{1,9}")
MAX_ID = 200


@dataclass
class Episode:
    """One episode of the game as lists (as Minari's ``EpisodeBuffer`` takes them), and its per-step infos:
    ``trial`` (the study's trial number; -1 for the reset, for a stop step and for an agent's episode), ``launched``
    and ``value`` (the objective's metric, NaN unless ``ok``)."""

    observations: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminations: list[bool] = field(default_factory=list)
    truncations: list[bool] = field(default_factory=list)
    trial: list[int] = field(default_factory=lambda: [-1])
    launched: list[int] = field(default_factory=lambda: [0])
    value: list[float] = field(default_factory=lambda: [math.nan])

    def step(self, game: SearchGame, action: np.ndarray, sign: float, trial: int = -1) -> bool:
        """Step ``game`` with ``action`` and record the step (``sign``: the objective's, 1 when it is maximised, -1
        when minimised: the metric is ``sign`` times the reward); whether the episode is over."""
        obs, reward, terminated, truncated, info = game.step(action)
        self.observations.append(obs)
        self.actions.append(action)
        self.rewards.append(reward)
        self.terminations.append(terminated)
        self.truncations.append(truncated)
        self.trial.append(trial)
        self.launched.append(int(info["launched"]))
        ok = info["launched"] and info["status"] == "ok" and info.get("reward") is not None
        self.value.append(sign * float(info["reward"]) if ok else math.nan)
        return terminated or truncated

    def infos(self, **constant: int) -> dict[str, np.ndarray]:
        n = len(self.trial)
        extra = {k: np.full(n, v, dtype=np.int64) for k, v in constant.items()}
        return {
            "trial": np.array(self.trial),
            "launched": np.array(self.launched),
            "value": np.array(self.value),
            **extra,
        }

    def buffer(self, id_: int, options: dict[str, Any] | None = None, **constant: int) -> Any:
        from minari.data_collector import EpisodeBuffer

        return EpisodeBuffer(
            id=id_,
            options=options,
            observations=self.observations,
            actions=self.actions,
            rewards=self.rewards,
            terminations=self.terminations,
            truncations=self.truncations,
            infos=self.infos(**constant),
        )


class RecordedTruth:
    """``key -> Outcome``: the outcome a study recorded for the point (its first launched trial of it; an interrupted
    trial has none)."""

    def __init__(self, space: Space):
        self.space = space
        self.outcomes: dict[Key, Outcome] = {}

    def note(self, key: Key, rec: TrialRecord) -> None:
        if key not in self.outcomes and rec.status not in UNLAUNCHED_STATUSES and not rec.interrupted:
            metrics = {**rec.metrics, "status": rec.status}
            self.outcomes[key] = Outcome(
                rec.status, rec.reward if rec.ok else None, rec.metrics.get("peak_memory_gib"), metrics
            )

    def __call__(self, key: Key) -> Outcome:
        return self.outcomes.get(key, Outcome("rejected"))  # valid, but the study launched nothing there


def study_game(tab: Table, truth: Any, budget: int) -> SearchGame:
    """The game of ``tab``'s space whose truth is ``truth`` (no redraw: the study's one truth)."""
    game = SearchGame(tab.space.knob_names, tab.sizes, tab.forecasts, truth, budget=budget)
    game.table = tab
    return game


def launched_runs(space: Space, records: list[TrialRecord]) -> int:
    """The study's launched runs: its trials that ran (not rejected, not screened), each point once."""
    keys = {_key(space, r) for r in records if r.status not in UNLAUNCHED_STATUSES}
    return len(keys)


def _key(space: Space, rec: TrialRecord) -> Key:
    return tuple(space.knobs[n].index(rec.knobs[n]) for n in space.knob_names)


def episode(space: Space, tab: Table, records: list[TrialRecord], budget: int | None = None) -> Episode:
    """The study's records as one episode of the search game, played by the game's own rules (see the module
    docstring): each trial in number order is proposed to a game whose truth is the study's record; a screened trial
    is left out (the environment has no screen: its agent never proposed the point to the environment), the episode
    ends where the game ends it (every valid point run, or ``budget`` launched runs: default the study's launched
    runs), and a study that ended before that ends with the stop action (``terminated``)."""
    truth = RecordedTruth(space)
    budget = budget or max(launched_runs(space, records), 1)
    game = study_game(tab, truth, budget)
    obs, _ = game.reset()
    ep = Episode(observations=[obs])
    sign = 1.0 if space.objective.sense == "maximize" else -1.0
    for rec in records:
        if rec.status == "screened":
            continue
        key = _key(space, rec)
        truth.note(key, rec)
        if ep.step(game, action_of(key), sign, rec.number):
            return ep
    ep.step(game, action_of([0] * len(tab.sizes), stop=True), sign)
    return ep


def env_kwargs(meta: dict[str, Any], space_path: str, budget: int) -> dict[str, Any]:
    """The ``gym.make`` arguments that rebuild the study's environment (JSON-serialisable, for the spec): its space,
    backend, twin, the simulated jitter's seed (the study's), the budget and the game's costs."""
    fields = (meta.get("fingerprint") or {}).get("fields") or {}
    backend = fields.get("backend") or meta.get("backend") or "sim"
    kwargs: dict[str, Any] = {"space": space_path, "backend": backend}
    if fields.get("twin_seed") is not None:
        kwargs["twin_seed"] = int(fields["twin_seed"])
    return {**kwargs, "seed": int(meta.get("seed") or 0), **game_kwargs(budget)}


def game_kwargs(budget: int) -> dict[str, Any]:
    """The game's arguments a dataset's spec spells out: the budget, the stop rule's target and the costs."""
    return {"budget": budget, "target": TARGET, "run_cost": RUN_COST, "waste_cost": WASTE_COST}


def _space(meta: dict[str, Any], given: str | None) -> tuple[Space, str]:
    path = given or meta.get("space")
    if not isinstance(path, str):
        raise UserError("dse.json names no space file; pass --space FILE", param="space")
    space = load_space(path)
    if {k: list(v) for k, v in space.knobs.items()} != meta["knobs"]:
        raise UserError(f"{path}: its knobs are not the study's; pass the study's space with --space", param="space")
    return space, path


def check_dataset_id(dataset_id: str, param: str = "dataset_id") -> str:
    """``dataset_id`` when it is a Minari dataset id that names a folder inside the datasets folder (see the module
    docstring); a one-line error otherwise. Nothing is created."""
    from minari.dataset.minari_dataset import parse_dataset_id

    allowed = "letters, digits, _ and - in parts separated by /, ending in -vN (dse/nemotron3/guided-v0)"
    if len(dataset_id) > MAX_ID or not DATASET_ID.fullmatch(dataset_id):
        shown = dataset_id if len(dataset_id) <= 80 else dataset_id[:77] + "..."
        raise UserError(f"{shown!r} is not a dataset id: {allowed}, {MAX_ID} characters at most", param=param)
    try:
        parse_dataset_id(dataset_id)  # Minari's own syntax (a namespace of 2 characters at least...)
    except ValueError as e:
        raise UserError(str(e).splitlines()[0], param=param) from None
    return dataset_id


def datasets_root(path: Path | None) -> Path:
    """The datasets folder (``path``, else ``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``), created when
    absent; a one-line error when it is not a folder or cannot be made."""
    root = path or Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    # given: the `datasets_path` parameter; else the environment variable, which is a field of no parameter
    where = {"param": "datasets_path"} if path is not None else {"field": "MINARI_DATASETS_PATH"}
    if (root.exists() or root.is_symlink()) and not root.is_dir():
        raise UserError("is not a directory", file=str(root), **where)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create: {e.strerror or e}", file=str(root), **where) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise UserError("cannot write here", file=str(root), **where)
    return root


def to_minari(
    study_dir: Path,
    dataset_id: str | None = None,
    *,
    space: str | None = None,
    datasets_path: Path | None = None,
    budget: int | None = None,
):
    """Write the study of ``study_dir`` as the Minari dataset ``dataset_id`` (default ``dse/NAME/study-v0``) under
    ``datasets_path`` (see :func:`datasets_root`); the dataset (a ``minari.MinariDataset``). The id and the folder
    are checked before anything is created. ``budget``: the episode's launched runs (default: the study's)."""
    _need_minari("export minari")
    if dataset_id is not None:
        check_dataset_id(dataset_id)
    if budget is not None:
        budget = check_budget(budget)
    store, meta = open_store(study_dir)
    try:
        records = list(store.iter_records())
    finally:
        store.close()
    s, path = _space(meta, space)
    tab = table(s)
    budget = budget or max(launched_runs(s, records), 1)
    ep = episode(s, tab, records, budget)
    if dataset_id is None:
        try:
            dataset_id = check_dataset_id(f"dse/{meta['study_name']}/study-v0")
        except UserError as e:  # the study's name makes no dataset id: say it is the default's fault
            raise UserError(f"the default {e.message}", param="dataset_id") from None
    root = datasets_root(datasets_path)
    spec = _spec(ENV_ID, env_kwargs(meta, path, budget))
    description = f"dse study {meta['study_name']}: one episode of {ENV_ID}, one step per trial the environment sees"
    return _create(dataset_id, [ep.buffer(0)], spec, root, f"dse {meta.get('agent', 'study')}", description)


def check_budget(budget: Any) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_BUDGET:
        raise UserError(f"takes an integer from 1 to {MAX_BUDGET:,}; got {budget!r}", param="budget")
    return budget


def _need_minari(command: str) -> None:
    if importlib.util.find_spec("minari") is None or importlib.util.find_spec("h5py") is None:
        raise UserError(MINARI_EXTRA.replace("dse export minari", f"dse {command}"), field=command)


def _spec(env_id: str, kwargs: dict[str, Any]) -> Any:
    """The registered ``env_id``'s spec with ``kwargs`` (its own, then these): what a dataset keeps to rebuild it."""
    import gymnasium as gym

    spec = gym.spec(env_id)
    return gym.envs.registration.EnvSpec(
        id=spec.id,
        entry_point=spec.entry_point,
        vector_entry_point=spec.vector_entry_point,
        kwargs={**spec.kwargs, **kwargs},
    )


def _create(
    dataset_id: str,
    buffers: list[Any],
    spec: Any,
    root: Path,
    algorithm: str,
    description: str,
    ref: tuple[float, float] | None = None,
):
    """Minari's ``create_dataset_from_buffers``, its errors as one line; a dataset it left half-written removed.
    ``ref``: the reference (min, max) returns ``minari.get_normalized_score`` reads."""
    import minari

    os.environ["MINARI_DATASETS_PATH"] = str(root)  # Minari's documented setting, read when it writes
    target = root / dataset_id
    existed = target.exists() or target.is_symlink()
    scores = {"ref_min_score": ref[0], "ref_max_score": ref[1]} if ref is not None else {}
    try:
        with warnings.catch_warnings():
            # Minari recommends an author, an e-mail and a code link; a study has none of its own to give
            warnings.filterwarnings("ignore", message=r"`(code_permalink|author|author_email)` is set to None")
            return minari.create_dataset_from_buffers(
                dataset_id,
                buffers,
                env=spec,
                eval_env=spec,
                algorithm_name=algorithm,
                description=description,
                num_episodes_average_score=len(buffers),
                **scores,
            )
    except (ValueError, OSError) as e:
        if not existed:  # Minari refuses an id that exists, so what is there now is this export's, half written
            shutil.rmtree(target, ignore_errors=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write the dataset: {e.strerror or e}", file=str(target)) from None
        raise UserError(str(e).splitlines()[0], param="dataset_id") from None  # an id already taken: one line


# -- the suite: many episodes, one per twin and agent ---------------------------------------------------------------

REFERENCE_AGENTS = ("random", "guided")  # the reference min and max of a dataset's normalised score


def agent_episode(
    game: SearchGame, agent_name: str, seed: int, options: dict[str, Any] | None = None, registry: Any = None
) -> Episode:
    """One episode of ``game`` played by the registered agent ``agent_name`` (seeded ``seed``), through the game's
    own ``reset`` and ``step``: the agent is handed the game's action mask and the model's forecasts (as a study
    hands them), proposes until the game ends the episode, and ends it with the stop action when it proposes
    nothing more. ``options``: the reset's (``{"twin_seed": N}`` pins a twin); ``registry``: the agents' (loaded when
    None)."""
    from gymnasium import spaces

    from dse.agents.base import Forecast as AgentForecast
    from dse.agents.base import load_agents, make_agent

    space = game.table.space
    names = game.names
    act = spaces.Dict({n: spaces.Discrete(k) for n, k in zip(names, game.sizes)})
    obs, _ = game.reset(options=options)

    def key_of(action: dict[str, int]) -> Key:
        return tuple(int(action[n]) for n in names)

    def mask(action: dict[str, int]) -> bool:
        k = key_of(action)
        return k in game.forecasts and k not in game.tried

    def forecast(action: dict[str, int]) -> AgentForecast | None:
        f = game.forecasts.get(key_of(action))
        return None if f is None else AgentForecast(f.reward, f.peak_memory_gib, f.memory_gib)

    agent = make_agent(agent_name, registry or load_agents(), act, seed=seed, action_mask=mask, forecast=forecast)
    ep = Episode(observations=[obs])
    sign = 1.0 if space.objective.sense == "maximize" else -1.0
    fail = space.objective.failed_reward
    while True:
        action = agent.propose()
        if action is None:
            ep.step(game, action_of([0] * len(names), stop=True), sign)
            return ep
        if ep.step(game, action_of(key_of(action)), sign):
            return ep
        status = game.history.status or "rejected"
        reward = ep.value[-1] * sign if status == "ok" else fail
        agent.observe(action, reward, status == "ok", status="rejected" if status == REPEAT else status, metrics={})


@dataclass(frozen=True)
class SuiteExport:
    """What ``dse export minari-suite`` wrote: per benchmark, its dataset id, episodes and reference returns."""

    datasets: list[tuple[str, int, float, float]]
    seconds: float

    @property
    def episodes(self) -> int:
        return sum(n for _, n, _, _ in self.datasets)


def suite_dataset_id(prefix: str, benchmark_id: str, split: str) -> str:
    """``PREFIX/NAME/SPLIT-v0`` for the suite id ``dse/NAME-v0``."""
    name = benchmark_id.removeprefix("dse/").rsplit("-v", 1)[0]
    return f"{prefix}/{name}/{split}-v0"


def _check_suite_args(split: str, episodes: int, agents: Sequence[str]) -> dict:
    """:func:`to_minari_suite`'s split, episode count and agents checked; the registered agents."""
    from dse.envs import suite

    if split not in suite.SPLITS:
        raise UserError(f"takes one of {', '.join(suite.SPLITS)}; got {split!r}", param="split")
    if isinstance(episodes, bool) or not isinstance(episodes, int) or not 1 <= episodes <= 10_000:
        raise UserError(f"takes an integer from 1 to 10,000; got {episodes!r}", param="episodes")
    if len(set(agents)) != len(agents):
        raise UserError(f"names an agent twice: {', '.join(agents)}", param="agent")
    missing = [a for a in REFERENCE_AGENTS if a not in agents]
    if missing:
        raise UserError(f"the reference scores need the agents {', '.join(REFERENCE_AGENTS)}", param="agent")
    from dse.agents.base import load_agents

    known = load_agents()
    for a in agents:
        if a not in known or a == "policy":
            raise UserError(
                f"no agent {a!r} to export with; take {', '.join(sorted(set(known) - {'policy'}))}", param="agent"
            )
    return known


def _suite_chosen(split: str, only: Sequence[str] | None) -> list:
    """The benchmarks of ``split`` to export: ``only`` those ids (each checked to be of the split), else every one."""
    from dse.envs import suite

    chosen = suite.benchmarks(split)
    if only:
        known_ids = {b.id for b in chosen}
        for o in only:
            if o not in known_ids:
                raise UserError(
                    f"no benchmark {o!r} in the {split} split; its: {', '.join(sorted(known_ids))}", param="benchmark"
                )
        chosen = [b for b in chosen if b.id in set(only)]
    return chosen


def to_minari_suite(
    split: str = "test",
    *,
    episodes: int = 28,
    agents: Sequence[str] = REFERENCE_AGENTS,
    only: Sequence[str] | None = None,
    prefix: str = "dse/suite",
    datasets_path: Path | None = None,
    progress: Any = None,
) -> SuiteExport:
    """Write one Minari dataset per benchmark of ``split`` (``PREFIX/NAME/SPLIT-v0``): ``episodes`` twins of the
    split (0, 1, ... of its range; a replay's one truth ``episodes`` times, agent seeds 0, 1, ...) times each of
    ``agents``, one episode each, played through the benchmark's environment; its reference min and max the mean
    return of ``random`` and ``guided`` over its episodes; its spec the benchmark's id and every argument.
    ``only``: benchmark ids (default: every one of the split)."""
    import time

    _need_minari("export minari-suite")
    known = _check_suite_args(split, episodes, agents)
    chosen = _suite_chosen(split, only)
    check_dataset_id(f"{prefix}/x-v0", param="prefix")
    ids = [suite_dataset_id(prefix, b.id, split) for b in chosen]
    root = datasets_root(datasets_path)
    for dataset_id in ids:
        check_dataset_id(dataset_id, param="prefix")
        if (root / dataset_id).exists():
            raise UserError(f"dataset {dataset_id!r} already exists", file=str(root / dataset_id))
    t0 = time.perf_counter()
    written = []
    for b, dataset_id in zip(chosen, ids):
        game = b.make(split).unwrapped
        assert isinstance(game, SearchGame)
        rng = b.twin_range(split)
        buffers: list[Any] = []
        returns: dict[str, list[float]] = {a: [] for a in agents}
        for i in range(episodes):
            options = None if rng is None else {"twin_seed": rng[0] + i}
            for a in agents:
                ep = agent_episode(game, a, i, options, known)
                returns[a].append(float(np.sum(ep.rewards)))
                ts = -1 if game.twin_seed is None else game.twin_seed
                buffers.append(ep.buffer(len(buffers), options, twin_seed=ts, agent=agents.index(a)))
        ref = (float(np.mean(returns["random"])), float(np.mean(returns["guided"])))
        kwargs = {"split": split, "seed": 0, **game_kwargs(b.budget)}
        description = (
            f"{b.id} ({b.about}), {split} split: {episodes} {'runs' if rng is None else 'twins'} x agents "
            f"{', '.join(agents)} (infos['agent'] indexes this list), one episode each through the environment; "
            "reference min and max: the mean return of random and guided"
        )
        _create(dataset_id, buffers, _spec(b.id, kwargs), root, "dse agents: " + ", ".join(agents), description, ref)
        written.append((dataset_id, len(buffers), *ref))
        if progress is not None:
            progress(dataset_id, len(buffers), ref)
    return SuiteExport(written, time.perf_counter() - t0)
