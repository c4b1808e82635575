"""Per-point claims for several workers on one study (``dse run --worker``).

A worker claims a point in the study's own database before it launches it: one row per (study, point) in
the table ``dse_claims``, whose primary key makes the claim atomic (two workers inserting the same point:
one insert wins, the other gets an integrity error and takes another point). A claim holds a lease: the
worker that owns it renews it every ``lease_s / 3`` seconds from a heartbeat thread while the trial runs,
and marks it done once the result is recorded. A claim whose lease ran out (the worker died: killed, its
machine gone) is taken over by the next worker that wants the point, with one conditional UPDATE (only one
taker can match ``expires < now``); that worker reruns the dead worker's trial in place of its
interrupted row. A Ctrl-C gives the worker's claims up at once (lease 0), so ``--resume`` need not wait.

Why a table of its own: nothing in a trial's row keeps two workers from starting the same point; a primary
key on the point is the one thing that makes "never a point twice" hold without a lock server. The table is
part of the store's schema (:mod:`dse.study.store`), in the same database (SQLite or PostgreSQL).

Trial numbers come from the database in this mode (:meth:`dse.study.store.Store.add_numbered`), since no worker
can count alone: the placeholder row of a claimed point is a trial row like any other, in the store's one
layout.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from dse.study.store import CLAIMS, Store, TrialRecord, make_engine

LEASE_S = 60.0  # a dead worker's points wait this long before another worker reruns them


def point_key(knobs: dict[str, Any]) -> str:
    return json.dumps(knobs, sort_keys=True, default=str)


class Claims:
    """The claims of one worker on one study of ``store``, through an engine of its own (a heartbeat thread
    renews them)."""

    def __init__(self, store: Store, *, lease_s: float = LEASE_S):
        self.study_id, self.lease_s = store.study_id, lease_s
        self.worker = uuid.uuid4().hex[:16]
        self.engine = make_engine(store.url)
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
        row = {
            "study_id": self.study_id,
            "point": key,
            "worker": self.worker,
            "number": None,
            "expires": now + self.lease_s,
            "done": False,
        }
        try:
            with self.engine.begin() as conn:
                conn.execute(CLAIMS.insert().values(**row))
            got = True
        except IntegrityError:  # claimed before: free only if its lease ran out and it is not done
            with self.engine.begin() as conn:
                got = (
                    conn.execute(
                        CLAIMS.update()
                        .where(c.study_id == self.study_id, c.point == key, c.done.is_(False), c.expires < now)
                        .values(worker=self.worker, expires=now + self.lease_s)
                    ).rowcount
                    == 1
                )
        if got:
            with self._lock:
                self.held.add(key)
        return got

    def numbered(self, knobs: dict[str, Any], number: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                CLAIMS.update()
                .where(CLAIMS.c.study_id == self.study_id, CLAIMS.c.point == point_key(knobs))
                .values(number=number)
            )

    def done(self, knobs: dict[str, Any]) -> None:
        """The point's result is recorded: the claim is kept for good (no worker runs it again)."""
        key = point_key(knobs)
        with self.engine.begin() as conn:
            conn.execute(
                CLAIMS.update()
                .where(CLAIMS.c.study_id == self.study_id, CLAIMS.c.point == key, CLAIMS.c.worker == self.worker)
                .values(done=True)
            )
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
                    conn.execute(
                        CLAIMS.update()
                        .where(
                            CLAIMS.c.study_id == self.study_id,
                            CLAIMS.c.point.in_(held),
                            CLAIMS.c.worker == self.worker,
                            CLAIMS.c.done.is_(False),
                        )
                        .values(expires=0.0)
                    )
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
                    conn.execute(
                        CLAIMS.update()
                        .where(
                            CLAIMS.c.study_id == self.study_id, CLAIMS.c.point.in_(held), CLAIMS.c.worker == self.worker
                        )
                        .values(expires=time.time() + self.lease_s)
                    )
            except SQLAlchemyError:  # a missed beat: the next one tries again (the lease has slack)
                continue


def add_trial(store: Store, rec: TrialRecord, run_dir: Callable[[int], Any] | None = None) -> int:
    """Add ``rec`` (its number ignored) as the placeholder of a claimed point, numbered by the database; its
    number. The row says ``interrupted`` until its result replaces it (:meth:`Store.replace`), which
    is what a worker killed mid-trial leaves behind; ``run_dir(number)`` is recorded in it."""
    return store.add_numbered(rec, run_dir)
