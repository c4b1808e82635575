"""What a study is asked to do, and what is checked before its first trial.

:class:`Request` is a study's request with every default resolved (the space's, then the caller's): the agent and
its options (:func:`agent_settings`, :func:`space_options`), the backend (:func:`make_backend`), the seed, the
budget. :func:`check_request` builds the study's evaluator (:func:`study_evaluator`), refuses a space with no valid
point, builds the agent once on the bare action space and the backend, and renders the launch scripts every trial
and ``best/`` need, so that a study that would fail at every launch never starts (``dse validate`` runs the same
checks, :func:`check_study`). The study's baseline (:func:`baseline_of`) and its forecast cost
(:func:`forecast_cost`) are asked of the study's evaluator.
"""

from __future__ import annotations

import tempfile
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gymnasium import spaces

from dse import registry as reg
from dse.agents.base import agent_class, agent_options, load_agents, make_agent
from dse.backends import Backend, load_backends
from dse.errors import UserError
from dse.evaluator import Evaluator
from dse.facts import knobs
from dse.forecast import StudyCost, study_cost
from dse.launch import build_plan
from dse.perfmodel.calibrate import calibrated_miss, calibrated_params
from dse.rules import constraints
from dse.rules.counting import check_not_empty
from dse.rules.points import Points
from dse.rules.space import Space
from dse.rules.trial import TrialConfig
from dse.study import outdir
from dse.study.claims import LEASE_S
from dse.study.leaderboard import Baseline
from dse.study.probe_screen import check_probe_screen
from dse.study.store import TrialRecord


def learns(space: Space, backend: Backend | type[Backend]) -> bool:
    """Whether a study's runs refit its model (dse.perfmodel.refit): measured runs do (a real backend, a replay) and so do the
    simulated backend's ``twin`` truth's, a stand-in for a machine that is not the model (so the loop is testable
    without GPUs); the simulated backend's ``exact`` truth is the model itself and teaches it nothing. None do
    when the space turns learning off (``[search] learn = false``, ``dse run --no-learn``)."""
    return space.search.learn and (not backend.simulated or space.backend.truth == "twin")


def make_backend(name: str, space: Space, seed: int) -> Backend:
    """The backend called ``name`` from the ``dse.backends`` registry, built for ``space``."""
    return make_backend_class(name).from_space(space, seed=seed)


def make_backend_class(name: str) -> type[Backend]:
    """The backend class called ``name`` in the ``dse.backends`` registry."""
    return reg.get(load_backends(), name, Backend, group=reg.BACKENDS, param="backend")


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


@dataclass(frozen=True)
class Request:
    """What a study is asked to do: :func:`dse.study.loop.run_study`'s one argument beside the space (``dse run``
    builds it from its command line). A field left None takes the space's value: ``agent`` its ``[search] agent``,
    ``seed`` its ``[search] seed``, ``backend`` its ``[backend] kind``, ``parallel`` its ``[search] parallel``;
    ``out_dir`` None is the default output directory, ``runs/<space name>`` (an error then names it).

    ``trials``: the budget of launched runs (default: the space's ``[search] trials`` for its own agent).
    ``resume`` continues the study in ``out_dir``; ``rebuild`` (with ``resume``): when the storage holds no study
    although run directories say trials ran, start it anew instead of refusing. ``storage``: a SQLAlchemy URL
    (default: ``study.db`` in ``out_dir``). ``seeds``: points (knob values) run first, before the agent proposes,
    and shown to it as its own outcomes (warm start); a seed the study already ran is skipped. ``parallel``: trials
    in flight at once (:mod:`dse.study.parallel`). ``worker``: one of several processes on the same study, each
    point claimed in the storage before it runs (:mod:`dse.study.claims`; a dead worker's claims expire after
    ``lease_s``). ``on_trial(record, done, total, best)`` reports progress (total: the budget, or a grid's valid
    points, None when unknown; best: the best value of the objective's metric so far, resumed trials included);
    ``on_model(line)`` each refit's line and what contradicted the screen; ``on_start(cost)`` is called once every
    check has passed, before the first trial, with the study's forecast cost. ``evaluator``: the study's
    (:func:`study_evaluator`), if the caller asks it too."""

    out_dir: str | Path | None = None
    agent: str | None = None
    sampler: str | None = None
    trials: int | None = None
    seed: int | None = None
    backend: str | None = None
    resume: bool = False
    storage: str | None = None
    rebuild: bool = False
    seeds: Sequence[dict[str, Any]] = ()
    parallel: int | None = None
    worker: bool = False
    lease_s: float = LEASE_S
    on_trial: Callable[[TrialRecord, int, int | None, float | None], None] | None = None
    on_model: Callable[[str], None] | None = None
    on_start: Callable[[StudyCost], None] | None = None
    evaluator: Evaluator | None = None


