"""The output directory of a study: where it lives and whether it may be opened.

A directory holds one study: ``dse.json`` (what ran: space file, study name, storage URL, knob names), the
store (``study.db`` by default), ``trials/NNNNN/`` run directories and ``leaderboard.csv``. A lock file
keeps a second ``dse run`` out of a directory in use, unless each is a ``--worker`` (they share it and
claim points in the storage: :mod:`dse.study.claims`). What a trial records is :mod:`dse.study.recording`; the loop
that runs trials is :mod:`dse.study.trials`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from dse.backends.replay import table_path
from dse.errors import InfrastructureError, UserError, infrastructure
from dse.facts import knobs
from dse.fsutil import write_text
from dse.inputs import read_text
from dse.logs import logpack
from dse.rules.space import Space
from dse.study.store import PASSWORD_ENV, Store, check_url, sqlite_path, without_password
from dse.study.store import exists as study_exists

if TYPE_CHECKING:
    from dse.rules.points import Points

META = "dse.json"
DB = "study.db"
LEADERBOARD = "leaderboard.csv"


def trial_dir(out_dir: Path, number: int) -> Path:
    """The run directory of trial ``number`` (the store assigns numbers; this is the one place they become paths)."""
    return Path(out_dir) / "trials" / f"{number:05d}"


def stored_run_dir(number: int) -> str:
    """The run directory as the store keeps it: relative to the study directory (``trials/00003``), so a
    moved or copied study still finds it; readers get it resolved (``dse.study.store.resolve_run_dir``)."""
    return trial_dir(Path("."), number).as_posix()


def storage_url(out_dir: Path) -> str:
    """The default storage of a study in ``out_dir``: its ``study.db``, wherever the directory is now."""
    return f"sqlite:///{(Path(out_dir) / DB).resolve()}"


def stored_storage(meta_storage: str, out_dir: Path) -> str:
    """The storage URL that ``dse.json``'s ``storage`` names. The default is written as the bare file name
    ``study.db`` (relative to the study directory), so a moved or copied study uses its own database; an
    explicit ``--storage`` was made absolute when it was given and is used as written."""
    if meta_storage == DB:
        return storage_url(out_dir)
    return meta_storage


def absolute_storage(url: str) -> str:
    """``--storage`` as given, with a relative SQLite file made absolute now (a relative path
    would otherwise name a different file from every other working directory)."""
    check_url(url)
    if without_password(url) != url:
        print(
            f"the storage URL's password is not kept in {META}; a later dse on this study (a resume, leaderboard) "
            f"reads it from {PASSWORD_ENV}, or libpq's PGPASSWORD, ~/.pgpass or service file",
            file=sys.stderr,
        )
    path = sqlite_path(url)
    if path is not None and not path.is_absolute():
        return "sqlite:///" + str(path.resolve()) + (("?" + url.partition("?")[2]) if "?" in url else "")
    if "://" not in url:
        return str(Path(url).resolve())
    return url


def io_error(e: OSError, what: str) -> InfrastructureError:
    """dse could not write its own output: never a traceback, never a trial outcome."""
    return infrastructure(e, what) or InfrastructureError(f"{what}: {e.strerror or e}")


def read_meta(out_dir: Path) -> dict[str, Any]:
    path = Path(out_dir) / META
    if not path.exists() and not path.is_symlink():
        raise UserError(f"not a dse output directory (no {META})", file=str(out_dir))
    try:
        return _checked_meta(json.loads(read_text(path)), str(path))
    except (json.JSONDecodeError, RecursionError, ValueError) as e:
        raise UserError(
            f"cannot read: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=str(path)
        ) from None


# What every reader of dse.json takes from it, with its JSON type (the rest is read with defaults).
_META_FIELDS: dict[str, tuple[type, str]] = {
    "space_name": (str, "string"),
    "study_name": (str, "string"),
    "storage": (str, "string"),
    "knobs": (dict, "object (knob name: list of values)"),
}


def _checked_meta(meta: Any, f: str) -> dict[str, Any]:
    """``dse.json`` as read, when it is an object with the fields every reader needs (knobs: name -> list)."""
    if not isinstance(meta, dict):
        raise UserError("not a JSON object; a dse.json holds the study's description", file=f)
    for name, (kind, what) in _META_FIELDS.items():
        if not isinstance(meta.get(name), kind):
            raise UserError(f"missing or not a JSON {what} (got {meta.get(name)!r:.60})", file=f, field=name)
    if not all(isinstance(v, list) for v in meta["knobs"].values()):
        raise UserError("each knob's values must be a JSON list", file=f, field="knobs")
    return meta


def new_meta(
    space: Space,
    *,
    storage: str | None,
    agent: str,
    options: dict[str, Any],
    seed: int,
    backend: str,
    points: Points | None = None,
) -> dict[str, Any]:
    """What ``dse.json`` says of a new study (the storage as given, or the bare ``study.db``); ``points``: the
    study's evaluator, which resolves the points it describes."""
    from dse.study.leaderboard import Provenance  # imported where used: only a new study's description needs it

    return {
        "space": space.source,
        "space_name": space.name,
        "study_name": space.name,
        "storage": without_password(storage) if storage else DB,  # a password is never written down
        "knobs": knob_lists(space),
        "recipe": space.recipe,
        "provenance": Provenance.of_space(space, backend).as_dict(),
        "objective": {"metric": space.objective.metric, "direction": space.objective.sense},
        "sizes": trial_sizes(space, points),
        "system": space.system.name,
        "gpu": space.system.gpu,
        "num_nodes": space.num_nodes,
        "gpus_per_node": space.system.gpus_per_node,
        "price_per_gpu_hour": space.system.price_per_gpu_hour,
        "agent": agent,
        "sampler": options.get("sampler"),
        "options": options,
        "seed": seed,
        "backend": backend,
        "fingerprint": fingerprint(space, backend),
    }


