"""The agent loop: open the store, build the environment and the agent, run trials, write the leaderboard.

An output directory holds one study: ``dse.json`` (what ran: space file, study name, storage URL, knob
names), the store (``study.db``), ``trials/NNNNN/`` run directories and ``leaderboard.csv``. A lock file
keeps a second ``dse run`` out of a directory in use, unless each is a ``--worker`` (they then claim points
in the storage: :mod:`dse.claims`). ``--parallel N`` keeps N trials in flight (:mod:`dse.parallel`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gymnasium import spaces
from sqlalchemy.exc import SQLAlchemyError

from agents.base import agent_class, load_agents, make_agent
from dse import knobs
from dse import registry as reg
from dse import logpack
from dse.backends import Backend, load_backends
from dse.backends.scripts import check_path
from dse.counting import count_valid
from dse.best import write_best
from dse.claims import LEASE_S, Claims, add_trial
from dse.errors import InfrastructureError, UserError, did_you_mean, infrastructure
from dse.forecast import model_forecaster
from dse.execute import parse_context
from dse.leaderboard import Summary, frame, write_csv
from dse.parallel import Pool
from dse.parse import parse_log
from dse.space import WALK_LIMIT, Space
from dse.store import INTERRUPTED, READ_BATCH, Store, TrialRecord, check_url, sqlite_path
from dse.store import exists as study_exists
from envs.recipe_env import RecipeEnv, better

META = "dse.json"
DB = "study.db"
LEADERBOARD = "leaderboard.csv"


def trial_dir(out_dir: Path, number: int) -> Path:
    """The run directory of trial ``number`` (the store assigns numbers; this is the one place they become paths)."""
    return Path(out_dir) / "trials" / f"{number:05d}"


def record_of(number: int, info: dict[str, Any], reward: float, out_dir: Path) -> TrialRecord:
    """The store's record of one environment step."""
    return TrialRecord(number=number, knobs=info["knobs"], status=info["status"], reward=reward,
                       reason=info["reason"], metrics=info["metrics"],
                       run_dir=stored_run_dir(number) if info["launched"] else None,
                       gpu=info["gpu"], num_gpus=info["num_gpus"], gpu_hours=gpu_hours(info))


def stored_run_dir(number: int) -> str:
    """The run directory as the store keeps it: relative to the study directory (``trials/00003``), so a
    moved or copied study still finds it; readers get it resolved (``dse.store.resolve_run_dir``)."""
    return trial_dir(Path("."), number).as_posix()


def gpu_hours(info: dict[str, Any]) -> float | None:
    """GPUs x the run's wall time in hours (0 for a point never launched; None when the time is unknown)."""
    if not info["launched"]:
        return 0.0
    wall = info["metrics"].get("wall_s")
    return info["num_gpus"] * wall / 3600.0 if wall is not None else None


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
    """``--storage`` as given, with a relative SQLite or journal file made absolute now (a relative path
    would otherwise name a different file from every other working directory)."""
    check_url(url)
    path = sqlite_path(url)
    if path is not None and not path.is_absolute():
        return "sqlite:///" + str(path.resolve()) + (("?" + url.partition("?")[2]) if "?" in url else "")
    if "://" not in url:
        return str(Path(url).resolve())
    return url


def make_backend(name: str, space: Space, seed: int) -> Backend:
    """The backend called ``name`` from the ``dse.backends`` registry, built for ``space``."""
    cls = reg.get(load_backends(), name, Backend, group=reg.BACKENDS, field="--backend")
    return cls.from_space(space, seed=seed)


def ordinal_knobs(space: Space) -> list[str]:
    """The space's knobs a sampler can treat as ordered (the catalogue's ordinal knobs, listed ascending)."""
    return knobs.ordinal_knobs(space.knobs)