@dataclass(frozen=True)
class Resolved:
    """A :class:`Request` resolved against its space (:func:`resolve_request`): ``asked``, the request as given; what it
    resolves to: the agent's name, its options (:func:`agent_settings`) and the registry it comes from, the seed,
    the backend's name, the trials at once, the seeds run first (a baseline in the space joins them), whether the
    study is resumed and its storage (an absolute URL); once checked (:func:`check_request`), the study's
    evaluator, which every step of a point's way asks."""

    asked: Request
    agent: str
    options: dict[str, Any]
    registry: Any
    seed: int
    backend: str
    parallel: int = 1
    seeds: Sequence[dict[str, Any]] = ()
    resume: bool = False
    storage: str | None = None
    evaluator: Evaluator | None = None


def resolve_request(space: Space, asked: Request) -> Resolved:
    """``asked`` resolved against ``space`` (each None its space's value); the agent's options checked."""
    parallel = space.search.parallel if asked.parallel is None else asked.parallel
    if parallel < 1:
        raise UserError(f"{parallel} trials at once; a study runs at least 1", param="parallel")
    agent = asked.agent or space.search.agent
    registry = load_agents()
    return Resolved(
        asked,
        agent,
        agent_settings(space, agent, asked.sampler, registry),
        registry,
        space.search.seed if asked.seed is None else asked.seed,
        asked.backend or space.backend.kind,
        parallel,
        seeds=list(asked.seeds),
        resume=asked.resume,
    )


def study_evaluator(space: Space, backend: str | None = None) -> Evaluator:
    """The evaluator of a study of ``space`` on ``backend`` (default: the space's): the study's model
    (:class:`dse.perfmodel.refit.StudyModel`, from the space's calibration; it learns from the runs where :func:`learns`
    says so), its points resolved, checked and predicted once each. Build it once per study and hand it to
    everything that asks about a point (``run_study(evaluator=...)``, :func:`forecast_cost`)."""
    try:
        cls = make_backend_class(backend or space.backend.kind)
    except UserError:  # refused by the study's checks, in their order (the agent's first): it never runs
        cls = None
    return Evaluator(space, learns=cls is not None and learns(space, cls))


def check_study(space: Space, *, agent: str | None = None, sampler: str | None = None) -> None:
    """What ``dse run`` checks before its first trial, with nothing written or launched: the agent, its sampler and
    options, the backend, and the launch scripts every trial and ``best/`` need (``dse validate`` runs it, so a
    space it accepts does not fail at ``dse run``'s start)."""
    check_request(space, resolve_request(space, Request(agent=agent, sampler=sampler)), prepare=False)


def check_request(
    space: Space, req: Resolved, evaluator: Evaluator | None = None, *, prepare: bool = True
) -> tuple[Resolved, Backend]:
    """``req`` with the study's evaluator (``evaluator``, else :func:`study_evaluator`), and the study's backend
    (:func:`make_backend`, built once: checked here, then run), once the checks pass: a
    space with no valid point is refused (a study of it would launch nothing and end as if it had succeeded); the
    agent is built once on the bare action space, and the backend, so that a bad agent, sampler, option or backend
    fails before anything is written; then :func:`_preflight`. ``prepare=False`` (``dse validate``): the points are
    checked without a model, and the agent reads no file its options name (a policy), it only checks that it is
    there."""
    if evaluator is not None and evaluator.space is not space:
        raise ValueError("the evaluator given to run_study is another space's")
    options = space_options(space, req.agent, req.options, req.registry, parallel=req.parallel)
    if evaluator is None:
        evaluator = study_evaluator(space, req.backend) if prepare else None
    points = evaluator if evaluator is not None else Points(space)
    check_not_empty(space, points)
    probe = spaces.Dict(OrderedDict((k, spaces.Discrete(len(v))) for k, v in space.knobs.items()))
    try:
        make_agent(req.agent, req.registry, probe, seed=req.seed, prepare=prepare, **options)
    except UserError as e:  # an option's problem is the space file's
        if e.file is not None:
            raise
        raise UserError(e.message, file=space.source or None, field=e.field, param=e.param) from None
    backend = make_backend(req.backend, space, req.seed)
    _preflight(space, req, backend, points)
    return replace(req, evaluator=evaluator), backend


def _preflight(space: Space, req: Resolved, backend: Backend, points: Points) -> None:
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


def forecast_cost(
    space: Space, *, agent: str | None = None, trials: int | None = None, evaluator: Evaluator | None = None
) -> StudyCost:
    """What a study of ``space`` by ``agent`` (default: the space's) is forecast to cost, before it starts: its
    budget as ``_budget`` resolves it (``--trials``, else the space's own agent's ``[search] trials``), or every
    valid point the memory screen keeps. ``evaluator``: the study's (what it computes is kept for the study)."""
    agent = agent or space.search.agent
    budget = trials if trials is not None else (space.search.trials if agent == space.search.agent else None)
    return study_cost(evaluator if evaluator is not None else space, budget)


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