# [system.slurm] fields that say how a job is submitted, not what it runs: a resume may change them
_SUBMISSION = ("partition", "account", "time_limit", "job_dir", "max_pending", "exclusive")


def fingerprint_fields(space: Space, backend: str) -> dict[str, Any]:
    """What defines a study, as ``dse.json`` keeps it: trials measured under different values of any of these
    are not comparable, so ``--resume`` refuses a change. The budget, the parallelism, the agent and its
    settings, the seed, the system's name, price and submission settings (account, partition...) may change.
    The system is its content (a renamed or moved file is the same system); a calibration its file's hash, and so
    is a replayed study's table (only for the replay backend, so other studies' fingerprints are as they were)."""
    system = space.system.model_dump(mode="json", exclude={"name", "price_per_gpu_hour"})
    system["slurm"] = {k: v for k, v in system["slurm"].items() if k not in _SUBMISSION}
    b = space.backend
    fields = {
        "recipe": space.recipe,
        "payload": b.payload,
        "system": system,
        "num_nodes": space.num_nodes,
        "settings": dict(space.settings),
        "knobs": knob_lists(space),
        "objective": space.objective.model_dump(mode="json"),
        "backend": backend,
        "flops_convention": b.flops_convention,
        "truth": b.truth if backend == "sim" else None,
        "twin_seed": b.twin_seed if backend == "sim" and b.truth == "twin" else None,
        "calibration": _file_hash(b.calibration) if b.calibration is not None else None,
        **_early_stop_fields(space),
    }
    if backend == "replay" and b.replay is not None:  # the replayed table is the truth: its content, hashed
        fields["replay"] = _file_hash(str(table_path(b.replay)), field="backend.replay")
    return fields


def _early_stop_fields(space: Space) -> dict[str, Any]:
    """Early stop's settings when it is on (trials then run fewer steps: not comparable with full ones); none
    when it is off, so a study fingerprinted before early stop existed keeps its fields."""
    es = space.backend.early_stop
    if not es.enabled:
        return {}
    return {"early_stop": es.model_dump(mode="json", exclude={"enabled", "poll_s"})}


def fingerprint(space: Space, backend: str) -> dict[str, Any]:
    """The study's fingerprint: a hash of :func:`fingerprint_fields` (canonical JSON) and the fields."""
    fields = json.loads(json.dumps(fingerprint_fields(space, backend), default=str))  # as dse.json will hold it
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
    return {"hash": digest, "fields": fields}


