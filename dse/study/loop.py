"""The agent loop: build the environment and the agent, run trials, record them.

A study lives in an output directory (:mod:`dse.study.outdir`: ``dse.json``, the store, ``trials/NNNNN/`` run
directories, the lock that keeps a second ``dse run`` out unless each is a ``--worker``); its trials are
written by :mod:`dse.study.recording` (rows in the store, the leaderboard, ``best/``). This module runs the loop:
:class:`StudyLoop` holds what is queued, what is in flight, the best measured and the trials done, and each
of its steps is a method. ``--parallel N`` keeps N trials in flight (:mod:`dse.study.parallel`); ``--worker``s
claim points in the storage (:mod:`dse.study.claims`).
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from gymnasium import spaces

from dse import registry as reg
from dse.agents.base import agent_class, agent_options, load_agents, make_agent
from dse.backends import Backend, load_backends
from dse.backends.base import InfrastructureFailure
from dse.backends.scripts import check_path
from dse.envs.recipe_env import RecipeEnv, better
from dse.errors import Cancelled, InfrastructureError, UserError
from dse.evaluator import Evaluator, PointForecast
from dse.execute import parse_context
from dse.facts import knobs
from dse.facts.calibration_file import write as write_calibration
from dse.forecast import StudyCost, study_cost
from dse.launch import build_plan
from dse.logs.parse import UNLAUNCHED_STATUSES, RunMetrics, parse_log
from dse.perfmodel.calibrate import calibrated_miss, calibrated_params
from dse.perfmodel.refit import StudyModel
from dse.rules import constraints
from dse.rules.counting import check_not_empty, count_valid
from dse.rules.points import Points
from dse.rules.space import WALK_LIMIT, Space
from dse.rules.trial import TrialConfig
from dse.study import outdir
from dse.study.claims import LEASE_S, Claims
from dse.study.leaderboard import Baseline, Summary, predicted_metrics
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
from dse.study.parallel import Done, Pool
from dse.study.probe_screen import ProbeScreen, check_probe_screen
from dse.study.recording import Recorder, placeholder, record_of, write_best_of
from dse.study.store import Store, TrialRecord

# The study's API; the output directory's names (dse.study.outdir) stay importable from here for the CLI,
# dse.study.generations, dse.results.compare and the tests.
__all__ = [
    "DB",
    "LEADERBOARD",
    "META",
    "Interrupted",
    "StudyLoop",
    "StudyResult",
    "absolute_storage",
    "agent_settings",
    "check_study",
    "forecast_cost",
    "make_backend",
    "open_store",
    "MODEL_FILE",
    "learns",
    "ordinal_knobs",
    "read_meta",
    "run_study",
    "space_options",
    "storage_url",
    "stored_run_dir",
    "stored_storage",
    "trial_dir",
]


MODEL_FILE = "calibration.toml"  # the study's refit model, a calibration file (--calibration, --warm-start take it)


def _as_metrics(p: PointForecast) -> dict[str, float]:
    return predicted_metrics(p.step_time_s, p.peak_memory_gib, p.memory_gib)


def learns(space: Space, backend: Backend | type[Backend]) -> bool:
    """Whether a study's runs refit its model (dse.perfmodel.refit): measured runs do (a real backend, a replay) and so do the
    simulated backend's ``twin`` truth's, a stand-in for a machine that is not the model (so the loop is testable
    without GPUs); the simulated backend's ``exact`` truth is the model itself and teaches it nothing. None do
    when the space turns learning off (``[search] learn = false``, ``dse run --no-learn``)."""
    return space.search.learn and (not backend.simulated or space.backend.truth == "twin")


def make_backend(name: str, space: Space, seed: int) -> Backend:
    """The backend called ``name`` from the ``dse.backends`` registry, built for ``space``."""
    return make_backend_class(name).from_space(space, seed=seed)


def ordinal_knobs(space: Space) -> list[str]:
    """The space's knobs a sampler can treat as ordered (the catalogue's ordinal knobs, listed ascending)."""
    return knobs.ordinal_knobs(space.knobs)


def agent_settings(space: Space, agent: str, sampler: str | None, registry) -> dict[str, Any]:
    """The agent's options: ``[search.options]``, with the sampler (``--sampler`` over
    ``[search.options].sampler`` over ``[search].sampler``) for an agent that declares one. An option that names a
    file (the agent's ``path_options``) is relative to the space file, as ``[backend] calibration`` is."""
    options = dict(space.search.options)
    cls = agent_class(agent, registry)
    here = Path(space.source).parent if space.source else None
    for name in cls.path_options:
        value = options.get(name)
        if here is not None and isinstance(value, str) and value and not Path(value).is_absolute():
            options[name] = str(here / value)
    if "sampler" in cls.Options.model_fields:
        options["sampler"] = sampler or options.get("sampler") or space.search.sampler
    elif sampler is not None:
        raise UserError(f"agent {agent!r} takes no sampler (only agents with a sampler option do)", param="sampler")
    try:  # names and types checked here, so an option called seed is refused, not a keyword clash later
        agent_options(cls, options)
    except UserError as e:
        raise UserError(e.message, file=space.source or None, field=e.field, param=e.param) from None
    return options


def space_options(space: Space, agent: str, options: dict[str, Any], registry, *, parallel: int = 1) -> dict[str, Any]:
    """``options`` plus what the study derives from the space for an agent that declares it: the ordinal knobs,
    the warm start (``[search] warm_start`` unless ``[search.options]`` sets it), the trials in flight at
    once (``parallel``) and the memory screen's margin when the screen is on (``screen_margin``). Not recorded in ``dse.json`` (the space file and the command line say them).
    The space's fingerprint for a learned policy (``space_fingerprint``) is the space's, whatever the options say."""
    fields = agent_class(agent, registry).Options.model_fields
    derived: dict[str, Any] = {}
    fixed = {"space_fingerprint": outdir.policy_fingerprint(space)} if "space_fingerprint" in fields else {}
    if "parallel" in fields:
        derived["parallel"] = parallel
    if "ordinal" in fields:
        derived["ordinal"] = ordinal_knobs(space)
    if "warm_start" in fields:
        derived["warm_start"] = space.search.warm_start
    if "memory_miss" in fields:  # what the model it starts from has missed a peak by (a warm start's refit)
        derived["memory_miss"] = calibrated_miss(space.backend.calibration)
    if "screen_margin" in fields and space.search.screen != "none":
        derived["screen_margin"] = space.search.screen_margin  # an agent that skips what the screen removes
    return {**derived, **options, **fixed}


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


class StepResult(NamedTuple):
    """``RecipeEnv.step``'s five values by name (gymnasium's order)."""

    observation: dict[str, Any]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


def with_predicted(result: StepResult, predicted: dict[str, float]) -> StepResult:
    """``result`` with the model's predicted figures beside its measured metrics (what the trial's record keeps)."""
    if not predicted:
        return result
    return result._replace(info={**result.info, "metrics": {**result.info["metrics"], **predicted}})


@dataclass(frozen=True)
class Request:
    """What a study was asked to do, with every default resolved (the space's, then the command line's)."""

    agent: str
    options: dict[str, Any]
    registry: Any
    seed: int
    backend: str
    trials: int | None = None
    resume: bool = False
    storage: str | None = None
    rebuild: bool = False
    on_trial: Callable[[TrialRecord, int, int | None, float | None], None] | None = None
    on_model: Callable[[str], None] | None = (
        None  # each refit's one line (dse.perfmodel.refit), and what contradicted the screen
    )
    seeds: Sequence[dict[str, Any]] = ()
    parallel: int = 1
    worker: bool = False
    lease_s: float = LEASE_S
    evaluator: Evaluator | None = None  # the study's (study_evaluator): every step of a point's way asks it


def study_evaluator(space: Space, backend: str | None = None) -> Evaluator:
    """The evaluator of a study of ``space`` on ``backend`` (default: the space's): the study's model
    (:class:`dse.perfmodel.refit.StudyModel`, from the space's calibration; it learns from the runs where :func:`learns`
    says so), its points resolved, checked and predicted once each. Build it once per study and hand it to
    everything that asks about a point (``run_study(evaluator=...)``, :func:`forecast_cost`)."""
    calibration = space.backend.calibration
    try:
        cls = make_backend_class(backend or space.backend.kind)
    except UserError:  # refused by the study's checks, in their order (the agent's first): it never runs
        cls = None
    model = StudyModel(
        space,
        calibrated_params(calibration),
        learns=cls is not None and learns(space, cls),
        memory_miss=calibrated_miss(calibration),
    )
    return Evaluator(space, model)


def _own_evaluator(space: Space, backend: str, evaluator: Evaluator | None) -> Evaluator:
    if evaluator is not None and evaluator.space is not space:
        raise ValueError("the evaluator given to run_study is another space's")
    return evaluator if evaluator is not None else study_evaluator(space, backend)


def run_study(
    space: Space,
    *,
    out_dir: str | Path,
    agent: str | None = None,
    sampler: str | None = None,
    trials: int | None = None,
    seed: int | None = None,
    backend: str | None = None,
    resume: bool = False,
    storage: str | None = None,
    rebuild: bool = False,
    on_trial: Callable[[TrialRecord, int, int | None, float | None], None] | None = None,
    on_model: Callable[[str], None] | None = None,
    seeds: Sequence[dict[str, Any]] = (),
    default_out: bool = False,
    parallel: int | None = None,
    worker: bool = False,
    lease_s: float = LEASE_S,
    on_start: Callable[[], None] | None = None,
    evaluator: Evaluator | None = None,
) -> StudyResult:
    """Run (or resume) the study of ``space`` in ``out_dir``. ``on_trial(record, done, total, best)`` reports
    progress (total: the budget, or for a grid without one the number of valid points; None when unknown; best:
    the study's best value of the objective's metric so far, resumed trials included).
    ``rebuild`` (with ``resume``): when the storage holds no study although run directories say trials ran,
    start it anew instead of refusing. ``seeds`` are points (knob values) run first, before the agent
    proposes, and shown to it as its own outcomes (warm start); a seed the study already ran is skipped, so a
    resumed study does not run them again. ``default_out``: the user gave no ``--out`` (``out_dir`` is the
    default), so an error names the default, not the flag. ``parallel``: trials in flight at once
    (``--parallel``, default ``[search] parallel``; see :mod:`dse.study.parallel`): results are recorded as they
    finish, in any order, each under the number it was given at its launch.

    A Ctrl-C stops every running trial (each backend's own way: ``scancel``, the process group) and raises
    :class:`Interrupted` (a ``KeyboardInterrupt``) once the store and the leaderboard are written: the trials
    it stopped are recorded ``failed``/``interrupted``, and ``--resume`` runs them again in place (a Slurm job
    that had COMPLETED is parsed as it finished instead). Any other exception but a user error and dse's own
    :class:`~dse.errors.InfrastructureError` is a bug: it propagates with its traceback once the trials that
    finished are in the store and the leaderboard (as Optuna's ``catch=()``).

    ``worker``: one of several processes on the same study (same ``out_dir``, or the same ``storage``): the
    directory is shared instead of locked, each point is claimed in the storage before it runs
    (:mod:`dse.study.claims`; a dead worker's claims expire after ``lease_s``), trial numbers come from the
    storage, and each worker's agent is shown the others' results as they come. A worker starts the study
    when there is none yet, and joins it otherwise (``--resume`` is implied). ``trials`` is the study's
    budget; the workers may overshoot it by the trials the others have in flight.

    ``on_start()`` is called once every check has passed, before the first trial (the CLI prints the study's
    predicted cost there, so a refused study prints only its refusal). ``evaluator``: the study's, if the caller
    asks it too (:func:`study_evaluator`)."""
    out = Path(out_dir)
    parallel = space.search.parallel if parallel is None else parallel
    if parallel < 1:
        raise UserError(f"{parallel} trials at once; --parallel is at least 1", param="parallel")
    agent = agent or space.search.agent
    registry = load_agents()
    req = Request(
        agent,
        agent_settings(space, agent, sampler, registry),
        registry,
        space.search.seed if seed is None else seed,
        backend or space.backend.kind,
        trials=trials,
        rebuild=rebuild,
        on_trial=on_trial,
        on_model=on_model,
        seeds=list(seeds),
        parallel=parallel,
        worker=worker,
        lease_s=lease_s,
    )
    req = replace(req, evaluator=_own_evaluator(space, req.backend, evaluator))
    _probe(space, req)
    resume = outdir.check_target(out, resume=resume, rebuild=rebuild, worker=worker, default_out=default_out)
    # Everything the study will write must be writable before the first trial: the output directory's path
    # goes into best/'s scripts, so it must be one a script can carry; a storage URL must be usable.
    check_path(out.absolute(), param="out")
    storage = absolute_storage(storage) if storage is not None else None
    return _run_locked(space, out, replace(req, resume=resume, storage=storage), on_start)


def _run_locked(space: Space, out: Path, req: Request, on_start: Callable[[], None] | None) -> StudyResult:
    """The study in ``out``, held for this run. ``on_start`` (the CLI's cost prediction, seconds on a large space)
    runs once the directory is this run's, so that a refusal (in use by another run) comes before it."""
    try:
        with outdir.locked(out, worker=req.worker) as ready:
            if on_start is not None:
                on_start()
            resume = req.resume or (req.worker and (out / META).exists())  # another worker started it meanwhile
            return _run(space, out, replace(req, resume=resume), ready)
    except KeyboardInterrupt:
        if not (out / META).exists():  # stopped before the study started (its cost prediction): nothing to resume
            raise
        raise Interrupted(out, *outdir.saved_counts(out)) from None


def check_study(space: Space, *, agent: str | None = None, sampler: str | None = None) -> None:
    """What ``dse run`` checks before its first trial, with nothing written or launched: the agent, its sampler and
    options, the backend, and the launch scripts every trial and ``best/`` need (``dse validate`` runs it, so a
    space it accepts does not fail at ``dse run``'s start)."""
    agent = agent or space.search.agent
    registry = load_agents()
    options = agent_settings(space, agent, sampler, registry)
    request = Request(agent, options, registry, space.search.seed, space.backend.kind, parallel=space.search.parallel)
    _probe(space, request, prepare=False)


def _probe(space: Space, req: Request, *, prepare: bool = True) -> None:
    """Build the agent once on the bare action space, and the backend, so that a bad agent, sampler, option or
    backend fails before anything is written; and refuse a space with no valid point (a study of it would launch
    nothing and end as if it had succeeded). ``prepare=False`` (``dse validate``): the agent reads no file its
    options name (a policy), it only checks that it is there."""
    points = req.evaluator if req.evaluator is not None else Points(space)
    check_not_empty(space, points)
    probe = spaces.Dict(OrderedDict((k, spaces.Discrete(len(v))) for k, v in space.knobs.items()))
    try:
        make_agent(
            req.agent,
            req.registry,
            probe,
            seed=req.seed,
            prepare=prepare,
            **space_options(space, req.agent, req.options, req.registry, parallel=req.parallel),
        )
    except UserError as e:  # an option's problem is the space file's
        if e.file is not None:
            raise
        raise UserError(e.message, file=space.source or None, field=e.field, param=e.param) from None
    _preflight(space, req, make_backend(req.backend, space, req.seed), points)


def _preflight(space: Space, req: Request, backend: Backend, points: Points) -> None:
    """What every trial and ``best/`` will need, checked before the first trial (one line, nothing run): the
    launch plan the backend runs and the script it writes, and ``best/``'s plan and scripts (a Slurm script
    always, a local one for one node). Checked on the space's first point: the system's values and the
    settings are every point's, so a study that would fail at every launch, or at its end, never starts."""
    check_probe_screen(space, req.backend)
    trial = points.trial(next(iter(space.points())))
    settings = space.backend
    # best/ writes the payload a real run uses (dse.study.best.write_best: the sim payload's is nemo2)
    best_payload = "nemo2" if settings.payload == "sim" else settings.payload
    needed = "needed by every trial's launch"
    try:
        plan = build_plan(
            trial,
            payload=settings.payload,
            seed=req.seed,
            flops_convention=settings.flops_convention,
            simulated=backend.simulated,
            params=calibrated_params(settings.calibration),
        )
        with tempfile.TemporaryDirectory(prefix="dse-preflight-") as tmp:
            if backend.script_name is not None:
                type(backend).check_script(plan, Path(tmp) / "trial")
            needed = "needed by best/, the launch scripts of the best layout"
            best = build_plan(trial, payload=best_payload)
            for name in ("slurm", "local") if trial.layout.num_nodes == 1 else ("slurm",):
                make_backend_class(name).check_script(best, Path(tmp) / name)
    except UserError as e:
        raise UserError(
            f"{e.message} ({needed}; checked before the first trial)",
            file=e.file or space.source or None,
            field=e.field,
            param=e.param,
        ) from None


def make_backend_class(name: str) -> type[Backend]:
    """The backend class called ``name`` in the ``dse.backends`` registry."""
    return reg.get(load_backends(), name, Backend, group=reg.BACKENDS, param="backend")


def baseline_of(space: Space, evaluator: Evaluator | None = None) -> Baseline:
    """The study's baseline: the recipe's default layout for the GPU (what ``resolve`` gives the knobs the space
    varies when the point sets none: the recipe's ``recipe_layout`` knobs, NVIDIA's published layout where dse
    ships it, under the space's settings; ``Baseline.source`` says which). In the space (each value one the space
    lists, no rule broken) it is measured as the study's first trial; otherwise the model predicts it (calibrated
    as the space says) and the study shows it as a reference. A space that varies the precision gets the recipe's
    layout at the precision the model predicts best for the objective (fitting in memory): a user who allows FP8
    would run NVIDIA's FP8 layout, so a BF16 baseline would credit the search with the precision's gain. A knob
    the layout leaves at a value that is the same run as the space's first listed one (a CUDA graph scope without
    a graph, an FP8 recipe without FP8) takes that first value (:func:`_baseline_trial`). ``evaluator``: the
    study's, whose model (as it starts) predicts it."""
    ev = evaluator if evaluator is not None else Evaluator(space)
    start, trial = _baseline_trial(ev, _baseline_precision(ev))
    point = {
        k: (trial.env.get(k[len(knobs.ENV_PREFIX) :]) if knobs.is_env(k) else trial.values[k]) for k in space.knobs
    }
    metric, direction = space.objective.metric, space.objective.sense
    source = trial.recipe.layout_source(trial.system.gpu, str(trial.values["precision"]), trial.num_gpus)
    outside = [k for k, v in point.items() if v not in space.knobs[k]]
    broken = ev.check(point) if not outside else None
    if not outside and broken is None and space.search.baseline == "run":
        return Baseline(point, True, metric, direction, source=source)
    if outside:
        note = f"{', '.join(outside)} not among the space's values"
    else:
        note = f"it breaks {_rule(broken)}" if broken is not None else '[search] baseline = "predict"'
    if ev.check(start) is not None:
        return Baseline(
            point, False, metric, direction, None, note + "; the model cannot predict a broken layout", source
        )
    p = ev.predict(start)
    figures = {m: float(getattr(p, m)) for m in ("step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu")}
    return Baseline(point, False, metric, direction, figures, note, source)


def _baseline_trial(ev: Evaluator, point: dict[str, Any]) -> tuple[dict[str, Any], TrialConfig]:
    """``point`` (and its trial), with each knob a duplicate rule rejects (``constraints.DUPLICATE_RULES``: a value
    that runs the same job as the space's first listed one) moved to that first value: the recipe's layout leaves
    ``cuda_graph_scope`` at "full", which with no CUDA graph is the same run as any scope, and the baseline is that
    run, not a rejected point."""
    trial = ev.trial(point)
    for _ in range(len(constraints.DUPLICATE_RULES)):
        rej = ev.check(point)
        if rej is None or rej.rule not in constraints.DUPLICATE_RULES or not rej.knobs:
            break
        knob = rej.knobs[0]
        if knob not in trial.first_listed or point.get(knob) == trial.first_listed[knob]:
            break
        point = {**point, knob: trial.first_listed[knob]}
        trial = ev.trial(point)
    return point, trial


def _baseline_precision(ev: Evaluator) -> dict[str, Any]:
    """``{"precision": P}`` for a space that lists several precisions: the one whose recipe layout the model
    predicts best (valid and fitting); ``{}`` otherwise (the settings' precision, else the knob's default)."""
    space = ev.space
    listed = space.knobs.get("precision") or []
    if len(listed) < 2:
        return {}
    scored = []
    for p in listed:
        point, _ = _baseline_trial(ev, {"precision": p})
        if ev.check(point) is not None:
            continue
        pred = ev.predict(point)
        if pred.fits:
            value = float(getattr(pred, space.objective.metric))
            scored.append((value if space.objective.sense == "maximize" else -value, p))
    return {"precision": max(scored)[1]} if scored else {}


def _rule(broken: constraints.Rejection | None) -> str:
    """The name of the rule a layout breaks, for the baseline's note."""
    return broken.rule if broken is not None else "no rule"


def _run(space: Space, out: Path, req: Request, ready: Callable[[], None]) -> StudyResult:
    """The study in ``out``, which this process holds: open (or create) it, run the loop, write what it found.
    A new study records its baseline in ``dse.json`` (:func:`baseline_of`); one in the space runs first."""
    meta = outdir.new_meta(
        space,
        storage=req.storage,
        agent=req.agent,
        options=req.options,
        seed=req.seed,
        backend=req.backend,
        points=req.evaluator,
    )
    meta["baseline"] = baseline_of(space, req.evaluator).as_dict()
    store, meta, url = outdir.open_study(out, space, meta, resume=req.resume, rebuild=req.rebuild, worker=req.worker)
    base = Baseline.of_meta(meta)
    if base is not None and base.in_space:  # like a warm-start seed: skipped once the study has run it
        req = replace(req, seeds=[base.knobs, *req.seeds])
    ready()  # the study is there: other workers may join
    backend = make_backend(req.backend, space, req.seed)
    recorder = Recorder(store, out, packs_logs=backend.packs_logs)
    summary: Summary | None = None
    try:
        loop = StudyLoop(space, out, backend, recorder, req)
        loop.replay()
        loop.run()
        if req.on_model is not None:  # the runs that contradicted the screen, in the study's last words
            for line in loop.learner.contradictions:
                req.on_model(f"screen contradicted: {line}")
    except InfrastructureError:
        # dse could not write (disk full...): the trial in flight is not recorded (resume runs it again)
        recorder.abandon()
        raise
    finally:
        if not recorder.closed:  # what finished is in the store and the leaderboard, whatever stopped the loop
            summary, lb = recorder.finish(space, worker=req.worker)
    assert summary is not None  # the loop ended normally, so the finally above finished the recorder
    write_best_of(space, summary, out)  # only when the loop ended normally
    return StudyResult(
        out, None, loop.new, lb, loop.stop_reason, summary=summary, _source=(url, meta["study_name"], meta["knobs"])
    )


def _point(knobs: dict[str, Any]) -> tuple:
    return tuple(sorted(knobs.items()))


def _rerun(r: TrialRecord) -> bool:
    """Whether a resume runs this stored trial again: interrupted, or failed for infrastructure (a launch that
    could not start; not the layout's failure)."""
    return r.interrupted or InfrastructureFailure.of(r.status, r.reason) is not None


def _reruns(store: Store, interrupted: list[TrialRecord]) -> list[TrialRecord]:
    """The interrupted (and infrastructure-failed) rows to run again, one per point. A row whose point ran again later anyway (a study from
    a dse that appended reruns) is left as it is: rerunning it would run the point twice (a second streamed
    pass, only when there are such rows)."""
    if not interrupted:
        return []
    wanted = {_point(r.knobs) for r in interrupted}
    finished = {_point(r.knobs) for r in store.iter_records() if not _rerun(r) and _point(r.knobs) in wanted}
    reruns: list[TrialRecord] = []
    for r in interrupted:
        if _point(r.knobs) not in finished and all(r.knobs != q.knobs for q in reruns):
            reruns.append(r)
    return reruns


class StudyLoop:
    """One study's trials, run by its agent. Its state: ``queued`` (reruns of interrupted trials and seed points,
    run before the agent proposes: (number or None, action)), ``in_flight`` (number -> action, while a trial
    runs in the pool), ``best`` (the best value of the objective's metric measured so far, resumed trials and
    other workers' included: for pruning) and ``done`` (launched trials: the budget counts these; a rejected
    point and a screened one cost nothing). ``new`` counts the trials this run recorded.

    Without a pool (``--parallel 1``, no ``--worker``) each trial runs in the calling thread; with one, the
    calling thread proposes, launches and records, the pool's threads only run trials."""

    def __init__(self, space: Space, out: Path, backend: Backend, recorder: Recorder, req: Request):
        self.space, self.out, self.backend, self.recorder, self.req = space, out, backend, recorder, req
        self.queued: deque[tuple[int | None, dict[str, int]]] = deque()
        self.in_flight: dict[int, dict[str, int]] = {}
        self.best: float | None = None
        self.done = 0
        self.new = 0
        self.known: set[int] = set()  # --worker: the trials the agent has been shown (others' as they come)
        self.stop_reason: str | None = None
        self.seeding = False  # reruns and seeds first: all of them ended before the agent proposes
        self.idle = False  # the agent had nothing to propose while trials ran: ask again after the next result
        self.claims: Claims | None = None
        self.pool = Pool(req.parallel) if req.parallel > 1 or req.worker else None
        # the study's evaluator: a point's trial, rules and prediction, each once; its model (dse.perfmodel.refit: refit
        # on the study's measured runs) gives the memory screen when on, the agents' forecasts and each launch's figures
        self.model = req.evaluator if req.evaluator is not None else study_evaluator(space, req.backend)
        self.learner: StudyModel = self.model.model
        self.budget, self.total = _budget(space, req, self.model)
        self.screen = self.model if self.model.on else None
        # [search] screen = "probe": each point probed on one GPU before its launch (dse.study.probe_screen)
        self.prober = (
            ProbeScreen(space, out, req.backend, self.model, worker=req.worker)
            if space.search.screen == "probe"
            else None
        )
        self._running = threading.local()  # the number of the trial this thread runs (its run directory)
        self._synced = time.monotonic()
        self.env = RecipeEnv(
            space,
            backend,
            out,
            run_dirs=lambda: trial_dir(out, self._running.number),
            best=lambda: self.best,
            cancel=self.pool.cancel_event if self.pool else None,
            points=self.model,
        )
        self.env.reset(seed=req.seed)
        self.agent = make_agent(
            req.agent,
            req.registry,
            self.env.action_space,
            seed=req.seed,
            action_mask=self.env.action_mask,
            forecast=self.model.forecaster(),
            **space_options(space, req.agent, req.options, req.registry, parallel=req.parallel),
        )

    def _learn(self, number: int, knobs: dict[str, Any], status: str, metrics, *, refit: bool = True) -> None:
        """A finished run shown to the study's model (dse.perfmodel.refit): refit, its line said, the fit kept in the study's
        directory (MODEL_FILE), the agent's forecasts renewed."""
        trial = self.model.trial(knobs)
        line = self.learner.observe(number, trial, status, metrics, refit=refit)
        if line is not None:
            self._refitted(line)

    def _refitted(self, line: str) -> None:
        write_calibration(self.learner.calibration(self.space.system.gpu, str(self.out)), self.out / MODEL_FILE)
        self.agent.reforecast()
        if self.req.on_model is not None:
            self.req.on_model(line)

    # -- before the first trial -----------------------------------------------------------------------
    def replay(self) -> None:
        """Resume: the stored trials shown to the agent in one streamed pass (no list of the study's records;
        only their knobs, and only when seed points must be checked against them). Interrupted rows (few) are
        queued first: each runs again under its own number and in its own run directory, its result in place
        of its row (Store.replace). Then the seed points not yet run."""
        seeds = list(self.req.seeds)
        ran: list[dict[str, Any]] = []
        interrupted: list[TrialRecord] = []
        self.agent.warm_start(self._history(interrupted, ran if seeds else None))
        if self.learner.learns and self.learner.runs:  # resume: refit once on every stored run
            line = self.learner.refit()
            if line is not None:
                self._refitted(line.replace("model:", "model (resumed):", 1))
        reruns = _reruns(self.recorder.store, interrupted)
        rerun_points = [r.knobs for r in reruns]
        self.queued.extend((r.number, self.env.encode(r.knobs)) for r in reruns)
        self.queued.extend(
            (None, self.env.encode(p))
            for i, p in enumerate(seeds)
            if p not in ran and p not in rerun_points and p not in seeds[:i]
        )
        self.seeding = bool(self.queued)

    def _history(self, interrupted: list[TrialRecord], ran: list[dict[str, Any]] | None) -> Iterator[tuple]:
        for r in self.recorder.store.iter_records():
            if _rerun(r):
                interrupted.append(r)
                continue
            if self.req.worker:
                self.known.add(r.number)
            self.done += r.status not in UNLAUNCHED_STATUSES
            self.best = better(self.best, r.metrics, self.space.objective, ok=r.ok)
            if ran is not None:
                ran.append(r.knobs)
            self._learn(r.number, r.knobs, r.status, r.metrics, refit=False)
            yield self.env.encode(r.knobs), r.reward, r.ok, r.status, r.metrics

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Launch, wait, record, until the budget is spent or the agent has nothing left to propose. Whatever
        stops it (a Ctrl-C, an error) stops the trials still running first (their backend's way: scancel, the
        process group) and records each as it ended: interrupted, unless it had finished."""
        self.claims = Claims(self.recorder.store, lease_s=self.req.lease_s) if self.req.worker else None
        try:
            while True:
                self._fill()
                if not self.in_flight:
                    return
                assert self.pool is not None  # trials are in flight only in a pool (_fill runs the others here)
                self._collect(self.pool.wait())
                self.idle = False
        except BaseException:
            self._cancel_in_flight()
            raise
        finally:
            if self.pool is not None:
                self.pool.close()
            if self.claims is not None:
                self.claims.close()  # what it still holds (interrupted trials) is free for --resume at once

    def _fill(self) -> None:
        """Start trials while there is room (a free slot, budget left) and something to run."""
        while (self.pool is None or self.pool.free > 0) and (
            self.budget is None or self.done + len(self.in_flight) < self.budget
        ):
            chosen = self._next()
            if chosen is None:
                return
            number, action = chosen
            if number is None and self._screened(action):
                continue
            if self.pool is None:
                if number is None or not self._ended_meanwhile(number, action):
                    self._run_here(
                        self.recorder.next_number() if number is None else number, action, rerun=number is not None
                    )
            elif not self._launch(number, action):
                self._sync()  # another worker has the point: learn what the others found (once a second)

    def _next(self) -> tuple[int | None, dict[str, int]] | None:
        """The next trial to start: a queued one, else the agent's proposal; None when there is none now (the
        agent's last word is kept when it has stopped for good)."""
        if self.queued:
            return self.queued.popleft()
        if self.seeding and self.in_flight:
            return None
        self.seeding = False
        if self.idle:
            return None
        self._sync()
        action = self.agent.propose()
        if action is None:
            if self.in_flight:
                self.idle = True
            else:
                self.stop_reason = self.agent.stop_reason
            return None
        return None, action

    def _screened(self, action: dict[str, int]) -> bool:
        """The memory screen (``[search] screen``): a valid point the model predicts beyond the GPU's memory by
        more than the margin is recorded ``screened`` at once (never launched, no GPU-hours, no launched run)
        and shown to the agent as a failure; True when the point was screened (or another worker has it)."""
        if self.screen is None:
            return False
        if self.env.rejection(action) is not None:
            return False  # rejected: the environment records it as such
        point, trial = self.env.decode(action), self.env.trial(action)
        if self.prober is None:
            why = self.screen.reason(point)
        else:  # the out-of-memory neighbour rule first: a point it screens costs no probe
            why = self.learner.oom_neighbour(trial) or self.prober.reason(action, trial)
        if why is None:
            return False
        over = False
        if self.claims is not None:
            point = self.env.decode(action)
            if not self.claims.claim(point):
                return True  # another worker has (or had) the point
            number = self.recorder.numbered(self._placeholder(0, action))
            self.claims.numbered(point, number)
            over = True
        else:
            number = self.recorder.next_number()
        result = StepResult(*self.env.outcome(action, RunMetrics.screened(why), launched=False, trial=trial))
        result = with_predicted(result, _as_metrics(self.model.point(point)))
        self._finish(number, action, result, over=over)
        return True

    def _step(self, number: int, action: dict[str, int]) -> StepResult:
        """One environment step, in trial ``number``'s run directory (in whichever thread runs it), with what the
        study's model predicted for the point as it launched."""
        self._running.number = number
        predicted = self._predicted(action)
        return with_predicted(StepResult(*self.env.step(action)), predicted)

    def _predicted(self, action: dict[str, int]) -> dict[str, float]:
        """The study's model's figures for the action's point now (:func:`dse.study.leaderboard.predicted_metrics`);
        none for a point that is not launched for a rule or the backend (the model cannot predict a broken layout)."""
        if self.env.rejection(action) is not None:
            return {}
        return _as_metrics(self.model.point(self.env.decode(action)))

    def _run_here(self, number: int, action: dict[str, int], *, rerun: bool) -> None:
        """One trial in this thread (``--parallel 1``, and points rejected without a launch)."""
        try:
            result = self._step(number, action)
        except KeyboardInterrupt:
            if (got := self._finished_anyway(number, action)) is not None:
                self._finish(number, action, got, over=rerun, check=False)
            elif not rerun:  # recorded as interrupted (not a result): --resume runs the point again
                self.recorder.record(self._placeholder(number, action), over=False)
            raise
        self._finish(number, action, result, over=rerun)

    def _launch(self, number: int | None, action: dict[str, int]) -> bool:
        """One trial into the pool: its number is taken now (an interrupted row until its result comes).
        With ``--worker`` the point is claimed first; False when another worker has it (or had it)."""
        if self.claims is not None:
            return self._launch_claimed(self.claims, number, action)
        if number is not None:
            if self._ended_meanwhile(number, action):
                return True
        elif self.env.rejection(action) is not None:  # never launched: recorded at once
            self._run_here(self.recorder.next_number(), action, rerun=False)
            return True
        else:
            number = self.recorder.next_number()
            self.recorder.launched(self._placeholder(number, action))
        self._submit(number, action)
        return True

    def _launch_claimed(self, claims: Claims, number: int | None, action: dict[str, int]) -> bool:
        point = self.env.decode(action)
        if not claims.claim(point):
            return False
        if number is not None and self._ended_meanwhile(number, action):
            return True
        if number is None:
            number = self.recorder.numbered(self._placeholder(0, action))  # numbered by the storage
        claims.numbered(point, number)
        if self.env.rejection(action) is not None:
            self._run_here(number, action, rerun=True)
        else:
            self._submit(number, action)
        return True

    def _submit(self, number: int, action: dict[str, int]) -> None:
        assert self.pool is not None  # _launch runs only with a pool (_fill)
        self.in_flight[number] = action
        self.pool.submit(number, lambda: self._step(number, action))

    def _collect(self, results: list[Done], *, check: bool = True) -> None:
        """Record finished pool jobs. A job interrupted (a Ctrl-C inside it, or the cancel event) keeps its
        interrupted row unless its run had in fact ended; an error that one of them raised (a bug, dse's own
        failure) or an interrupt is raised once all are recorded (``check``; not while cancelling)."""
        raised: BaseException | None = None
        for d in results:
            action = self.in_flight.pop(d.key)
            result = d.value
            if isinstance(d.error, (KeyboardInterrupt, Cancelled)):
                raised = raised or KeyboardInterrupt()
                if (result := self._finished_anyway(d.key, action)) is None:
                    continue  # its placeholder stays: interrupted
            elif d.error is not None:
                raised = raised or d.error
                continue
            self._finish(d.key, action, result, over=True, check=check)
        if raised is not None and check:
            raise raised

    def _cancel_in_flight(self) -> None:
        """Cancel the pool's trials and record what each came to (the first error is the one reported)."""
        if self.pool is None or not self.in_flight:
            return
        for d in self.pool.cancel():
            try:
                self._collect([d], check=False)
            except Exception:  # noqa: BLE001 - recording one cancelled trial must not hide the error being raised
                pass

    # -- recording -----------------------------------------------------------------------------------
    def _finish(
        self, number: int, action: dict[str, int], result: StepResult, *, over: bool, check: bool = True
    ) -> None:
        """Record a result (``over``: in place of the trial's stored row) and show it to the agent; ``check``:
        then ask the backend whether the study should end (sbatch refusing every job the same way)."""
        info = result.info
        rec = record_of(number, info, result.reward, precision=self.env.trial(action).values["precision"])
        self.recorder.record(rec, over=over)
        self.best = better(self.best, rec.metrics, self.space.objective, ok=rec.ok)
        if self.claims is not None:
            self.claims.done(info["knobs"])
            self.known.add(number)
        if InfrastructureFailure.of(info["status"], info.get("reason")) is not None:
            # an infrastructure failure (sbatch refused the job, a launcher that cannot start) says nothing of
            # the layout: the agent is not shown it, as a resume does not replay it (_history); it closes what it
            # opened for the point (Agent.abandon)
            self.agent.abandon(action)
        else:
            if info["status"] not in UNLAUNCHED_STATUSES:
                self._learn(number, info["knobs"], info["status"], info["metrics"])
            self.agent.observe(
                action, result.reward, info["status"] == "ok", status=info["status"], metrics=info["metrics"]
            )
        self.done += info["status"] not in UNLAUNCHED_STATUSES
        self.new += 1
        if self.req.on_trial:
            self.req.on_trial(rec, self.done, self.total, self.best)
        if check and (why := self.backend.stop_reason()) is not None:
            raise UserError(why, file=self.space.source or None, field=f"system {self.space.system.name}")

    def _placeholder(self, number: int, action: dict[str, int]) -> TrialRecord:
        return placeholder(number, self.env.trial(action), self.space.objective.failed_reward)

    def _finished_anyway(self, number: int, action: dict[str, int]) -> StepResult | None:
        """After a Ctrl-C: the step result of a trial whose run had in fact ended by itself (a Slurm job that
        COMPLETED), parsed as it finished; None when it was interrupted."""
        trial = self.env.trial(action)
        result = self.backend.finished_after_interrupt(trial, trial_dir(self.out, number))
        if result is None or not Path(result.log_path).exists():
            return None
        metrics = parse_log(
            Path(result.log_path),
            exit_code=result.exit_code,
            scheduler_state=result.scheduler_state,
            context=parse_context(trial, self.space.backend),
        )
        got = StepResult(*self.env.outcome(action, replace(metrics, wall_s=result.wall_s), trial=trial))
        return with_predicted(got, self._predicted(action))

    def _ended_meanwhile(self, number: int, action: dict[str, int]) -> bool:
        """A rerun whose earlier run had in fact finished (a Slurm job that COMPLETED after the dse that
        launched it was gone) is parsed and recorded in place instead of run again."""
        if (got := self._finished_anyway(number, action)) is None:
            return False
        self._finish(number, action, got, over=True)
        return True

    def _sync(self) -> None:
        """``--worker``: show the agent what the other workers finished since (at most once a second)."""
        if self.claims is None or time.monotonic() - self._synced < 1.0:
            return
        self._synced = time.monotonic()
        for r in self.recorder.store.iter_records():
            if r.number in self.known or r.interrupted:
                continue
            self.known.add(r.number)
            self.best = better(self.best, r.metrics, self.space.objective, ok=r.ok)  # pruning: every worker's best
            if (
                InfrastructureFailure.of(r.status, r.reason) is None
            ):  # another worker's launch that failed: nothing to learn
                self.agent.observe(self.env.encode(r.knobs), r.reward, r.ok, status=r.status, metrics=r.metrics)
            self.done += r.status not in UNLAUNCHED_STATUSES


def forecast_cost(
    space: Space, *, agent: str | None = None, trials: int | None = None, evaluator: Evaluator | None = None
) -> StudyCost:
    """What a study of ``space`` by ``agent`` (default: the space's) is forecast to cost, before it starts: its
    budget as ``_budget`` resolves it (``--trials``, else the space's own agent's ``[search] trials``), or every
    valid point the memory screen keeps. ``evaluator``: the study's (what it computes is kept for the study)."""
    agent = agent or space.search.agent
    budget = trials if trials is not None else (space.search.trials if agent == space.search.agent else None)
    return study_cost(evaluator if evaluator is not None else space, budget)


def _budget(space: Space, req: Request, evaluator: Evaluator) -> tuple[int | None, int | None]:
    """The study's budget (launched runs) and the total its progress counts to. ``--trials`` wins; the space's
    ``[search].trials`` belongs to the space's own agent; otherwise no budget: the agent runs until it has
    nothing left (grid: every valid point the screen keeps once, counted for the progress bar when the space is
    small enough)."""
    budget = (
        req.trials if req.trials is not None else (space.search.trials if req.agent == space.search.agent else None)
    )
    total = budget
    if total is None and req.agent == "grid" and space.size <= WALK_LIMIT:
        # exact at this size (the grid refuses a larger space); screened points are no launched runs
        total = (
            count_valid(space, points=evaluator).valid
            if space.search.screen == "none"
            else study_cost(evaluator, None).runs
        )
    return budget, total
