"""A study, from its request to its result: :func:`run_study` checks the request (:mod:`dse.study.request`), holds
the output directory (:mod:`dse.study.outdir`: ``dse.json``, the store, ``trials/NNNNN/`` run directories, the lock
that keeps a second ``dse run`` out unless each is a ``--worker``), records a new study's description and baseline,
runs its trials (:class:`dse.study.trials.StudyLoop`: propose, screen, run, record, learn) and writes what it found
(:mod:`dse.study.recording`: the leaderboard, ``best/``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dse.backends import Backend
from dse.backends.scripts import check_path
from dse.envs.recipe_env import RecipeEnv
from dse.errors import InfrastructureError
from dse.forecast import StudyCost
from dse.rules.space import Space
from dse.study import outdir
from dse.study.leaderboard import Baseline, Summary
from dse.study.outdir import (
    DB,
    LEADERBOARD,
    META,
    absolute_storage,
    open_store,
    read_meta,
    storage_url,
    stored_run_dir,
    stored_storage,
    trial_dir,
)
from dse.study.recording import Recorder, write_best_of
from dse.study.request import (
    Request,
    Resolved,
    agent_settings,
    baseline_of,
    check_request,
    check_study,
    forecast_cost,
    learns,
    make_backend,
    ordinal_knobs,
    resolve_request,
    space_options,
    study_evaluator,
)
from dse.study.store import Store, TrialRecord
from dse.study.trials import MODEL_FILE, StudyLoop, _rerun

DEFAULT_OUT = Path("runs")  # a study's output directory when the request names none: runs/<space name>

# The study's API; the names of the output directory (dse.study.outdir), the request (dse.study.request) and the
# trials (dse.study.trials) stay importable from here for the CLI, dse.study.generations, dse.results.compare and
# the tests.
__all__ = [
    "DB",
    "LEADERBOARD",
    "META",
    "MODEL_FILE",
    "Interrupted",
    "RecipeEnv",
    "Request",
    "StudyLoop",
    "StudyResult",
    "_rerun",
    "absolute_storage",
    "agent_settings",
    "baseline_of",
    "check_study",
    "forecast_cost",
    "learns",
    "make_backend",
    "open_store",
    "ordinal_knobs",
    "read_meta",
    "run_study",
    "space_options",
    "storage_url",
    "stored_run_dir",
    "stored_storage",
    "study_evaluator",
    "trial_dir",
]


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
            # a result made without records is made with their source and the summary (_run)
            assert self._source is not None and self.summary is not None
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


def run_study(space: Space, request: Request) -> StudyResult:
    """Run (or resume) the study of ``space`` that ``request`` asks for (:class:`dse.study.request.Request`: each
    field's meaning there): results are recorded as they finish, in any order, each under the number it was given at
    its launch. The study is in ``request.out_dir`` (default: ``runs/<space name>``).

    A Ctrl-C stops every running trial (each backend's own way: ``scancel``, the process group) and raises
    :class:`Interrupted` (a ``KeyboardInterrupt``) once the store and the leaderboard are written: the trials
    it stopped are recorded ``interrupted``, and a resume runs them again in place (a Slurm job
    that had COMPLETED is parsed as it finished instead). Any other exception but a user error and dse's own
    :class:`~dse.errors.InfrastructureError` is a bug: it propagates with its traceback once the trials that
    finished are in the store and the leaderboard (as Optuna's ``catch=()``).

    A worker (``request.worker``) shares the directory instead of locking it, numbers its trials from the
    storage, and is shown the others' results as they come; it starts the study when there is none yet, and joins
    it otherwise (a resume is implied). ``request.trials`` is the study's budget; the workers may overshoot it by
    the trials the others have in flight."""
    out = Path(request.out_dir) if request.out_dir is not None else DEFAULT_OUT / space.name
    req, ran_by = check_request(space, resolve_request(space, request), request.evaluator)
    resume = outdir.check_target(
        out, resume=request.resume, rebuild=request.rebuild, worker=request.worker, default_out=request.out_dir is None
    )
    # Everything the study will write must be writable before the first trial: the output directory's path
    # goes into best/'s scripts, so it must be one a script can carry; a storage URL must be usable.
    check_path(out.absolute(), param="out")
    storage = absolute_storage(request.storage) if request.storage is not None else None
    return _run_locked(space, out, replace(req, resume=resume, storage=storage), ran_by, request.on_start)


def _run_locked(
    space: Space, out: Path, req: Resolved, backend: Backend, on_start: Callable[[StudyCost], None] | None
) -> StudyResult:
    """The study in ``out``, held for this run. ``on_start`` (given the study's forecast cost, seconds on a large
    space) runs once the directory is this run's, so that a refusal (in use by another run) comes before it."""
    try:
        with outdir.locked(out, worker=req.asked.worker) as ready:
            if on_start is not None:
                on_start(forecast_cost(space, agent=req.agent, trials=req.asked.trials, evaluator=req.evaluator))
            resume = req.resume or (req.asked.worker and (out / META).exists())  # another worker started it meanwhile
            return _run(space, out, replace(req, resume=resume), backend, ready)
    except KeyboardInterrupt:
        if not (out / META).exists():  # stopped before the study started (its cost prediction): nothing to resume
            raise
        raise Interrupted(out, *outdir.saved_counts(out)) from None


def _run(space: Space, out: Path, req: Resolved, backend: Backend, ready: Callable[[], None]) -> StudyResult:
    """The study in ``out``, which this process holds: open (or create) it, run the loop, write what it found.
    A new study records its baseline in ``dse.json`` (:func:`baseline_of`); one in the space runs first."""
    baseline = baseline_of(space, req.evaluator)
    meta = outdir.new_meta(
        space,
        storage=req.storage,
        agent=req.agent,
        options=req.options,
        seed=req.seed,
        backend=req.backend,
        points=req.evaluator,
    )
    meta["baseline"] = baseline.as_dict()
    store, meta, url = outdir.open_study(
        out, space, meta, resume=req.resume, rebuild=req.asked.rebuild, worker=req.asked.worker
    )
    base = Baseline.of_meta(meta)
    if base is not None and base.in_space:  # like a warm-start seed: skipped once the study has run it
        req = replace(req, seeds=[base.knobs, *req.seeds])
    ready()  # the study is there: other workers may join
    recorder = Recorder(store, out, packs_logs=backend.packs_logs)
    summary: Summary | None = None
    try:
        loop = StudyLoop(space, out, backend, recorder, req)
        loop.replay()
        loop.run()
        if req.asked.on_model is not None:  # the runs that contradicted the screen, in the study's last words
            for line in loop.learner.contradictions:
                req.asked.on_model(f"screen contradicted: {line}")
    except InfrastructureError:
        # dse could not write (disk full...): the trial in flight is not recorded (resume runs it again)
        recorder.abandon()
        raise
    finally:
        if not recorder.closed:  # what finished is in the store and the leaderboard, whatever stopped the loop
            summary, lb = recorder.finish(space, worker=req.asked.worker)
    assert summary is not None  # the loop ended normally, so the finally above finished the recorder
    write_best_of(space, summary, out)  # only when the loop ended normally
    return StudyResult(
        out, None, loop.new, lb, loop.stop_reason, summary=summary, _source=(url, meta["study_name"], meta["knobs"])
    )