def policy_fingerprint(space: Space) -> dict[str, Any]:
    """What a learned policy depends on (its actions, its observations, the twins it trained on): the study's
    fingerprint fields less the backend, the truth and early stop (a policy trains on twins and runs on any backend). A policy
    file keeps it; the ``policy`` agent refuses a policy whose hash is not its space's."""
    fields = fingerprint(space, "sim")["fields"]
    fields = {k: v for k, v in fields.items() if k not in ("backend", "truth", "twin_seed", "early_stop")}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
    return {"hash": digest, "fields": fields}


def _file_hash(path: str, field: str = "backend.calibration") -> str:
    try:
        with open(path, "rb") as fh:
            return "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}", file=path, field=field) from None


def fingerprint_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted names of the fields that differ between two fingerprints' ``fields`` (``system.gpu``)."""
    changed = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changed += fingerprint_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            changed.append(f"{prefix}{key}")
    return changed


def knob_lists(space: Space) -> dict[str, list[Any]]:
    return {k: list(v) for k, v in space.knobs.items()}


def count_run_dirs(out_dir: Path) -> int:
    """How many trials' run directories ``out_dir`` holds, packed ones (dse.logs.logpack) included."""
    d = Path(out_dir) / "trials"
    return (sum(1 for p in d.iterdir() if p.is_dir() and p.name.isdigit()) + logpack.count(d)) if d.is_dir() else 0


def open_store(out_dir: Path) -> tuple[Store, dict[str, Any]]:
    """The study of ``out_dir`` for reading (leaderboard, report); never creates a database."""
    meta = read_meta(out_dir)
    url = stored_storage(meta["storage"], Path(out_dir))
    if not study_exists(url, meta["study_name"]):
        raise UserError(
            f"holds no study {meta['study_name']!r} ({count_run_dirs(Path(out_dir))} run directories)",
            file=str(sqlite_path(url) or url),
        )
    store = Store(url, meta["study_name"], meta["knobs"], create=False, base=Path(out_dir))
    return store, meta


def saved_counts(out: Path) -> tuple[int, int]:
    """Trials in the study of ``out``, and how many of them are interrupted (0, 0 when none can be read)."""
    try:
        store, _ = open_store(out)
    except (UserError, InfrastructureError, OSError, SQLAlchemyError):
        return 0, 0
    saved = interrupted = 0
    try:
        for r in store.iter_records():  # streamed: a large study is never held whole
            saved += 1
            interrupted += r.interrupted
    finally:
        store.close()
    return saved, interrupted


def check_target(out: Path, *, resume: bool, rebuild: bool, worker: bool, default_out: bool) -> bool:
    """Refuse what ``out`` cannot be used for (a fresh study over an existing one, a resume of nothing);
    whether the study there is resumed (a worker joins a study that is there)."""
    resume = resume or (worker and (out / META).exists())
    if (out / META).exists() and not resume:
        if default_out:  # the user gave no --out: name the default, never a flag they did not pass
            raise UserError(
                "(the default output directory, runs/<space name>) already holds a study; pass "
                "{param:resume} to continue it, or {param:out} DIR for a fresh study",
                file=str(out),
            )
        raise UserError(
            "already holds a study; pass {param:resume} to continue it, or a fresh {param:out} DIR",
            file=str(out),
            param="out",
        )
    if resume and not (out / META).exists():
        raise UserError(f"nothing to resume (no {META})", file=str(out), param="resume")
    if rebuild and not resume:
        raise UserError("goes with {param:resume}", param="rebuild")
    return resume