def agent_settings(space: Space, agent: str, sampler: str | None, registry) -> dict[str, Any]:
    """The agent's options: ``[search.options]``, with the sampler (``--sampler`` over
    ``[search.options].sampler`` over ``[search].sampler``) for an agent that declares one."""
    options = dict(space.search.options)
    cls = agent_class(agent, registry)
    if "sampler" in cls.Options.model_fields:
        options["sampler"] = sampler or options.get("sampler") or space.search.sampler
    elif sampler is not None:
        raise UserError(f"agent {agent!r} takes no sampler (only agents with a sampler option do)", field="--sampler")
    return options


def space_options(space: Space, agent: str, options: dict[str, Any], registry, *, parallel: int = 1) -> dict[str, Any]:
    """``options`` plus what the study derives from the space for an agent that declares it: the ordinal knobs,
    the warm start (``[search] warm_start`` unless ``[search.options]`` sets it) and the trials in flight at
    once (``parallel``). Not recorded in ``dse.json`` (the space file and the command line say them)."""
    fields = agent_class(agent, registry).Options.model_fields
    derived: dict[str, Any] = {}
    if "parallel" in fields:
        derived["parallel"] = parallel
    if "ordinal" in fields:
        derived["ordinal"] = ordinal_knobs(space)
    if "warm_start" in fields:
        derived["warm_start"] = space.search.warm_start
    return {**derived, **options}


SUMMARY_ROWS = 20  # top rows the study's summary keeps (the terminal shows 10)


@dataclass
class StudyResult:
    """What ``run_study`` returns. ``summary`` (top rows, counts, GPU-hours, the best) is computed in the
    study's final streamed read; ``records``, every trial as a list as it was when the study ended, is read
    from the store only when asked for (tests, small studies), so a 200k-trial study never holds them."""

    out_dir: Path
    _records: list[TrialRecord] | None
    new_trials: int
    leaderboard: Path
    stop_reason: str | None = None  # the agent's own word on why it stopped, when it stopped by itself
    summary: Summary | None = None
    _source: tuple | None = None  # (storage URL, study name, knobs) to read the records from on demand

    @property
    def records(self) -> list[TrialRecord]:
        if self._records is None:
            url, name, knobs = self._source
            store = Store(url, name, knobs, create=False, base=self.out_dir)
            try:
                # the trials as they were when the study ended (a later resume adds more to the store)
                self._records = [r for r in store.records() if r.number < self.summary.n]
            finally:
                store.close()
        return self._records


class Interrupted(KeyboardInterrupt):
    """A study stopped by Ctrl-C, after what it had was written: ``saved`` trials in the store, ``interrupted``
    of them stopped mid-run (``--resume`` runs those again)."""

    def __init__(self, out_dir: Path, saved: int, interrupted: int):
        super().__init__(f"{saved} trials saved in {out_dir} ({interrupted} interrupted)")
        self.out_dir, self.saved, self.interrupted = out_dir, saved, interrupted


def _saved(out: Path) -> tuple[int, int]:
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


def read_meta(out_dir: Path) -> dict[str, Any]:
    path = Path(out_dir) / META
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"not a dse output directory (no {META})", file=str(out_dir)) from None
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read: {e}", file=str(path)) from None


def open_store(out_dir: Path) -> tuple[Store, dict[str, Any]]:
    """The study of ``out_dir`` for reading (leaderboard, report); never creates a database."""
    meta = read_meta(out_dir)
    url = stored_storage(meta["storage"], Path(out_dir))
    if not study_exists(url, meta["study_name"]):
        raise UserError(f"holds no study {meta['study_name']!r} ({_ran(Path(out_dir))} run directories)",
                        file=str(sqlite_path(url) or url))
    store = Store(url, meta["study_name"], meta["knobs"], create=False, base=Path(out_dir))
    return store, meta


def _ran(out_dir: Path) -> int:
    """How many trials' run directories ``out_dir`` holds, packed ones (dse.logpack) included."""
    d = Path(out_dir) / "trials"
    return (sum(1 for p in d.iterdir() if p.is_dir() and p.name.isdigit()) + logpack.count(d)) if d.is_dir() else 0


