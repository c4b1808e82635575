"""Trials in dse's own tables (SQLAlchemy Core): a SQLite file in the output directory by default, any
SQLAlchemy URL (PostgreSQL for several ``--worker`` processes on one study).

The schema, version :data:`SCHEMA_VERSION` (kept in ``dse_meta``):

- ``dse_studies``: a study a row: its id, its unique name and the values of its knobs (JSON).
- ``dse_trials``: a trial a row, keyed (study, number), in ONE layout whoever wrote it (a single ``dse run``,
  a worker's placeholder, a rerun replacing an interrupted row): the knobs (JSON), ``status``, ``reward``
  (NULL for NaN), ``reason``, ``run_dir`` (relative to the study directory: :func:`resolve_run_dir`), ``gpu``,
  ``num_gpus``, ``gpu_hours`` and the parsed ``metrics`` (JSON, None values left out). The trial number,
  which names the run directory, is assigned here and only here: by counting for a single writer
  (:meth:`Store.next_number`), by the database for workers (:meth:`Store.add_numbered`; the primary key
  makes two workers taking one number impossible).
- ``dse_claims``: the per-point claims of workers (:mod:`dse.study.claims` says how they work).
- ``dse_fingerprints``: a study's fingerprint (what defines it, :func:`dse.study.outdir.fingerprint`), written with
  the study in one transaction; a resume is checked against it, never against a file beside the store. A
  store of a dse that kept none gains the table and the row at its first resume (an added table: the schema
  version is unchanged, and an older dse ignores it).

Optuna is the sampler, not the store: the Optuna agent keeps its own in-memory study and is shown the stored
history on resume. ``dse export optuna`` (:mod:`dse.results.export`) writes a study into an Optuna storage through
Optuna's public API, for optuna-dashboard.

Decisions:

- A database of an older dse (Optuna's tables, no ``dse_meta``) is migrated once, when a study in it is first
  opened: its trials are read through Optuna's public API (``optuna.load_study``, ``Study.get_trials``) and
  written into dse's tables of the same database in one transaction; Optuna's tables are left as they were.
  Reading a large Optuna study that way is slow and holds it whole, once: the 200,000 trials of
  ``bench/store_scale.py --knobs 12 --values 4`` written by the older dse took 256 s and 6.3 GiB peak RSS.
  A database of a newer schema version is refused with a one-line error (upgrade dse).
- A journal file (``NAME.log``) is not a dse store: ``--storage`` takes SQLAlchemy URLs only (the export
  writes journal files).
- Writing: finished trials are buffered (at most ``batch_size``, for at most ``max_delay_s``) and written as
  one multi-row INSERT a batch. A killed process loses at most the batch not yet committed: those trials
  have no row, so ``--resume`` runs exactly them again (their run directories are set aside).
- Reading (:meth:`Store.iter_records`): ``READ_BATCH`` trials a query, by number (the primary key: an index
  range, never a sort of the study), so a reader holds one batch, not the study.
- Processes racing on one database (workers creating the tables, or taking the next trial number) go through
  :func:`dse.fsutil.retry`, the one retry helper (jittered, so racers spread out).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError

from dse.errors import InfrastructureError, UserError
from dse.fsutil import retry
from dse.logs.parse import Status

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

INTERRUPTED = Status.INTERRUPTED.value
READ_BATCH = 5_000  # trials per read query: what a reader holds at once, whatever the study's size
SCHEMA_VERSION = 1

_META = sa.MetaData()
META = sa.Table(
    "dse_meta",
    _META,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)
STUDIES = sa.Table(
    "dse_studies",
    _META,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(512), nullable=False, unique=True),
    sa.Column("knobs", sa.Text, nullable=False),  # {knob: [values]} as JSON
)
TRIALS = sa.Table(
    "dse_trials",
    _META,
    sa.Column("study_id", sa.Integer, sa.ForeignKey("dse_studies.id"), primary_key=True),
    sa.Column("number", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("knobs", sa.Text, nullable=False),  # {knob: value} as JSON
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("reward", sa.Double, nullable=True),  # NULL: NaN (SQLite cannot store NaN)
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("run_dir", sa.Text, nullable=True),
    sa.Column("gpu", sa.String(64), nullable=True),
    sa.Column("num_gpus", sa.Integer, nullable=True),
    sa.Column("gpu_hours", sa.Double, nullable=True),
    sa.Column("metrics", sa.Text, nullable=False),  # {metric: value} as JSON, None values left out
)
CLAIMS = sa.Table(
    "dse_claims",
    _META,
    sa.Column("study_id", sa.Integer, sa.ForeignKey("dse_studies.id"), primary_key=True),
    sa.Column("point", sa.String(2048), primary_key=True),  # the knobs as sorted JSON
    sa.Column("worker", sa.String(64), nullable=False),
    sa.Column("number", sa.Integer, nullable=True),  # the trial, once it has one
    sa.Column("expires", sa.Double, nullable=False),  # time.time() past which the claim is free (done: never)
    sa.Column("done", sa.Boolean, nullable=False, default=False),
)
FINGERPRINTS = sa.Table(
    "dse_fingerprints",
    _META,
    sa.Column("study_id", sa.Integer, sa.ForeignKey("dse_studies.id"), primary_key=True),
    sa.Column("fingerprint", sa.Text, nullable=False),  # {"hash": ..., "fields": {...}} as JSON
)
_READ = (
    TRIALS.c.number,
    TRIALS.c.knobs,
    TRIALS.c.status,
    TRIALS.c.reward,
    TRIALS.c.reason,
    TRIALS.c.run_dir,
    TRIALS.c.gpu,
    TRIALS.c.num_gpus,
    TRIALS.c.gpu_hours,
    TRIALS.c.metrics,
)

T = TypeVar("T")
RACES = (IntegrityError, OperationalError, ProgrammingError)  # what a process racing another one may get


def _one_line(e: BaseException) -> str:
    """The first line of an exception's message (SQLAlchemy's carry the SQL and a link on further lines)."""
    text = str(getattr(e, "orig", None) or e)
    return text.splitlines()[0] if text else type(e).__name__


def _plain(value: Any) -> Any:
    """A numpy scalar as its Python value, for JSON (anything else JSON cannot write is a bug: TypeError)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=_plain)


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
        """A trial with no outcome (:attr:`Status.INTERRUPTED`; a dse before that status wrote such a row as
        ``failed`` with the reason ``interrupted``)."""
        return self.status == INTERRUPTED or (self.status == Status.FAILED and self.reason == INTERRUPTED)


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///FILE`` URL (None for other URLs and in-memory SQLite)."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url[len("sqlite:///") :].partition("?")[0]
    return Path(rest) if rest and rest != ":memory:" else None