@contextlib.contextmanager
def locked(out: Path, *, worker: bool) -> Iterator[Callable[[], None]]:
    """Hold ``out`` (made if need be) for one study: ``.lock`` exclusively, or shared among ``--worker``s. A
    worker also holds ``.start.lock`` until it calls the ``ready`` it is given (one worker at a time sets the
    study up: the first creates it, the others join it). A directory this call made is removed again when a
    :class:`UserError` refuses the study before it started (no ``dse.json``)."""
    created = not out.exists() and not worker  # a worker never removes what another one may be starting
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".lock", "w")
    except OSError as e:
        raise UserError(f"cannot write there: {e.strerror or e}", file=str(out), param="out") from None
    try:
        fcntl.flock(lock, (fcntl.LOCK_SH if worker else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise UserError(
            "is in use by another dse run"
            + ("" if worker else " (several processes on one study: {param:worker} each)"),
            file=str(out),
            param="out",
        ) from None
    starting = None
    if worker:
        starting = open(out / ".start.lock", "w")
        fcntl.flock(starting, fcntl.LOCK_EX)

    def ready() -> None:
        if starting is not None and not starting.closed:
            fcntl.flock(starting, fcntl.LOCK_UN)
            starting.close()

    try:
        yield ready
    except (UserError, KeyboardInterrupt):
        if created and not (out / META).exists():  # refused (or stopped) before the study started: leave nothing
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        ready()
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def open_study(
    out: Path, space: Space, meta: dict[str, Any], *, resume: bool, rebuild: bool, worker: bool
) -> tuple[Store, dict[str, Any], str]:
    """The study's store, ``dse.json`` and storage URL. ``meta`` is what a new study writes to ``dse.json``; a
    resumed one reads its own and is refused for another space (checked against the fingerprint stored with
    the study, not only the file's), or for a storage that lost the study (unless ``rebuild``: it starts anew
    under the old numbers)."""
    new_print = meta["fingerprint"]
    if resume:
        meta = read_meta(out)
        if meta["space_name"] != space.name or meta["knobs"] != knob_lists(space):
            raise UserError(
                "the space differs from the one this study ran; resume with the same space file",
                file=space.source,
                field="knobs",
            )
        _check_fingerprint(out, meta.get("fingerprint"), new_print, space.source)
        _check_described(out, meta, space)
        url = stored_storage(meta["storage"], out)
        _check_rebuild(out, url, meta["study_name"], rebuild)
    else:
        url = stored_storage(meta["storage"], out)
    store = _open(url, meta, resume, worker, out, new_print)
    try:
        if resume:
            _check_stored(out, store, meta, new_print, space)
        else:
            _write_json(out / META, meta)
    except OSError as e:
        store.close()
        raise io_error(e, f"cannot write {out / META}") from None
    except BaseException:
        store.close()
        raise
    return store, meta, url


def _refuse_resume(out: Path, changed: list[str], source: str) -> UserError:
    return UserError(
        f"differs from the study in {out} in {', '.join(changed)}; {{param:resume}} continues the same study (the "
        "trial budget, parallelism and agent settings may change): use a fresh {param:out} for a different one",
        file=source or None,
        param="resume",
    )


def _check_fingerprint(out: Path, old: Any, new: dict[str, Any], source: str) -> None:
    """A resume is the same study: refused in one line naming the fields that differ. The fields are compared,
    never the hash alone (an edited field under the old hash is a difference); a ``dse.json`` of a dse that
    kept no fingerprint is checked against the store instead (:func:`_check_stored`)."""
    if not isinstance(old, dict) or not isinstance(old.get("fields"), dict):
        return
    changed = fingerprint_changes(old["fields"], new["fields"])
    if changed:
        raise _refuse_resume(out, changed, source)


# dse.json's own description of the study (written by every dse): compared when it keeps no fingerprint
_DESCRIBED = {
    "recipe": "recipe",
    "gpu": "system.gpu",
    "num_nodes": "num_nodes",
    "gpus_per_node": "system.gpus_per_node",
}


def _check_described(out: Path, meta: dict[str, Any], space: Space) -> None:
    """``dse.json``'s recipe, GPU and size against the space (what an older dse's file says of the study)."""
    now = {
        "recipe": space.recipe,
        "gpu": space.system.gpu,
        "num_nodes": space.num_nodes,
        "gpus_per_node": space.system.gpus_per_node,
    }
    changed = [name for key, name in _DESCRIBED.items() if key in meta and meta[key] != now[key]]
    if changed:
        raise _refuse_resume(out, changed, space.source)


def _check_stored(out: Path, store: Store, meta: dict[str, Any], new: dict[str, Any], space: Space) -> None:
    """The resume against what the store holds: the fingerprint written with the study, else (a study of an
    older dse) the GPUs its trials ran on; such a study is then given this space's fingerprint in the store,
    and a ``dse.json`` without one gets it too (said on stderr)."""
    stored = store.fingerprint()
    if stored is not None:
        changed = fingerprint_changes(stored["fields"], new["fields"])
        if changed:
            raise _refuse_resume(out, changed, space.source)
    else:
        ran = sorted(store.gpus() - {space.system.gpu})
        if ran:
            raise UserError(
                f"differs from the study in {out}: its trials ran on {', '.join(ran)}, this space's system is "
                f"{space.system.gpu}; use a fresh {{param:out}} for a different study",
                file=space.source or None,
                param="resume",
            )
        store.set_fingerprint(new)
    if not isinstance(meta.get("fingerprint"), dict):
        meta["fingerprint"] = new
        _write_json(out / META, meta)
        print(f"{out / META}: no fingerprint of the study (an older dse); recorded this space's", file=sys.stderr)


def _check_rebuild(out: Path, url: str, study_name: str, rebuild: bool) -> None:
    """A resume whose storage holds no study although run directories say trials ran: refused, or with
    ``rebuild`` the old run directories set aside (the run directories are counted only when the study is
    gone; a pack is read through to count it)."""
    if study_exists(url, study_name) or not (ran := count_run_dirs(out)):
        return
    if not rebuild:
        # an emptied or deleted database: starting afresh would overwrite the leaderboard and set the run
        # directories aside, so only an explicit --rebuild does that
        raise UserError(
            f"holds no study {study_name!r}; the run directories say {ran} trials ran (pass "
            "{param:rebuild} with {param:resume} to start the study anew)",
            file=str(sqlite_path(url) or url),
            param="resume",
        )
    # the new trials take the old numbers: their directories are set aside one by one as they run
    # (dse.execute.prepare_run_dir), the old packs all at once, so no reader takes an old log for a new
    logpack.set_aside(out / "trials")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_text(path, json.dumps(data, indent=2))  # atomically: a reader sees the old dse.json or the new one


def write_meta(out_dir: Path, meta: dict[str, Any]) -> None:
    """``dse.json`` rewritten with ``meta`` (what a study adds as it runs: its probes' counts), atomically."""
    try:
        _write_json(Path(out_dir) / META, meta)
    except OSError as e:
        raise io_error(e, f"cannot write {Path(out_dir) / META}") from None


def _open(url: str, meta: dict[str, Any], resume: bool, worker: bool, out: Path, fingerprint: dict) -> Store:
    """The study's store (workers starting at once on an empty database: the store settles their race); a
    study it creates is stored with ``fingerprint``."""
    return Store(url, meta["study_name"], meta["knobs"], resume=resume or worker, base=out, fingerprint=fingerprint)


@contextlib.contextmanager
def serialized(out: Path, worker: bool) -> Iterator[None]:
    """With ``worker``: one worker at a time reads the store and writes the leaderboard (a lock file), so a
    worker that read the store earlier never overwrites the leaderboard of one that read it later."""
    if not worker:
        yield
        return
    with open(out / ".leaderboard.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def trial_sizes(space: Space, points: Points | None = None) -> dict[str, dict[str, int]]:
    """The global batch size and sequence length of the space's trials by precision (the recipe's defaults
    depend on it; a knob of the space overrides them): what ``dse parse`` of a trial directory needs, with the
    GPUs, for tokens/s/GPU, kept in ``dse.json`` so that a moved study needs no space file."""
    from dse.rules.points import Points  # imported where used, as the trial was: the directory's readers need neither

    points = points if points is not None else Points(space)
    precisions = space.knobs.get("precision") or [space.settings.get("precision", knobs.CATALOGUE["precision"].default)]
    sizes = {}
    for p in dict.fromkeys(str(v) for v in precisions):
        layout = points.trial({"precision": p}).layout
        sizes[p] = {"gbs": layout.gbs, "seq_length": layout.seq_length}
    return sizes
