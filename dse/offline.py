"""``dse export minari``: a study written as a Minari dataset (Farama's offline-RL format for Gymnasium environments).

The study is one episode of ``dse/Recipe-v0`` (:mod:`dse.envs.search`): each stored trial, in number order, is one
step. Its action is the trial's knob values as indices into the space's lists; its observation and reward are what
:class:`dse.searchgame.SearchGame` would have returned for that outcome (the model's forecast from the space, the
values from the store); the last step is ``terminated`` when every valid point has run, else ``truncated`` (the
budget, or the agent's own stop). The infos carry, per step, the trial's number, whether it launched, and the
objective's metric (NaN unless ``ok``); the first entry (the reset's) is -1, 0 and NaN.

The dataset keeps the environment's spec (``gym.make("dse/Recipe-v0", space=..., backend=..., twin_seed=...)``, the
space as the study's ``dse.json`` names it), so ``dataset.recover_environment()`` builds the environment again where
that space file is found. Minari writes under ``MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``);
``--datasets-path`` sets it for the export. Needs the ``rl`` extra (Minari with its HDF5 storage).
"""

from __future__ import annotations

import importlib.util
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dse.envs.search import ENV_ID, Table, table
from dse.errors import UserError
from dse.parse import UNLAUNCHED_STATUSES
from dse.searchgame import RUN_COST, WASTE_COST, History, fraction, reference
from dse.space import Space, load_space
from dse.store import TrialRecord
from dse.study import open_store

MINARI_EXTRA = "dse export minari needs the rl extra: pip install 'dse[rl]' (Minari with its HDF5 storage)"


@dataclass
class Episode:
    """One study as the steps of an episode (lists, as Minari's ``EpisodeBuffer`` takes them)."""

    observations: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminations: list[bool] = field(default_factory=list)
    truncations: list[bool] = field(default_factory=list)
    trial: list[int] = field(default_factory=lambda: [-1])
    launched: list[int] = field(default_factory=lambda: [0])
    value: list[float] = field(default_factory=lambda: [math.nan])


def episode(space: Space, tab: Table, records: list[TrialRecord]) -> Episode:
    """The study's records as one episode of the search game (see the module docstring)."""
    names, ref = space.knob_names, reference(tab.forecasts)
    hist, tried, ep = History(tab.sizes), set(), Episode()
    ep.observations.append(hist.vector())
    for rec in records:
        key = tuple(space.knobs[n].index(rec.knobs[n]) for n in names)
        launched = rec.status not in UNLAUNCHED_STATUSES and key not in tried
        if launched:
            tried.add(key)
        value = fraction(rec.reward, ref) if rec.ok else 0.0
        gain = hist.record(key, rec.status, value, tab.forecasts.get(key), ref)
        ep.observations.append(hist.vector())
        ep.actions.append(np.array(key, dtype=np.int64))
        ep.rewards.append(gain - (RUN_COST if launched else WASTE_COST))
        metric = rec.metrics.get(space.objective.metric)
        ep.trial.append(rec.number)
        ep.launched.append(int(launched))
        ep.value.append(float(metric) if rec.ok and metric is not None else math.nan)
    done = len(tried) >= len(tab.forecasts)
    ep.terminations = [False] * len(records)
    ep.truncations = [False] * len(records)
    if records:
        (ep.terminations if done else ep.truncations)[-1] = True
    return ep


def env_kwargs(meta: dict[str, Any], space_path: str) -> dict[str, Any]:
    """The ``gym.make`` arguments that rebuild the study's environment (JSON-serialisable, for the spec)."""
    fields = (meta.get("fingerprint") or {}).get("fields") or {}
    backend = fields.get("backend") or meta.get("backend") or "sim"
    kwargs: dict[str, Any] = {"space": space_path, "backend": backend}
    if fields.get("twin_seed") is not None:
        kwargs["twin_seed"] = int(fields["twin_seed"])
    return kwargs


def _space(meta: dict[str, Any], given: str | None) -> tuple[Space, str]:
    path = given or meta.get("space")
    if not isinstance(path, str):
        raise UserError("dse.json names no space file; pass --space FILE", field="--space")
    space = load_space(path)
    if {k: list(v) for k, v in space.knobs.items()} != meta["knobs"]:
        raise UserError(f"{path}: its knobs are not the study's; pass the study's space with --space", field="--space")
    return space, path


def to_minari(study_dir: Path, dataset_id: str | None = None, *, space: str | None = None):
    """Write the study of ``study_dir`` as the Minari dataset ``dataset_id`` (default ``dse/NAME/study-v0``); the
    dataset (a ``minari.MinariDataset``)."""
    if importlib.util.find_spec("minari") is None or importlib.util.find_spec("h5py") is None:
        raise UserError(MINARI_EXTRA, field="export minari")
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    store, meta = open_store(study_dir)
    try:
        records = list(store.iter_records())
    finally:
        store.close()
    s, path = _space(meta, space)
    tab = table(s)
    ep = episode(s, tab, records)
    infos = {"trial": np.array(ep.trial), "launched": np.array(ep.launched), "value": np.array(ep.value)}
    buf = EpisodeBuffer(
        id=0,
        observations=ep.observations,
        actions=ep.actions,
        rewards=ep.rewards,
        terminations=ep.terminations,
        truncations=ep.truncations,
        infos=infos,
    )
    dataset_id = dataset_id or f"dse/{meta['study_name']}/study-v0"
    spec = gym.spec(ENV_ID)
    spec = gym.envs.registration.EnvSpec(
        id=spec.id,
        entry_point=spec.entry_point,
        vector_entry_point=spec.vector_entry_point,
        kwargs=env_kwargs(meta, path),
    )
    try:
        with warnings.catch_warnings():
            # Minari recommends an author, an e-mail and a code link; a study has none of its own to give
            warnings.filterwarnings("ignore", message=r"`(code_permalink|author|author_email)` is set to None")
            return minari.create_dataset_from_buffers(
                dataset_id,
                [buf],
                env=spec,
                eval_env=spec,
                algorithm_name=f"dse {meta.get('agent', 'study')}",
                description=f"dse study {meta['study_name']}: one episode of {ENV_ID}, one step per trial",
            )
    except ValueError as e:  # an id already taken, or one Minari's syntax refuses: one line
        raise UserError(str(e).splitlines()[0], field="--dataset-id") from None


def datasets_path(path: Path | None) -> None:
    """Point Minari at ``path`` (its documented ``MINARI_DATASETS_PATH``) for this process."""
    if path is not None:
        os.environ["MINARI_DATASETS_PATH"] = str(path)