#: The storage password, for a URL that carries none (dse.json keeps the URL without it). PostgreSQL's own
#: PGPASSWORD, ~/.pgpass (PGPASSFILE) and service file (PGSERVICEFILE) work as well: libpq reads them itself.
PASSWORD_ENV = "DSE_STORAGE_PASSWORD"


def _parsed(url: str) -> sa.URL | None:
    try:
        return sa.make_url(url)
    except Exception:  # ArgumentError and friends: not a URL SQLAlchemy reads, so it carries no password
        return None


def without_password(url: str) -> str:
    """``url`` as it may be written down (``dse.json``): without its password, if it has one."""
    parsed = _parsed(url)
    if parsed is None or parsed.password is None:
        return url
    bare = sa.URL.create(  # URL.set(password=None) keeps the password: None means "unchanged" there
        parsed.drivername, parsed.username, None, parsed.host, parsed.port, parsed.database, parsed.query
    )
    return bare.render_as_string(hide_password=False)


def shown(url: str) -> str:
    """``url`` as it may be printed: its password as ``***``."""
    parsed = _parsed(url)
    return url if parsed is None or parsed.password is None else parsed.render_as_string(hide_password=True)


def with_password(url: str) -> str | sa.URL:
    """``url`` to connect with: given :data:`PASSWORD_ENV` and a server URL without a password, with that one."""
    secret = os.environ.get(PASSWORD_ENV)
    parsed = _parsed(url)
    if not secret or parsed is None or parsed.password is not None or parsed.get_backend_name() == "sqlite":
        return url
    return parsed.set(password=secret)


