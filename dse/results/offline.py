"""``dse export minari``: a study written as a Minari dataset (Farama's offline-RL format for Gymnasium environments).

The study is one episode of ``dse/Recipe-v0`` (:mod:`dse.envs.search`): each stored trial, in number order, is one
step. Its action is the trial's knob values as indices into the space's lists; its observation and reward are what
:class:`dse.rl.searchgame.SearchGame` would have returned for that outcome (the model's forecast from the space, the
values from the store); the last step is ``terminated`` when every valid point has run, else ``truncated`` (the
budget, or the agent's own stop). The infos carry, per step, the trial's number, whether it launched, and the
objective's metric (NaN unless ``ok``); the first entry (the reset's) is -1, 0 and NaN.

The dataset keeps the environment's spec (``gym.make("dse/Recipe-v0", space=..., backend=..., twin_seed=...)``, the
space as the study's ``dse.json`` names it), so ``dataset.recover_environment()`` builds the environment again where
that space file is found. Minari writes under ``MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``);
``--datasets-path`` sets it for the export. Needs the ``rl`` extra (Minari with its HDF5 storage).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dse.envs.search import ENV_ID, Table, table
from dse.errors import UserError
from dse.logs.parse import UNLAUNCHED_STATUSES
from dse.rl.searchgame import RUN_COST, WASTE_COST, History, action_of, fraction, reference, value_counts
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
    hist, tried, ep = History(tab.sizes, value_counts(tab.keys, tab.sizes)), set(), Episode()
    ep.observations.append(hist.vector())
    for rec in records:
        key = tuple(space.knobs[n].index(rec.knobs[n]) for n in names)
        launched = rec.status not in UNLAUNCHED_STATUSES and key not in tried
        if launched:
            tried.add(key)
        value = fraction(rec.reward, ref) if rec.ok else 0.0
        gain = hist.record(key, rec.status, value, tab.forecasts.get(key), ref)
        ep.observations.append(hist.vector())
        ep.actions.append(action_of(key))
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
        raise UserError("dse.json names no space file; pass --space FILE", param="space")
    space = load_space(path)
    if {k: list(v) for k, v in space.knobs.items()} != meta["knobs"]:
        raise UserError(f"{path}: its knobs are not the study's; pass the study's space with --space", param="space")
    return space, path


def check_dataset_id(dataset_id: str, field: str = "--dataset-id") -> str:
    """``dataset_id`` when it is a Minari dataset id that names a folder inside the datasets folder (see the module
    docstring); a one-line error otherwise. Nothing is created."""
    from minari.dataset.minari_dataset import parse_dataset_id

    allowed = "letters, digits, _ and - in parts separated by /, ending in -vN (dse/nemotron3/guided-v0)"
    if len(dataset_id) > MAX_ID or not DATASET_ID.fullmatch(dataset_id):
        shown = dataset_id if len(dataset_id) <= 80 else dataset_id[:77] + "..."
        raise UserError(f"{shown!r} is not a dataset id: {allowed}, {MAX_ID} characters at most", field=field)
    try:
        parse_dataset_id(dataset_id)  # Minari's own syntax (a namespace of 2 characters at least...)
    except ValueError as e:
        raise UserError(str(e).splitlines()[0], field=field) from None
    return dataset_id


def datasets_root(path: Path | None) -> Path:
    """The datasets folder (``path``, else ``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``), created when
    absent; a one-line error when it is not a folder or cannot be made."""
    root = path or Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    field = "--datasets-path" if path is not None else "MINARI_DATASETS_PATH"
    if (root.exists() or root.is_symlink()) and not root.is_dir():
        raise UserError("is not a directory", file=str(root), field=field)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create: {e.strerror or e}", file=str(root), field=field) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise UserError("cannot write here", file=str(root), field=field)
    return root


def to_minari(
    study_dir: Path, dataset_id: str | None = None, *, space: str | None = None, datasets_path: Path | None = None
):
    """Write the study of ``study_dir`` as the Minari dataset ``dataset_id`` (default ``dse/NAME/study-v0``) under
    ``datasets_path`` (see :func:`datasets_root`); the dataset (a ``minari.MinariDataset``). The id and the folder
    are checked before anything is created."""
    if importlib.util.find_spec("minari") is None or importlib.util.find_spec("h5py") is None:
        raise UserError(MINARI_EXTRA, field="export minari")
    if dataset_id is not None:
        check_dataset_id(dataset_id)
    import gymnasium as gym
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
    if dataset_id is None:
        dataset_id = check_dataset_id(f"dse/{meta['study_name']}/study-v0", field="--dataset-id (the default)")
    root = datasets_root(datasets_path)
    os.environ["MINARI_DATASETS_PATH"] = str(root)  # Minari's documented setting, read when it writes
    spec = gym.spec(ENV_ID)
    spec = gym.envs.registration.EnvSpec(
        id=spec.id,
        entry_point=spec.entry_point,
        vector_entry_point=spec.vector_entry_point,
        kwargs=env_kwargs(meta, path),
    )
    return _create(dataset_id, buf, spec, root, meta)


def _create(dataset_id: str, buf: Any, spec: Any, root: Path, meta: dict[str, Any]):
    """Minari's ``create_dataset_from_buffers``, its errors as one line; a dataset it left half-written removed."""
    import minari

    target = root / dataset_id
    existed = target.exists() or target.is_symlink()
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
    except (ValueError, OSError) as e:
        if not existed:  # Minari refuses an id that exists, so what is there now is this export's, half written
            shutil.rmtree(target, ignore_errors=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write the dataset: {e.strerror or e}", file=str(target)) from None
        raise UserError(str(e).splitlines()[0], param="dataset_id") from None  # an id already taken: one line
