"""Per-point claims for several workers on one study (``dse run --worker``).

A worker claims a point in the study's own database before it launches it: one row per (study, point) in
the table ``dse_claims``, whose primary key makes the claim atomic (two workers inserting the same point:
one insert wins, the other gets an integrity error and takes another point). A claim holds a lease: the
worker that owns it renews it every ``lease_s / 3`` seconds from a heartbeat thread while the trial runs,
and marks it done once the result is recorded. A claim whose lease ran out (the worker died: killed, its
machine gone) is taken over by the next worker that wants the point, with one conditional UPDATE (only one
taker can match ``expires < now``); that worker reruns the dead worker's trial in place of its
interrupted row. A Ctrl-C gives the worker's claims up at once (lease 0), so ``--resume`` need not wait.

Why a table of our own and not Optuna's RUNNING trials with their heartbeat: Optuna keeps no constraint on a
trial's parameters, so two workers could both start the same point; a primary key on the point is the one
thing that makes "never a point twice" hold without a lock server. The table lives beside Optuna's in the
same database (SQLite or PostgreSQL), created on first use; Optuna ignores tables it does not know.

Trial numbers come from the storage itself in this mode (Optuna's ``create_new_trial``, which numbers a
study's trials in the order the database gave them ids), since no worker can count alone.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from dse.errors import InfrastructureError, UserError
from dse.store import Store, TrialRecord

LEASE_S = 60.0  # a dead worker's points wait this long before another worker reruns them

_META = sa.MetaData()
CLAIMS = sa.Table(
    "dse_claims", _META,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("point", sa.String(2048), primary_key=True),  # the knobs as sorted JSON
    sa.Column("worker", sa.String(64), nullable=False),
    sa.Column("number", sa.Integer, nullable=True),  # the trial, once it has one
    sa.Column("expires", sa.Float, nullable=False),  # time.time() past which the claim is free (done: never)
    sa.Column("done", sa.Boolean, nullable=False, default=False),
)


def point_key(knobs: dict[str, Any]) -> str:
    return json.dumps(knobs, sort_keys=True, default=str)


class Claims:
    """The claims of one worker on one study of ``store`` (an SQL storage)."""

    def __init__(self, store: Store, *, lease_s: float = LEASE_S):
        if not isinstance(store.storage, optuna.storages.RDBStorage):
            raise UserError("--worker needs an SQL storage (sqlite:///... or postgresql+psycopg://...), not a "
                            "journal file", field="--storage")
        self.study, self.lease_s = store.study_name, lease_s
        self.worker = uuid.uuid4().hex[:16]
        args = {"timeout": 60} if store.url.startswith("sqlite") else {}
        self.engine = sa.create_engine(store.url, connect_args=args)
        for attempt in range(6):  # workers starting at once race to create the table: the losers retry
            try:
                _META.create_all(self.engine, checkfirst=True)
                break
            except SQLAlchemyError as e:
                if attempt == 5:
                    raise InfrastructureError(f"cannot create the claims table in {store.url}: {e}") from None
                time.sleep(0.2 * 2**attempt)
        self.held: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="dse-claims-heartbeat", daemon=True)
        self._beat.start()

    # -- claiming ----------------------------------------------------------------------------------
    def claim(self, knobs: dict[str, Any]) -> bool:
        """Whether this worker now holds ``knobs`` (False: another worker holds it, or it is done)."""
        key = point_key(knobs)
        now = time.time()
        c = CLAIMS.c
        row = {"study": self.study, "point": key, "worker": self.worker, "number": None,
               "expires": now + self.lease_s, "done": False}
        try:
            with self.engine.begin() as conn:
                conn.execute(CLAIMS.insert().values(**row))
            got = True
        except IntegrityError:  # claimed before: free only if its lease ran out and it is not done
            with self.engine.begin() as conn:
                got = conn.execute(CLAIMS.update().where(
                    c.study == self.study, c.point == key, c.done.is_(False), c.expires < now).values(
                    worker=self.worker, expires=now + self.lease_s)).rowcount == 1
        if got:
            with self._lock:
                self.held.add(key)
        return got

    def numbered(self, knobs: dict[str, Any], number: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(CLAIMS.update().where(CLAIMS.c.study == self.study, CLAIMS.c.point == point_key(knobs))
                         .values(number=number))

    def done(self, knobs: dict[str, Any]) -> None:
        """The point's result is recorded: the claim is kept for good (no worker runs it again)."""
        key = point_key(knobs)
        with self.engine.begin() as conn:
            conn.execute(CLAIMS.update().where(CLAIMS.c.study == self.study, CLAIMS.c.point == key,
                                               CLAIMS.c.worker == self.worker).values(done=True))
        with self._lock:
            self.held.discard(key)

    def close(self, *, give_up: bool = True) -> None:
        """Stop the heartbeat; with ``give_up`` the claims still held expire now (interrupted: rerun at once)."""
        self._stop.set()
        self._beat.join(timeout=10)
        with self._lock:
            held, self.held = set(self.held), set()
        if give_up and held:
            try:
                with self.engine.begin() as conn:
                    conn.execute(CLAIMS.update().where(CLAIMS.c.study == self.study, CLAIMS.c.point.in_(held),
                                                       CLAIMS.c.worker == self.worker,
                                                       CLAIMS.c.done.is_(False)).values(expires=0.0))
            except SQLAlchemyError:  # the database is gone: the leases run out by themselves
                pass
        self.engine.dispose()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            with self._lock:
                held = set(self.held)
            if not held:
                continue
            try:
                with self.engine.begin() as conn:
                    conn.execute(CLAIMS.update().where(CLAIMS.c.study == self.study, CLAIMS.c.point.in_(held),
                                                       CLAIMS.c.worker == self.worker)
                                 .values(expires=time.time() + self.lease_s))
            except SQLAlchemyError:  # a missed beat: the next one tries again (the lease has slack)
                continue


def add_trial(store: Store, rec: TrialRecord, run_dir: Callable[[int], Any] | None = None) -> int:
    """Add ``rec`` (its number ignored) as a new RUNNING trial numbered by the storage; its number. The row
    says ``failed``/``interrupted`` until its result replaces it (:meth:`dse.store.Store.replace`), which is
    what a worker killed mid-trial leaves behind; ``run_dir(number)`` is recorded in it once numbered."""
    dists = {k: CategoricalDistribution(list(v.choices)) for k, v in store.distributions.items()}
    attrs = {"status": rec.status, "reason": rec.reason, "reward": rec.reward, "run_dir": None,
             "gpu": rec.gpu, "num_gpus": rec.num_gpus, "gpu_hours": rec.gpu_hours, "metrics": rec.metrics}
    template = create_trial(state=TrialState.RUNNING, params=dict(rec.knobs), distributions=dists,
                            user_attrs=attrs)
    try:
        tid = store.storage.create_new_trial(store.study._study_id, template_trial=template)
        number = store.storage.get_trial_number_from_id(tid)
        if run_dir is not None:
            store.storage.set_trial_user_attr(tid, "run_dir", str(run_dir(number)))
        return number
    except SQLAlchemyError as e:
        raise InfrastructureError(f"cannot write the study to {store.url}: {e}") from None