def check_url(url: str, *, param: str = "storage") -> str:
    """``url`` if it is an SQLAlchemy URL whose driver is installed, else a one-line :class:`UserError`.
    Connects to nothing and writes nothing."""
    if "://" not in url:
        raise UserError(
            f"{shown(url)!r} is not an SQL storage URL (e.g. sqlite:///study.db or postgresql+psycopg://host/db)",
            param=param,
        )
    try:
        parsed = sa.make_url(url)
        parsed.get_dialect().import_dbapi()  # imports the driver module: a missing driver fails here, not mid-study
    except Exception as e:  # ArgumentError, NoSuchModuleError, ImportError: all mean "cannot use this URL"
        raise UserError(f"cannot use storage {shown(url)!r}: {_one_line(e)}", param=param) from None
    if _in_memory(parsed):
        raise UserError(
            f"{url!r} is an in-memory database: the study would vanish when dse exits; give a file "
            "(sqlite:///study.db) or a server",
            param=param,
        )
    return url


def _in_memory(url: sa.URL) -> bool:
    """Whether an SQLite URL names no file: ``sqlite://``, ``sqlite:///:memory:``, or a ``mode=memory`` or
    ``:memory:`` URI (SQLAlchemy's and SQLite's spellings of an in-memory database)."""
    if url.get_backend_name() != "sqlite":
        return False
    db = url.database or ""
    return db in ("", ":memory:") or db.startswith("file::memory:") or url.query.get("mode") == "memory"


def make_engine(url: str) -> sa.Engine:
    """An engine for ``url``; SQLite waits up to a minute for another process's write instead of failing."""
    check_url(url)
    return sa.create_engine(with_password(url), connect_args={"timeout": 60} if url.startswith("sqlite") else {})


def exists(url: str, study_name: str) -> bool:
    """Whether ``url`` holds the study ``study_name`` (in dse's tables, or in an older dse's Optuna tables);
    reading only: a missing SQLite file is not created, no table is."""
    path = sqlite_path(url)
    if path is not None and (not path.is_file() or path.stat().st_size == 0):
        return False
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
            if _dse_version(conn, tables) is not None and _find_study(conn, study_name) is not None:
                return True
        return _optuna_tables(tables) and _legacy_study(url, study_name, load=False) is not None
    except SQLAlchemyError as e:
        raise UserError(f"cannot read the study database: {_one_line(e)}", file=str(path or url)) from None
    finally:
        engine.dispose()


def _dse_version(conn: sa.Connection, tables: set[str]) -> int | None:
    """The schema version of dse's tables (None: there are none); a newer one than this dse's is refused."""
    if "dse_meta" not in tables:
        return None
    value = conn.execute(sa.select(META.c.value).where(META.c.key == "schema_version")).scalar()
    if value is None:
        return None  # another process is creating them (SQLite runs DDL outside the transaction)
    if int(value) > SCHEMA_VERSION:
        raise UserError(
            f"written by a newer dse (store schema {value}; this dse reads {SCHEMA_VERSION}): upgrade dse",
            file=str(conn.engine.url),
        )
    return int(value)


def _optuna_tables(tables: set[str]) -> bool:
    """Whether the database has Optuna's tables (an older dse's store)."""
    return {"studies", "trials"} <= tables


