"""Trials in an Optuna storage (a SQLite file in the output directory by default; any SQLAlchemy URL).

Each trial is one Optuna trial: the varying knobs are its params (categorical over the space's values), the
reward is its value (state COMPLETE) when the run succeeded and the trial is FAIL otherwise (a failure is
never a sentinel value in Optuna; the reward the agent saw is kept in the user attributes). User attributes
carry ``status`` and ``record``: ``reason``, ``reward``, ``run_dir``, ``gpu``, ``num_gpus``, ``gpu_hours`` and
the parsed ``metrics``, whatever is not None (:meth:`Store._attrs` says why). The trial number, which names
the run directory, is assigned here and only here.

Where the store uses its own SQL on Optuna's tables, and why (an RDB storage only; any other storage, e.g.
``JournalStorage``, goes through the public API, ``Study.add_trial`` and ``get_all_trials``):

- Writing (:meth:`Store._flush_rdb`): completed trials are buffered (at most ``batch_size`` of them, for at
  most ``max_delay_s``) and written in one transaction per batch as four multi-row INSERTs (SQLAlchemy Core
  ``executemany``) into Optuna's ``trials``, ``trial_params``, ``trial_user_attributes`` and ``trial_values``.
  ``Study.add_trial`` costs about 15 ms of CPU per trial in RDBStorage (one ORM round trip per parameter),
  which caps a simulated grid at ~90 trials/s; ORM objects per row cost ~1 ms per trial; the Core batch
  well under that (bench/big_grid.py). A killed process loses at most the batch not yet committed; those
  trials have no row, so ``--resume`` runs exactly them again (their run directories are set aside).
- Reading (:meth:`Store.iter_records`): batches of ``READ_BATCH`` trials by ``trial_id`` (the primary
  key), four queries per batch, each distinct distribution JSON parsed once. ``get_all_trials`` builds every
  FrozenTrial of the study at once and parses each parameter's distribution JSON (the whole choice list)
  once per trial: reading a 200k-trial study that way took minutes and gigabytes. What is read is what
  :func:`record_from_trial` makes of the same trial through Optuna's API (a test checks the two agree), and
  ``optuna.load_study`` (and optuna-dashboard) see what we write.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterator

import optuna
from optuna.distributions import CategoricalDistribution, distribution_to_json
from optuna.trial import FrozenTrial, TrialState, create_trial

from sqlalchemy.exc import SQLAlchemyError

from dse.errors import InfrastructureError, UserError


def _one_line(e: BaseException) -> str:
    """The first line of an exception's message (SQLAlchemy's carry the SQL and a link on further lines)."""
    text = str(getattr(e, "orig", None) or e)
    return text.splitlines()[0] if text else type(e).__name__

INTERRUPTED = "interrupted"
READ_BATCH = 5_000  # trials per read query batch: what a reader holds at once, whatever the study's size


def _json(value: Any) -> str:
    """A user attribute's JSON as Optuna reads it (``json.loads``), without the spaces ``json.dumps`` puts in."""
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial as the store keeps it."""

    number: int
    knobs: dict[str, Any]
    status: str
    reward: float
    reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    run_dir: str | None = None
    gpu: str | None = None
    num_gpus: int | None = None
    gpu_hours: float | None = None  # GPUs x wall time of the run (0 for a rejected point; None when unknown)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def interrupted(self) -> bool:
        return self.status == "failed" and self.reason == INTERRUPTED


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///FILE`` URL (None for other URLs and in-memory SQLite)."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url[len("sqlite:///"):].partition("?")[0]
    return Path(rest) if rest and rest != ":memory:" else None


def check_url(url: str, *, field: str = "--storage") -> str:
    """``url`` if it names a storage dse can open (a journal file ``*.log`` or a SQLAlchemy URL whose driver
    is installed), else a one-line :class:`UserError`. Connects to nothing and writes nothing."""
    if "://" not in url:
        if url.endswith(".log"):
            return url
        raise UserError(f"{url!r} is not a storage URL (e.g. sqlite:///study.db, postgresql://host/db, or a "
                        "journal file NAME.log)", field=field)
    from sqlalchemy.engine import make_url

    try:
        make_url(url).get_dialect()  # imports the driver module: a missing driver fails here, not mid-study
    except Exception as e:  # ArgumentError, NoSuchModuleError, ImportError: all mean "cannot use this URL"
        raise UserError(f"cannot use storage {url!r}: {_one_line(e)}", field=field) from None
    return url


def exists(url: str, study_name: str) -> bool:
    """Whether ``url`` holds the study ``study_name``; reading only: a missing SQLite file is not created."""
    path = sqlite_path(url)
    if path is not None and (not path.is_file() or path.stat().st_size == 0):
        return False
    if "://" not in url and not Path(url).is_file():
        return False
    storage = _open_storage(url)
    try:
        return study_name in {s.study_name for s in storage.get_all_studies()}
    except (SQLAlchemyError, OSError, ValueError) as e:
        raise UserError(f"cannot read the study database: {_one_line(e)}", file=str(path or url)) from None
    finally:
        if isinstance(storage, optuna.storages.RDBStorage):
            storage.remove_session()
            storage.engine.dispose()


def _open_storage(url: str) -> optuna.storages.BaseStorage:
    try:
        if url.endswith(".log") and "://" not in url:
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(url))
        return optuna.storages.RDBStorage(url)
    except (ImportError, SQLAlchemyError, ValueError, OSError) as e:
        # a corrupt file ("file is not a database"), an unreachable server, a missing driver
        raise UserError(f"cannot open storage {url}: {_one_line(e)}", field="--storage") from None


class Store:
    """The study of one space in one storage. Single writer: ``dse run`` holds a lock on the output dir."""

    def __init__(self, url: str, study_name: str, knob_values: dict[str, list[Any]], *, resume: bool = False,
                 create: bool = True, batch_size: int = 256, max_delay_s: float = 1.0, base: str | Path | None = None):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.url, self.study_name, self.batch_size, self.max_delay_s = url, study_name, batch_size, max_delay_s
        # the study directory, absolute: relative run_dirs are read relative to it (resolve_run_dir)
        self.base = os.path.abspath(base) if base is not None else None
        self.storage = _open_storage(url)
        self.distributions = {k: CategoricalDistribution(list(v)) for k, v in knob_values.items()}
        # Optuna's own JSON of each distribution without json.dumps' spaces (Optuna parses it with json.loads,
        # so the stored value is the same): it is on every parameter row, 12 rows a trial on the big grid
        self._dist_json = {k: _json(json.loads(distribution_to_json(d))) for k, d in self.distributions.items()}
        # get_all_studies, not get_all_study_summaries: the summaries read every trial for the best one
        try:
            exists = study_name in {s.study_name for s in self.storage.get_all_studies()}
        except (SQLAlchemyError, ValueError) as e:
            raise UserError(f"cannot read the study database: {_one_line(e)}", file=url) from None
        if exists and create and not resume:
            raise UserError(f"study {study_name!r} already has trials here; pass --resume to continue it or "
                            "--out another directory", field="--out")
        if not exists and not create:
            raise UserError(f"no study {study_name!r} in {url}")
        self.study = optuna.create_study(storage=self.storage, study_name=study_name, direction="maximize",
                                         load_if_exists=True)
        self._pending: list[TrialRecord] = []
        self.closed = False
        self.batches_read = 0  # read batches so far (tests check that a reader streams)
        self._flushed_at = time.monotonic()
        self._count = self._stored_count()

    def _stored_count(self) -> int:
        """Trials in the storage: a COUNT for RDB storages (reading them all to count them took most of the
        time of opening a large study), ``get_n_trials`` otherwise."""
        if isinstance(self.storage, optuna.storages.RDBStorage):
            from optuna.storages._rdb import models

            session = self.storage.scoped_session()
            try:
                return session.query(models.TrialModel).filter(
                    models.TrialModel.study_id == self.study._study_id).count()
            finally:
                session.close()
        return self.storage.get_n_trials(self.study._study_id)

    # -- writing -------------------------------------------------------------------------------------
    def next_number(self) -> int:
        """The number of the next trial (names its run directory). Assigned here only."""
        return self._count + len(self._pending)

    def record(self, rec: TrialRecord) -> None:
        if rec.number != self.next_number():
            raise RuntimeError(f"trial {rec.number} recorded out of order (expected {self.next_number()})")
        self._pending.append(rec)
        # Batches for fast (simulated) trials; a trial that took a second or more is written at once, so a
        # killed study of real runs loses nothing that finished.
        if len(self._pending) >= self.batch_size or time.monotonic() - self._flushed_at >= self.max_delay_s:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        try:
            if isinstance(self.storage, optuna.storages.RDBStorage):
                self._flush_rdb(self._pending)
            else:
                for rec in self._pending:
                    self.study.add_trial(self._frozen(rec))
        except (OSError, SQLAlchemyError) as e:
            # the store cannot be written (disk full, read-only, database gone): dse's failure, not a trial's;
            # these trials are not recorded and --resume runs them again
            self._pending = []
            raise InfrastructureError(f"cannot write the study to {self.url}: {_one_line(e)}") from None
        self._count += len(self._pending)
        self._pending = []
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            if isinstance(self.storage, optuna.storages.RDBStorage):
                self.storage.remove_session()
                self.storage.engine.dispose()

    def _attrs(self, rec: TrialRecord) -> dict[str, Any]:
        """The user attributes of ``rec``: ``status``, and ``record`` holding the rest (reason, reward, run_dir,
        gpu, num_gpus, gpu_hours, metrics). Decision: one attribute for the rest, not one each, and whatever is
        None left out (the reader gives None for a missing one). Every attribute is a row of Optuna's
        ``trial_user_attributes`` with its own index entry, and a failed run's metrics are mostly None: this
        took the attributes of a simulated grid from 1,070 to about 400 bytes a trial (bench/big_grid.py).
        ``status`` stays an attribute of its own: optuna-dashboard shows and filters by it. Studies written
        with one attribute each are read as before (:func:`_record`)."""
        rest = {"reason": rec.reason, "reward": rec.reward, "run_dir": rec.run_dir, "gpu": rec.gpu,
                "num_gpus": rec.num_gpus, "gpu_hours": rec.gpu_hours,
                "metrics": {k: v for k, v in rec.metrics.items() if v is not None}}
        return {"status": rec.status, "record": {k: v for k, v in rest.items() if v is not None}}

    def _frozen(self, rec: TrialRecord) -> FrozenTrial:
        state = trial_state(rec)
        return create_trial(state=state, value=rec.reward if state == TrialState.COMPLETE else None,
                            params=dict(rec.knobs), distributions=self.distributions, user_attrs=self._attrs(rec))

    def _flush_rdb(self, recs: list[TrialRecord]) -> None:
        from sqlalchemy import func, insert, select
        from optuna.storages._rdb import models

        T, P, A, V = models.TrialModel, models.TrialParamModel, models.TrialUserAttributeModel, models.TrialValueModel
        storage: optuna.storages.RDBStorage = self.storage
        study_id = self.study._study_id
        now = dt.datetime.now()
        dist_json = self._dist_json
        session = storage.scoped_session()  # one transaction for the whole batch
        try:
            start = session.query(T).filter(T.study_id == study_id).count()
            if start != recs[0].number:
                raise RuntimeError(f"another writer added trials to {self.study_name!r} (expected {recs[0].number}, "
                                   f"found {start})")
            before = session.execute(select(func.max(T.trial_id))).scalar() or 0
            states = [trial_state(r) for r in recs]  # COMPLETE, PRUNED or FAIL
            session.execute(insert(T.__table__), [
                {"number": r.number, "study_id": study_id, "state": st, "datetime_start": now,
                 "datetime_complete": now} for r, st in zip(recs, states)])
            ids = dict(session.execute(select(T.number, T.trial_id).where(
                T.trial_id > before, T.study_id == study_id, T.number >= recs[0].number,
                T.number <= recs[-1].number)).all())
            params, attrs, values = [], [], []
            for r, st in zip(recs, states):
                tid = ids[r.number]
                params += [{"trial_id": tid, "param_name": k, "distribution_json": dist_json[k],
                            "param_value": self.distributions[k].to_internal_repr(v)} for k, v in r.knobs.items()]
                attrs += [{"trial_id": tid, "key": k, "value_json": _json(v)} for k, v in self._attrs(r).items()]
                if st == TrialState.COMPLETE:
                    value, vtype = V.value_to_stored_repr(r.reward)
                    values.append({"trial_id": tid, "objective": 0, "value": value, "value_type": vtype})
            if params:
                session.execute(insert(P.__table__), params)
            session.execute(insert(A.__table__), attrs)
            if values:
                session.execute(insert(V.__table__), values)
            session.commit()
        except BaseException:
            session.rollback()
            raise

    def replace(self, rec: TrialRecord) -> None:
        """Write ``rec`` over the stored trial of the same number (its params are the same point): the rerun of
        an interrupted trial, or the result of a trial whose placeholder was recorded at launch
        (``dse.parallel``). One transaction through Optuna's ORM models, as :meth:`flush` writes (Optuna's
        public API refuses to change a finished trial). Storages other than RDB cannot be rewritten: the
        record is added as a new trial there (the interrupted row stays beside it)."""
        self.flush()
        if not isinstance(self.storage, optuna.storages.RDBStorage):
            self.record(TrialRecord(**{**rec.__dict__, "number": self.next_number()}))
            return
        from optuna.storages._rdb import models

        state = trial_state(rec)
        session = self.storage.scoped_session()
        try:
            t = session.query(models.TrialModel).filter(models.TrialModel.study_id == self.study._study_id,
                                                        models.TrialModel.number == rec.number).one()
            t.state, t.datetime_complete = state, dt.datetime.now()
            for old in list(t.user_attributes) + list(t.values):
                session.delete(old)
            session.flush()  # the old rows go first: (trial, key) is unique
            session.expire(t, ["user_attributes", "values"])
            t.user_attributes = [models.TrialUserAttributeModel(key=k, value_json=_json(v))
                                 for k, v in self._attrs(rec).items()]
            if state == TrialState.COMPLETE:
                value, vtype = models.TrialValueModel.value_to_stored_repr(rec.reward)
                t.values = [models.TrialValueModel(objective=0, value=value, value_type=vtype)]
            session.commit()
        except (OSError, SQLAlchemyError) as e:
            session.rollback()
            raise InfrastructureError(f"cannot write the study to {self.url}: {_one_line(e)}") from None
        except BaseException:
            session.rollback()
            raise

    # -- reading -------------------------------------------------------------------------------------
    def records(self) -> list[TrialRecord]:
        """Every trial in number order (pending ones included), as one list: for small studies and tests;
        readers of a whole study (leaderboard, report, resume, best) use :meth:`iter_records`."""
        return sorted(self.iter_records(), key=lambda r: r.number)

    def iter_records(self, batch_size: int = READ_BATCH) -> Iterator[TrialRecord]:
        """Every trial once (pending ones flushed first), in the order they were written (number order for
        this store's writes), read ``batch_size`` at a time: a reader holds one batch, not the study."""
        self.flush()
        if isinstance(self.storage, optuna.storages.RDBStorage):
            yield from self._iter_rdb(batch_size)
            return
        # other storages (journal) keep every trial in memory anyway: the public API, sorted
        trials = self.storage.get_all_trials(self.study._study_id, deepcopy=False)
        for t in sorted(trials, key=lambda t: t.number):
            yield record_from_trial(t, self.base)

    def _iter_rdb(self, batch_size: int) -> Iterator[TrialRecord]:
        """Batches by ``trial_id`` (the primary key, so each batch is an index range, never a sort of the
        study); four queries per batch (see the module docstring for why not ``get_all_trials``)."""
        from sqlalchemy import select
        from optuna.distributions import json_to_distribution
        from optuna.storages._rdb import models

        T, P, A, V = models.TrialModel, models.TrialParamModel, models.TrialUserAttributeModel, models.TrialValueModel
        sid = self.study._study_id
        dists: dict[str, Any] = {}  # distribution JSON -> distribution, parsed once per distinct JSON
        last = -1
        while True:
            session = self.storage.scoped_session()
            conn = session.connection()  # Core rows: no ORM row processing per value
            try:
                rows = conn.execute(select(T.trial_id, T.number, T.state).where(
                    T.study_id == sid, T.trial_id > last).order_by(T.trial_id).limit(batch_size)).all()
                if not rows:
                    return
                ids = [r[0] for r in rows]
                params: dict[int, dict[str, Any]] = {}
                for tid, name, value, djson in conn.execute(select(
                        P.trial_id, P.param_name, P.param_value, P.distribution_json).where(P.trial_id.in_(ids))):
                    d = dists.get(djson)
                    if d is None:
                        d = dists[djson] = json_to_distribution(djson)
                    params.setdefault(tid, {})[name] = d.to_external_repr(value)
                attrs: dict[int, dict[str, Any]] = {}
                for tid, key, vjson in conn.execute(select(A.trial_id, A.key, A.value_json).where(
                        A.trial_id.in_(ids))):
                    attrs.setdefault(tid, {})[key] = json.loads(vjson)
                values = {tid: V.stored_repr_to_value(v, vt) for tid, v, vt in conn.execute(select(
                    V.trial_id, V.value, V.value_type).where(V.trial_id.in_(ids), V.objective == 0))}
            finally:
                session.close()
            self.batches_read += 1
            for tid, number, state in rows:
                yield _record(number, TrialState(state) if not isinstance(state, TrialState) else state,
                              params.get(tid, {}), attrs.get(tid, {}), values.get(tid), self.base)
            last = ids[-1]
            del rows, params, attrs, values


def trial_state(rec: TrialRecord) -> TrialState:
    """COMPLETE for an ok trial with a finite reward, PRUNED for a pruned one (a loser stopped early, which
    is what Optuna's PRUNED means; it has no value), FAIL for the rest."""
    if rec.status == "pruned":
        return TrialState.PRUNED
    return TrialState.COMPLETE if rec.ok and math.isfinite(rec.reward) else TrialState.FAIL


def resolve_run_dir(run_dir: str | None, base: str | Path | None) -> str | None:
    """A stored ``run_dir`` as a path a reader can open. Decision: the study writes it relative to the study
    directory (``trials/00003``), so a moved or copied study directory still finds its runs; it is resolved
    here against ``base``, the study directory as it is now. Absolute paths (an older study, or a run
    directory outside the study) are kept; an older relative one (written relative to the working
    directory, ``runs/x/trials/00003``) is resolved from its ``trials/`` component on."""
    # string operations, not pathlib: this runs once per trial read (pathlib took a fifth of a 200k-trial read)
    if run_dir is None or base is None or os.path.isabs(run_dir):
        return run_dir
    parts = run_dir.split("/")
    if "trials" in parts:
        parts = parts[len(parts) - 1 - parts[::-1].index("trials"):]
    base = base if isinstance(base, str) else os.path.abspath(base)
    return os.path.join(base, *parts)


def record_from_trial(t: FrozenTrial, base: str | Path | None = None) -> TrialRecord:
    return _record(t.number, t.state, dict(t.params), t.user_attrs, t.value, base)


def _record(number: int, state: TrialState, params: dict[str, Any], a: dict[str, Any], value: float | None,
            base: str | Path | None = None) -> TrialRecord:
    if "record" in a:  # the layout Store._attrs writes; an attribute of its own (an older study) is read as is
        a = {**a, **a["record"]}
    status = a.get("status") or ("ok" if state == TrialState.COMPLETE else "failed")
    reward = a.get("reward", value if value is not None else float("nan"))
    return TrialRecord(number=number, knobs=params, status=status, reward=reward,
                       reason=a.get("reason") or (None if status == "ok" else f"optuna state {state.name}"),
                       metrics=a.get("metrics") or {}, run_dir=resolve_run_dir(a.get("run_dir"), base), gpu=a.get("gpu"),
                       num_gpus=a.get("num_gpus"), gpu_hours=a.get("gpu_hours"))