def run_study(space: Space, *, out_dir: str | Path, agent: str | None = None, sampler: str | None = None,
              trials: int | None = None, seed: int | None = None, backend: str | None = None,
              resume: bool = False, storage: str | None = None, rebuild: bool = False,
              on_trial: Callable[[TrialRecord, int, int | None], None] | None = None,
              seeds: Sequence[dict[str, Any]] = (), default_out: bool = False,
              parallel: int | None = None, worker: bool = False, lease_s: float = LEASE_S) -> StudyResult:
    """Run (or resume) the study of ``space`` in ``out_dir``. ``on_trial(record, done, total)`` reports progress (total: the budget, or for a grid without one the
    number of valid points; None when unknown). ``rebuild`` (with ``resume``): when the storage holds no
    study although run directories say trials ran, start it anew instead of refusing. ``seeds`` are points
    (knob values) run first, before the agent proposes, and shown to it as its own outcomes (warm start); a
    seed the study already ran is skipped, so a resumed study does not run them again. ``default_out``: the
    user gave no ``--out`` (``out_dir`` is the default), so an error names the default, not the flag.
    ``parallel``: trials in flight at once (``--parallel``, default ``[search] parallel``; see
    :mod:`dse.parallel`): results are recorded as they finish, in any order, each under the number it was
    given at its launch.

    A Ctrl-C stops every running trial (each backend's own way: ``scancel``, the process group) and raises
    :class:`Interrupted` (a ``KeyboardInterrupt``) once the store and the leaderboard are written: the trials
    it stopped are recorded ``failed``/``interrupted``, and ``--resume`` runs them again in place (a Slurm job
    that had COMPLETED is parsed as it finished instead).

    ``worker``: one of several processes on the same study (same ``out_dir``, or the same ``storage``): the
    directory is shared instead of locked, each point is claimed in the storage before it runs
    (:mod:`dse.claims`; a dead worker's claims expire after ``lease_s``), trial numbers come from the
    storage, and each worker's agent is shown the others' results as they come. A worker starts the study
    when there is none yet, and joins it otherwise (``--resume`` is implied). ``trials`` is the study's
    budget; the workers may overshoot it by the trials the others have in flight."""
    out = Path(out_dir)
    parallel = space.search.parallel if parallel is None else parallel
    if parallel < 1:
        raise UserError(f"{parallel} trials at once; --parallel is at least 1", field="--parallel")
    agent = agent or space.search.agent
    seed = space.search.seed if seed is None else seed
    backend_name = backend or space.backend.kind
    registry = load_agents()
    # Build the agent once on the bare action space, so a bad agent, sampler or option fails before
    # anything is written.
    probe = spaces.Dict(OrderedDict((k, spaces.Discrete(len(v))) for k, v in space.knobs.items()))
    options = agent_settings(space, agent, sampler, registry)
    make_agent(agent, registry, probe, seed=seed, **space_options(space, agent, options, registry, parallel=parallel))
    make_backend(backend_name, space, seed)
    if worker and (out / META).exists():
        resume = True  # a worker joins the study there
    if out.exists() and (out / META).exists() and not resume:
        if default_out:  # the user gave no --out: name the default, never a flag they did not pass
            raise UserError("(the default output directory, runs/<space name>) already holds a study; pass "
                            "--resume to continue it, or --out DIR for a fresh study", file=str(out))
        raise UserError("already holds a study; pass --resume to continue it, or a fresh --out DIR",
                        file=str(out), field="--out")
    if resume and not (out / META).exists():
        raise UserError(f"nothing to resume (no {META})", file=str(out), field="--resume")
    if rebuild and not resume:
        raise UserError("--rebuild goes with --resume", field="--rebuild")
    # Everything the study will write must be writable before the first trial: the output directory's path
    # goes into best/'s scripts, so it must be one a script can carry; a storage URL must be usable.
    check_path(out.absolute(), field="--out")
    if storage is not None:
        storage = absolute_storage(storage)
    created = not out.exists() and not worker  # a worker never removes what another one may be starting
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".lock", "w")
    except OSError as e:
        raise UserError(f"cannot write there: {e.strerror or e}", file=str(out), field="--out") from None
    try:  # workers share the directory; a plain dse run has it to itself
        fcntl.flock(lock, (fcntl.LOCK_SH if worker else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise UserError("is in use by another dse run" + ("" if worker else " (several processes on one study: "
                        "--worker each)"), file=str(out), field="--out") from None
    starting = None
    if worker:  # one worker at a time sets the study up (the first creates it, the others join it)
        starting = open(out / ".start.lock", "w")
        fcntl.flock(starting, fcntl.LOCK_EX)
        resume = resume or (out / META).exists()

    def ready() -> None:
        if starting is not None and not starting.closed:
            fcntl.flock(starting, fcntl.LOCK_UN)
            starting.close()

    try:
        return _run_locked(space, out, agent, options, trials, seed, backend_name, resume, storage, registry,
                           on_trial, rebuild, seeds, parallel, worker, lease_s, ready)
    except KeyboardInterrupt:
        raise Interrupted(out, *_saved(out)) from None
    except UserError:
        if created and not (out / META).exists():  # refused before the study started: leave nothing behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        ready()
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _run_locked(space, out, agent_name, options, trials, seed, backend_name, resume, storage, registry, on_trial,
                rebuild=False, seeds=(), parallel=1, worker=False, lease_s=LEASE_S, ready=lambda: None):
    if resume:
        meta = read_meta(out)
        if meta["space_name"] != space.name or meta["knobs"] != {k: list(v) for k, v in space.knobs.items()}:
            raise UserError("the space differs from the one this study ran; resume with the same space file",
                            file=space.source, field="knobs")
        url = stored_storage(meta["storage"], out)
        # the run directories are counted only when the study is gone (a pack is read through to count it)
        if not study_exists(url, meta["study_name"]) and (ran := _ran(out)):
            if not rebuild:
                # an emptied or deleted database: starting afresh would overwrite the leaderboard and set the
                # run directories aside, so only an explicit --rebuild does that
                raise UserError(f"holds no study {meta['study_name']!r}; the run directories say {ran} trials "
                                "ran (pass --rebuild with --resume to start the study anew)",
                                file=str(sqlite_path(url) or url), field="--resume")
            # the new trials take the old numbers: their directories are set aside one by one as they run
            # (dse.execute.prepare_run_dir), the old packs all at once, so no reader takes an old log for a new
            logpack.set_aside(out / "trials")
    else:
        url = storage or storage_url(out)
        meta = {"space": space.source, "space_name": space.name, "study_name": space.name,
                "storage": storage or DB,
                "knobs": {k: list(v) for k, v in space.knobs.items()}, "recipe": space.recipe,
                "system": space.system.name, "gpu": space.system.gpu, "num_nodes": space.num_nodes,
                "gpus_per_node": space.system.gpus_per_node, "price_per_gpu_hour": space.system.price_per_gpu_hour,
                "agent": agent_name, "sampler": options.get("sampler"), "options": options, "seed": seed, "backend": backend_name}
    store = _open(url, meta, resume, worker, out)
    if not resume:
        tmp = out / f".{META}.tmp"
        try:
            tmp.write_text(json.dumps(meta, indent=2))
            os.replace(tmp, out / META)
        except OSError as e:
            store.close()
            raise _io_error(e, f"cannot write {out / META}") from None
    ready()  # the study is there: other workers may join
    be = make_backend(backend_name, space, seed)
    packer = logpack.Packer(out / "trials") if be.packs_logs else None  # simulated logs, PACK_SIZE at a time
    current = threading.local()  # the number of the trial this thread runs (its run directory)
    best: list[float | None] = [None]  # the best metric measured in this study (resumed trials too), for pruning
    env = RecipeEnv(space, be, out, run_dirs=lambda: trial_dir(out, current.number), best=lambda: best[0])
    env.reset(seed=seed)
    agent = make_agent(agent_name, registry, env.action_space, seed=seed, action_mask=env.action_mask,
                       forecast=model_forecaster(space),
                       **space_options(space, agent_name, options, registry, parallel=parallel))
    # Resume: the stored trials replayed to the agent in one streamed pass (no list of the study's records);
    # only the knobs of the stored trials are kept, and only when seed points must be checked against them.
    # Interrupted rows (few) are kept aside: each runs again first, under its own number and in its own run
    # directory, and its result replaces the interrupted row (Store.replace).
    seeds = list(seeds)
    ran: list[dict[str, Any]] = []
    interrupted: list[TrialRecord] = []
    known: set[int] = set()  # --worker: the trials the agent has been shown (the others' are shown as they come)
    done = 0

    def history():
        nonlocal done
        for r in store.iter_records():
            if r.interrupted:
                interrupted.append(r)
                continue
            if worker:
                known.add(r.number)
            done += r.status != "rejected"
            best[0] = better(best[0], r.metrics, space.objective, ok=r.ok)  # for pruning
            if seeds:
                ran.append(r.knobs)
            yield env.encode(r.knobs), r.reward, r.ok, r.status, r.metrics

    agent.warm_start(history())

    def point(knobs: dict[str, Any]) -> tuple:
        return tuple(sorted(knobs.items()))

    # An interrupted row whose point ran again later anyway (a study from a dse that appended reruns) is left
    # as it is: rerunning it would run the point twice (a second streamed pass, only when there are such rows).
    reruns: list[TrialRecord] = []
    if interrupted:
        wanted = {point(r.knobs) for r in interrupted}
        finished = {point(r.knobs) for r in store.iter_records() if not r.interrupted and point(r.knobs) in wanted}
        for r in interrupted:
            if point(r.knobs) not in finished and all(r.knobs != q.knobs for q in reruns):
                reruns.append(r)
    rerun_points = [r.knobs for r in reruns]
    queued: list[tuple[int | None, dict[str, int]]] = [(r.number, env.encode(r.knobs)) for r in reruns]
    queued += [(None, env.encode(p)) for i, p in enumerate(seeds)
               if p not in ran and p not in rerun_points and p not in seeds[:i]]
    # --trials wins; the space's [search].trials belongs to the space's own agent; otherwise no budget:
    # the agent runs until it has nothing left (grid: every valid point once).
    budget = trials if trials is not None else (space.search.trials if agent_name == space.search.agent else None)
    total = budget
    if total is None and agent_name == "grid" and space.size <= WALK_LIMIT:  # for the progress bar only
        total = count_valid(space).valid  # exact at this size (the grid refuses a larger space)
    # The budget is launched runs: a rejected point costs nothing and counts for nothing, for every agent.
    new = 0
    stop_reason = None
    claims = Claims(store, lease_s=lease_s) if worker else None
    pool = Pool(parallel) if parallel > 1 or claims is not None else None
    in_flight: dict[int, dict[str, int]] = {}  # number -> action, while its trial runs in the pool

    def placeholder(number: int, action: dict[str, int]) -> TrialRecord:
        """The row of a launched trial until its result replaces it: interrupted (what a Ctrl-C or a killed
        dse leaves, and what --resume runs again)."""
        trial = env.trial(action)
        return TrialRecord(number=number, knobs=trial.varied_values(), status="failed",
                           reward=space.objective.failed_reward, reason=INTERRUPTED,
                           run_dir=stored_run_dir(number), gpu=trial.system.gpu, num_gpus=trial.num_gpus)

    def finish(number: int, action, reward: float, info: dict[str, Any], *, over: bool, check: bool = True):
        """Record a result (``over``: in place of the trial's stored row) and show it to the agent."""
        nonlocal done, new
        rec = record_of(number, info, reward, out)
        if over:
            store.replace(rec)
        else:
            store.record(rec)
        if packer is not None and rec.run_dir is not None:
            packer.add(number)
            if packer.ready:
                store.flush()  # a pack holds only trials the store has (dse.logpack)
                packer.pack()
        best[0] = better(best[0], rec.metrics, space.objective, ok=rec.ok)
        if claims is not None:
            claims.done(info["knobs"])
            known.add(number)
        agent.observe(action, reward, info["status"] == "ok", status=info["status"], metrics=info["metrics"])
        done += info["status"] != "rejected"
        new += 1
        if on_trial:
            on_trial(rec, done, total)
        if check and (why := be.stop_reason()) is not None:  # e.g. sbatch refusing every job the same way
            raise UserError(why, file=space.source or None, field=f"system {space.system.name}")

    def finished_anyway(number: int, action) -> tuple | None:
        """After a Ctrl-C: the step result of a trial whose run had in fact ended by itself (a Slurm job that
        COMPLETED), parsed as it finished; None when it was interrupted."""
        trial = env.trial(action)
        run_dir = trial_dir(out, number)
        result = be.finished_after_interrupt(trial, run_dir)
        if result is None or not Path(result.log_path).exists():
            return None
        metrics = parse_log(Path(result.log_path), exit_code=result.exit_code,
                            scheduler_state=result.scheduler_state, context=parse_context(trial, space.backend))
        return env.outcome(action, replace(metrics, wall_s=result.wall_s), trial=trial)

    def ended_meanwhile(number: int, action) -> bool:
        """A rerun whose earlier run had in fact finished (a Slurm job that COMPLETED after the dse that
        launched it was gone) is parsed and recorded in place instead of run again."""
        got = finished_anyway(number, action)
        if got is None:
            return False
        finish(number, action, got[1], got[4], over=True)
        return True

    def run_here(number: int, action, rerun: bool) -> None:
        """One trial in this thread (``--parallel 1``, and points rejected without a launch)."""
        current.number = number
        try:
            _, reward, _, _, info = env.step(action)
        except KeyboardInterrupt:
            got = finished_anyway(number, action)
            if got is not None:
                finish(number, action, got[1], got[4], over=rerun, check=False)
            elif not rerun:  # recorded as interrupted (not a result): --resume runs the point again
                store.record(placeholder(number, action))
            raise
        finish(number, action, reward, info, over=rerun)

    def launch(number: int | None, action) -> bool:
        """One trial into the pool: its number is taken now (an interrupted row until its result comes).
        With ``--worker`` the point is claimed first; False when another worker has it (or had it)."""
        if claims is not None:
            point = env.decode(action)
            if not claims.claim(point):
                return False
            if number is not None and ended_meanwhile(number, action):
                return True
            if number is None:
                number = add_trial(store, placeholder(0, action), stored_run_dir)  # numbered by the storage
            claims.numbered(point, number)
            if env.rejection(action) is not None:
                run_here(number, action, True)
                return True
        elif number is not None and ended_meanwhile(number, action):
            return True
        elif number is None:
            if env.rejection(action) is not None:  # never launched: recorded at once
                run_here(store.next_number(), action, False)
                return True
            number = store.next_number()
            store.record(placeholder(number, action))
            store.flush()  # in the storage before the run starts: a killed dse leaves it interrupted

        def work(number=number, action=action):
            current.number = number
            return env.step(action)

        in_flight[number] = action
        pool.submit(number, work, interruptible=be.interruptible)
        return True

    synced = [time.monotonic()]

    def sync() -> None:
        """``--worker``: show the agent what the other workers finished since (at most once a second)."""
        nonlocal done
        if claims is None or time.monotonic() - synced[0] < 1.0:
            return
        synced[0] = time.monotonic()
        for r in store.iter_records():
            if r.number in known or r.interrupted:
                continue
            known.add(r.number)
            best[0] = better(best[0], r.metrics, space.objective, ok=r.ok)  # pruning against every worker's best
            agent.observe(env.encode(r.knobs), r.reward, r.ok, status=r.status, metrics=r.metrics)
            done += r.status != "rejected"

    def collect(results, *, check: bool = True) -> None:
        """Record finished pool jobs; an error or a Ctrl-C that one of them raised is raised once all are."""
        raised: BaseException | None = None
        for d in results:
            action = in_flight.pop(d.key)
            if d.error is not None:
                raised = raised or d.error
                continue
            if d.interrupted:
                raised = raised or KeyboardInterrupt()
                got = finished_anyway(d.key, action)
                if got is None:
                    continue  # its placeholder stays: interrupted
                d.value = got
            _, reward, _, _, info = d.value
            finish(d.key, action, reward, info, over=True, check=check)
        if raised is not None and check:
            raise raised

    try:
        try:
            seeding = bool(queued)  # reruns and seeds first, all of them ended before the agent proposes
            idle = False  # the agent had nothing to propose while trials ran: ask again after the next result
            while True:
                while (pool is None or pool.free > 0) and (budget is None or done + len(in_flight) < budget):
                    if queued:
                        number, action = queued.pop(0)
                    elif seeding and in_flight:
                        break
                    else:
                        seeding = False
                        if idle:
                            break
                        sync()
                        action, number = agent.propose(), None
                        if action is None:
                            if in_flight:
                                idle = True
                            else:
                                stop_reason = agent.stop_reason
                            break
                    if pool is None:
                        if number is None or not ended_meanwhile(number, action):
                            run_here(store.next_number() if number is None else number, action, number is not None)
                    elif not launch(number, action):
                        sync()  # another worker has the point: learn what the others found (once a second)
                if not in_flight:
                    break
                collect(pool.wait())
                idle = False
        except BaseException:
            # Ctrl-C, or an error: every trial still running is stopped (its backend's Ctrl-C path: scancel,
            # the process group killed) and recorded as it ended, interrupted unless it had finished
            if pool is not None and in_flight:
                left = pool.cancel()
                for d in left:
                    try:
                        collect([d], check=False)
                    except Exception:  # the first error is the one reported
                        pass
            raise
        finally:
            if claims is not None:
                claims.close()  # what it still holds (interrupted trials) is free for --resume at once
    except InfrastructureError:
        # dse could not write (disk full...): the trial in flight is not recorded (resume runs it again);
        # what finished before it is kept if the store still can be written, and nothing else is attempted
        try:
            store.close()
        except (InfrastructureError, OSError, SQLAlchemyError):
            pass
        raise
    finally:
        if not store.closed:
            with _serialized(out, worker):  # workers: the last to read the store is the last to write
                store.flush()
                summary = Summary(SUMMARY_ROWS)
                try:  # one streamed pass: the leaderboard's table and the summary (top rows, counts, the best)
                    df = frame(summary.feed(store.iter_records()), list(space.knobs), batch=READ_BATCH)
                finally:
                    store.close()
                lb = _write_leaderboard(df, out)
                del df
    try:
        write_best(space, [summary.best] if summary.best else [], out)  # only when the loop ended normally
    except OSError as e:
        raise _io_error(e, f"cannot write {out / 'best'}") from None
    return StudyResult(out, None, new, lb, stop_reason, summary=summary, _source=(url, meta["study_name"], meta["knobs"]))


def _open(url: str, meta: dict[str, Any], resume: bool, worker: bool, out: Path) -> Store:
    """The study's store (workers starting at once on an empty database: the store settles their race)."""
    return Store(url, meta["study_name"], meta["knobs"], resume=resume or worker, base=out)


@contextlib.contextmanager
def _serialized(out: Path, worker: bool):
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


def _io_error(e: OSError, what: str) -> InfrastructureError:
    """dse could not write its own output: never a traceback, never a trial outcome."""
    return infrastructure(e, what) or InfrastructureError(f"{what}: {e.strerror or e}")


def _write_leaderboard(df, out: Path) -> Path:
    """``out/leaderboard.csv``. Decision: it names run directories relative to the study directory
    (``trials/00003``), as the store and ``best/best.json`` do, so a moved or copied study's own table stays
    right; ``dse leaderboard DIR --csv FILE`` writes them absolute, since FILE may be anywhere."""
    prefix = os.path.join(os.path.abspath(out), "")
    # string prefixes, not os.path.relpath: one row per trial (185k on the big grid)
    df["run_dir"] = [p[len(prefix):] if isinstance(p, str) and p.startswith(prefix) else p for p in df["run_dir"]]
    try:
        return write_csv(df, out / LEADERBOARD)
    except OSError as e:
        raise _io_error(e, f"cannot write {out / LEADERBOARD}") from None