def _create_schema(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        _META.create_all(conn, checkfirst=True)
        if conn.execute(sa.select(META.c.value).where(META.c.key == "schema_version")).scalar() is None:
            conn.execute(sa.insert(META).values(key="schema_version", value=str(SCHEMA_VERSION)))


def _find_study(conn: sa.Connection, name: str) -> int | None:
    return conn.execute(sa.select(STUDIES.c.id).where(STUDIES.c.name == name)).scalar()


class Store:
    """The study of one space in one database. Single writer (``dse run`` holds a lock on the output dir),
    except through :meth:`add_numbered` and :meth:`replace`, which workers on one study use."""

    def __init__(
        self,
        url: str,
        study_name: str,
        knob_values: dict[str, list[Any]],
        *,
        resume: bool = False,
        create: bool = True,
        batch_size: int = 256,
        max_delay_s: float = 1.0,
        base: str | Path | None = None,
        fingerprint: dict[str, Any] | None = None,
    ):
        self.url, self.study_name, self.batch_size, self.max_delay_s = url, study_name, batch_size, max_delay_s
        # the study directory, absolute: relative run_dirs are read relative to it (resolve_run_dir)
        self.base = os.path.abspath(base) if base is not None else None
        self.engine = make_engine(url)
        try:
            with self.engine.connect():  # a server that cannot be reached fails now, not after the retries
                pass
            self.study_id = retry(
                lambda: self._open(knob_values, create=create, resume=resume, fingerprint=fingerprint),
                on=RACES,
                attempts=8,
                first_wait_s=0.1,
                jitter=0.5,
            )
            self._count = self._stored_count()
        except (SQLAlchemyError, OSError) as e:  # a corrupt file ("file is not a database"), a server gone
            self.engine.dispose()
            if sqlite_path(url) is not None:
                raise UserError(f"cannot read the study database: {_one_line(e)}", file=url) from None
            raise UserError(f"cannot open storage {shown(url)}: {_one_line(e)}", param="storage") from None
        except BaseException:
            self.engine.dispose()
            raise
        self._pending: list[TrialRecord] = []
        self.closed = False
        self.batches_read = 0  # read batches so far (tests check that a reader streams)
        self._flushed_at = time.monotonic()

    def _open(
        self, knob_values: dict[str, list[Any]], *, create: bool, resume: bool, fingerprint: dict[str, Any] | None
    ) -> int:
        """The study's id: found, migrated from an older dse's Optuna tables, or created (``create``, with its
        ``fingerprint``; a migrated study gets none here: its resume checks and records it)."""
        with self.engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
            ready = _dse_version(conn, tables) is not None
            sid = _find_study(conn, self.study_name) if ready else None
        legacy = None
        if sid is None and _optuna_tables(tables):
            legacy = _legacy_study(self.url, self.study_name, load=True)
        if (sid is not None or legacy is not None) and create and not resume:
            raise UserError(
                f"study {self.study_name!r} already has trials here; pass {{param:resume}} to continue it or "
                "{param:out} another directory",
                param="out",
            )
        if sid is not None:
            return sid
        if legacy is None and not create:
            raise UserError(f"no study {self.study_name!r} in {shown(self.url)}")
        if not ready:
            _create_schema(self.engine)
        with self.engine.begin() as conn:  # the study and, migrated, its trials: all or nothing
            key = conn.execute(
                sa.insert(STUDIES).values(name=self.study_name, knobs=_json(knob_values))
            ).inserted_primary_key
            assert key is not None  # an INSERT's result carries the row's primary key
            sid = key[0]
            migrated = legacy or []
            for start in range(0, len(migrated), READ_BATCH):
                conn.execute(sa.insert(TRIALS), [_row(sid, r) for r in migrated[start : start + READ_BATCH]])
            if fingerprint is not None and legacy is None:
                FINGERPRINTS.create(conn, checkfirst=True)
                conn.execute(sa.insert(FINGERPRINTS).values(study_id=sid, fingerprint=_json(fingerprint)))
        return sid

    # -- the study's definition ----------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any] | None:
        """The fingerprint stored with the study (None: a study of a dse that kept none, or a damaged one)."""
        with self.engine.connect() as conn:
            if not sa.inspect(conn).has_table(FINGERPRINTS.name):
                return None
            text = conn.execute(
                sa.select(FINGERPRINTS.c.fingerprint).where(FINGERPRINTS.c.study_id == self.study_id)
            ).scalar()
        try:
            value = json.loads(text) if text is not None else None
        except ValueError:
            return None
        return value if isinstance(value, dict) and isinstance(value.get("fields"), dict) else None

    def set_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        """Store the fingerprint of a study that has none (a study of an older dse, at its first resume)."""
        try:
            with self.engine.begin() as conn:
                FINGERPRINTS.create(conn, checkfirst=True)
                conn.execute(sa.insert(FINGERPRINTS).values(study_id=self.study_id, fingerprint=_json(fingerprint)))
        except IntegrityError:
            pass  # another worker recorded it first (from the same space: both were checked against the trials)
        except (OSError, SQLAlchemyError) as e:
            raise self._write_error(e) from None

    def gpus(self) -> set[str]:
        """The GPU generations the study's stored trials ran on."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(TRIALS.c.gpu).where(TRIALS.c.study_id == self.study_id, TRIALS.c.gpu.is_not(None)).distinct()
            ).all()
        return {r[0] for r in rows}

    def _stored_count(self) -> int:
        """The next number after the stored trials (their count: numbers have no gaps)."""
        with self.engine.connect() as conn:
            return conn.execute(
                sa.select(sa.func.coalesce(sa.func.max(TRIALS.c.number) + 1, 0)).where(
                    TRIALS.c.study_id == self.study_id
                )
            ).scalar_one()

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
        pending, self._pending = self._pending, []
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(TRIALS), [_row(self.study_id, r) for r in pending])
        except IntegrityError:  # the numbers are taken: not through --worker, so nothing keeps them apart
            raise InfrastructureError(
                f"another dse wrote trials {pending[0].number}.. of study {self.study_name!r} "
                f"to {shown(self.url)} (several processes on one study: --worker each)"
            ) from None
        except (OSError, SQLAlchemyError) as e:
            # the store cannot be written (disk full, read-only, database gone): dse's failure, not a trial's;
            # these trials are not recorded and --resume runs them again
            raise self._write_error(e) from None
        self._count += len(pending)
        self._flushed_at = time.monotonic()

    def _write_error(self, e: BaseException) -> InfrastructureError:
        return InfrastructureError(f"cannot write the study to {shown(self.url)}: {_one_line(e)}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            self.engine.dispose()

    def replace(self, rec: TrialRecord) -> None:
        """Write ``rec`` over the stored trial of the same number (its point is the same): the rerun of an
        interrupted trial, or the result of a trial whose placeholder was recorded at launch."""
        self.flush()
        row = _row(self.study_id, rec)
        try:
            with self.engine.begin() as conn:
                found = conn.execute(
                    sa.update(TRIALS)
                    .where(TRIALS.c.study_id == self.study_id, TRIALS.c.number == rec.number)
                    .values(row)
                ).rowcount
        except (OSError, SQLAlchemyError) as e:
            raise self._write_error(e) from None
        if found != 1:
            raise RuntimeError(f"no trial {rec.number} in study {self.study_name!r} to replace")

    def add_numbered(self, rec: TrialRecord, run_dir: Callable[[int], Any] | None = None) -> int:
        """Add ``rec`` (its number ignored) as the study's next trial, numbered by the database: several
        workers add trials to one study at once, and the primary key gives each number once (a worker that
        lost the race takes the next one). ``run_dir(number)`` is stored as its run directory. Its number."""
        self.flush()

        def add() -> int:
            with self.engine.begin() as conn:
                number = conn.execute(
                    sa.select(sa.func.coalesce(sa.func.max(TRIALS.c.number) + 1, 0)).where(
                        TRIALS.c.study_id == self.study_id
                    )
                ).scalar_one()
                row = _row(self.study_id, rec)
                row.update(number=number, run_dir=str(run_dir(number)) if run_dir is not None else rec.run_dir)
                conn.execute(sa.insert(TRIALS).values(row))
            return number

        try:
            number = retry(add, on=RACES, attempts=10, first_wait_s=0.02, jitter=0.5)
        except (OSError, SQLAlchemyError) as e:
            raise self._write_error(e) from None
        self._count = max(self._count, number + 1)
        return number

    # -- reading -------------------------------------------------------------------------------------
    def records(self) -> list[TrialRecord]:
        """Every trial in number order (pending ones included), as one list: for small studies and tests;
        readers of a whole study (leaderboard, report, resume, best) use :meth:`iter_records`."""
        return list(self.iter_records())

    def iter_records(self, batch_size: int = READ_BATCH) -> Iterator[TrialRecord]:
        """Every trial once (pending ones flushed first), in number order, read ``batch_size`` at a time: a
        reader holds one batch, not the study."""
        self.flush()
        last, base, loads, nan = -1, self.base, json.loads, math.nan
        while True:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(*_READ)
                    .where(TRIALS.c.study_id == self.study_id, TRIALS.c.number > last)
                    .order_by(TRIALS.c.number)
                    .limit(batch_size)
                ).all()
            if not rows:
                return
            self.batches_read += 1
            for number, knobs, status, reward, reason, run_dir, gpu, num_gpus, gpu_hours, metrics in rows:
                yield TrialRecord(
                    number,
                    loads(knobs),
                    status,
                    nan if reward is None else reward,
                    reason,
                    loads(metrics),
                    resolve_run_dir(run_dir, base),
                    gpu,
                    num_gpus,
                    gpu_hours,
                )
            last = rows[-1][0]
            del rows


def _row(study_id: int, rec: TrialRecord) -> dict[str, Any]:
    """``rec`` as a row of ``dse_trials``: the one layout of a trial."""
    reward = float(rec.reward)
    return {
        "study_id": study_id,
        "number": rec.number,
        "knobs": _json(rec.knobs),
        "status": rec.status,
        "reward": None if math.isnan(reward) else reward,
        "reason": rec.reason,
        "run_dir": rec.run_dir,
        "gpu": rec.gpu,
        "num_gpus": rec.num_gpus,
        "gpu_hours": rec.gpu_hours,
        "metrics": _json({k: v for k, v in rec.metrics.items() if v is not None}),
    }


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
        parts = parts[len(parts) - 1 - parts[::-1].index("trials") :]
    base = base if isinstance(base, str) else os.path.abspath(base)
    return os.path.join(base, *parts)


# -- an older dse's store: Optuna's tables, read through Optuna's public API -------------------------------
def _legacy_study(url: str, name: str, *, load: bool) -> list[TrialRecord] | None:
    """The trials of the study ``name`` in Optuna's tables of ``url`` as an older dse wrote them (None: no
    such study); with ``load`` False, [] when it is there (nothing is read)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
    except (RuntimeError, ValueError) as e:  # e.g. Optuna's schema older than the installed Optuna's
        raise UserError(f"cannot read the older dse's study: {_one_line(e)}", file=url) from None
    try:
        if name not in optuna.get_all_study_names(storage=storage):
            return None
        if not load:
            return []
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        return [record_from_trial(t) for t in sorted(trials, key=lambda t: t.number)]
    finally:
        storage.remove_session()
        storage.engine.dispose()


def record_from_trial(t: FrozenTrial, base: str | Path | None = None) -> TrialRecord:
    """The record of an Optuna trial as an older dse stored it: user attributes ``status`` and ``record``
    (reason, reward, run_dir, gpu, num_gpus, gpu_hours, metrics), or, older still, one attribute each."""
    a = t.user_attrs
    if "record" in a:
        a = {**a, **a["record"]}
    status = a.get("status") or ("ok" if t.state.name == "COMPLETE" else "failed")
    reward = a.get("reward", t.value if t.value is not None else math.nan)
    return TrialRecord(
        number=t.number,
        knobs=dict(t.params),
        status=status,
        reward=reward,
        reason=a.get("reason") or (None if status == "ok" else f"optuna state {t.state.name}"),
        metrics=a.get("metrics") or {},
        run_dir=resolve_run_dir(a.get("run_dir"), base),
        gpu=a.get("gpu"),
        num_gpus=a.get("num_gpus"),
        gpu_hours=a.get("gpu_hours"),
    )
