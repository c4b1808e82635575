"""``dse export optuna``: a study written into an Optuna storage through Optuna's public API
(``optuna.create_study``, ``optuna.trial.create_trial``, ``Study.add_trials``), so that optuna-dashboard or
``optuna.load_study`` opens it.

Each trial becomes one Optuna trial: its varying knobs are the params (categorical over the space's
values), its reward is the value when the run succeeded (COMPLETE), a pruned run is PRUNED and every other
outcome (a failure, a rejected point, an interrupted run) is FAIL with no value: a failure is never a
sentinel value in Optuna. The user attributes carry what dse knows of the trial: ``status``, ``reason``,
``reward`` (the one the agent saw, failures included), ``run_dir``, ``gpu``, ``num_gpus``, ``gpu_hours`` and
the parsed ``metrics``, whatever is not None. The study's user attributes name its recipe, system and
backend; its metric name (``Study.set_metric_names``) is the objective's, so optuna-dashboard labels the value.

Decision: Optuna's RDB storage writes a trial at a time (an ORM round trip per parameter, about 15 ms a
trial on SQLite), so a large study is faster exported into a journal file (``--storage NAME.log``), which
optuna-dashboard opens as well.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from dse.errors import UserError
from dse.study.loop import open_store
from dse.study.store import Store, TrialRecord, check_url

BATCH = 1_000  # trials handed to Study.add_trials at once (what the export holds, whatever the study's size)
STUDY_ATTRS = ("space", "recipe", "system", "gpu", "num_nodes", "agent", "backend")


def trial_state(rec: TrialRecord):
    """COMPLETE for an ok trial with a finite reward, PRUNED for a pruned one (a loser stopped early, which
    is what Optuna's PRUNED means; it has no value), FAIL for the rest."""
    from optuna.trial import TrialState

    if rec.status == "pruned":
        return TrialState.PRUNED
    return TrialState.COMPLETE if rec.ok and math.isfinite(rec.reward) else TrialState.FAIL


def user_attrs(rec: TrialRecord) -> dict[str, Any]:
    """What dse knows of a trial beyond its params and value, the None values left out."""
    attrs = {
        "status": rec.status,
        "reason": rec.reason,
        "reward": rec.reward,
        "run_dir": rec.run_dir,
        "gpu": rec.gpu,
        "num_gpus": rec.num_gpus,
        "gpu_hours": rec.gpu_hours,
        "metrics": {k: v for k, v in rec.metrics.items() if v is not None},
    }
    return {k: v for k, v in attrs.items() if v is not None}


def frozen_trial(rec: TrialRecord, distributions: dict[str, Any]):
    """``rec`` as an Optuna trial (``optuna.trial.create_trial``)."""
    from optuna.trial import TrialState, create_trial

    state = trial_state(rec)
    return create_trial(
        state=state,
        value=rec.reward if state == TrialState.COMPLETE else None,
        params=dict(rec.knobs),
        distributions=distributions,
        user_attrs=user_attrs(rec),
    )


def metric_name(meta: dict[str, Any]) -> str:
    """The name of the exported value (the reward) for optuna-dashboard: the objective's metric, shown negated
    for a minimised one (the reward is the metric signed so that higher is better); ``reward`` for a study
    whose ``dse.json`` does not name its objective."""
    objective = meta.get("objective")
    if not isinstance(objective, dict) or not isinstance(objective.get("metric"), str):
        return "reward"
    return objective["metric"] if objective.get("direction") != "minimize" else f"reward = -{objective['metric']}"


def _open_storage(url: str):
    """The Optuna storage ``url`` names: a journal file ``NAME.log``, or an SQLAlchemy URL."""
    import optuna

    if "://" not in url and url.endswith(".log"):
        from optuna.storages.journal import JournalFileBackend

        try:
            return optuna.storages.JournalStorage(JournalFileBackend(url))
        except OSError as e:
            raise UserError(f"cannot write {url}: {e.strerror or e}", param="storage") from None
    check_url(url)
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as e:  # an unreachable server, a file that is not a database: one line, not a traceback
        raise UserError(f"cannot open storage {url}: {str(e).splitlines()[0]}", param="storage") from None


def to_optuna(study_dir: Path, url: str) -> tuple[str, int]:
    """Write the study of ``study_dir`` into the Optuna storage ``url`` (a new study of the same name);
    (the study's name, the trials written). A study of that name already there is refused."""
    store, meta = open_store(study_dir)
    try:
        return meta["study_name"], write(store, url, meta)
    finally:
        store.close()


def write(store: Store, url: str, meta: dict[str, Any]) -> int:
    """Write ``store``'s trials into a new study ``meta["study_name"]`` of the Optuna storage ``url``, the
    knobs' distributions from ``meta["knobs"]``; the trials written."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    storage = _open_storage(url)
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            study = optuna.create_study(storage=storage, study_name=meta["study_name"], direction="maximize")
        except optuna.exceptions.DuplicatedStudyError:
            raise UserError(
                f"already holds a study {meta['study_name']!r}; export into another storage, or "
                "delete it first (optuna delete-study)",
                param="storage",
            ) from None
        with warnings.catch_warnings():  # marked experimental since Optuna 3.2; the dashboard reads it
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([metric_name(meta)])  # optuna-dashboard labels the value by it
        for key in STUDY_ATTRS:
            if meta.get(key) is not None:
                study.set_user_attr(key, meta[key])
        distributions = {k: CategoricalDistribution(v) for k, v in meta["knobs"].items()}
        batch: list = []
        n = 0
        for rec in store.iter_records():
            batch.append(frozen_trial(rec, distributions))
            if len(batch) == BATCH:
                study.add_trials(batch)
                n, batch = n + len(batch), []
        study.add_trials(batch)
        return n + len(batch)
    finally:
        if isinstance(storage, optuna.storages.RDBStorage):
            storage.remove_session()
            storage.engine.dispose()
