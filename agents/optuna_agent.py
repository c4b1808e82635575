"""Optuna-driven search by ask/tell (TPE by default, seeded).

The agent keeps its own in-memory study (the sampler's memory); the store is the durable record, where a
failed or rejected trial is a FAIL trial. On resume the history is replayed into the sampler's study
(``warm_start``). A point that was already tried is not run again, nor asked for again: the sampler's trial
for it is told FAIL (every sampler ignores FAIL trials) and an untried point near it runs instead, so each
proposal costs one ask (a TPE ask fits every trial told so far) and the sampler's history holds each point once.

Failures reach the sampler as PRUNED trials, never as a sentinel value. Why not FAIL: Optuna's TPE ignores
FAIL trials altogether, so a sampler told FAIL keeps proposing out-of-memory layouts (measured on the 405B
space: 87 of 150 trials OOM). TPE ranks a pruned trial without intermediate values below every completed
one, so it learns to avoid the region without being given a made-up number. A ``pruned`` trial (a loser
stopped early, dse.logs.steady) is PRUNED too, with its reward (the optimistic bound it lost with) as its one
intermediate value: TPE ranks pruned trials with an intermediate value by it, above those without, so a
pruned layout counts as a loser that ran, not as a failure.

Ordinal knobs (``ordinal``: names whose values the space lists in ascending order, such as tp, pp, mbs)
reach the sampler as integer distributions over the value's index, so TPE and GP can use the order; the
others stay categorical. ``warm_start = "model"`` enqueues the ``WARM_START_POINTS`` points with the best
forecast reward (the shipped performance model, among those it predicts to fit) before the sampler's own.

Several trials in flight (``dse run --parallel N``: ``parallel`` > 1, filled in by the study): TPE asks with
the constant liar (``TPESampler(constant_liar=True)``), which treats running trials as poor results so that
concurrent asks spread out. The other samplers have no such option: random and qmc draw independently of
running trials anyway (qmc's sequence never repeats), GP, NSGA-II and CMA-ES ignore running trials (they
see only finished ones), so their concurrent asks may cluster. Whatever the sampler, a point already in flight
is never handed out twice: such an ask is told FAIL and an untried point near it is taken, as for a tried one.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from pydantic import Field

from dse.agents.base import Action, Agent, NoOptions, RejectionRun
from dse.errors import UserError, did_you_mean
from dse.rules.space import WALK_LIMIT


def _samplers(
    seed: int, parallel: int = 1, tpe_startup: int = 10, tpe_multivariate: bool = False
) -> dict[str, Callable[[], optuna.samplers.BaseSampler]]:
    return {
        # several trials in flight: the constant liar scores running trials as bad ones, so parallel asks spread
        "tpe": lambda: optuna.samplers.TPESampler(
            seed=seed,
            constant_liar=parallel > 1,
            n_startup_trials=tpe_startup,
            multivariate=tpe_multivariate,
        ),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        # scrambled, so that the seed chooses the sequence (an unscrambled Sobol sequence is the same for all)
        "qmc": lambda: optuna.samplers.QMCSampler(seed=seed, scramble=True),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
        "gp": lambda: optuna.samplers.GPSampler(seed=seed),
        "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False),
    }


# What a sampler needs beyond a plain install, as (module, the extra that brings it): Optuna imports these
# lazily and fails mid-study; dse checks them before anything is written.
SAMPLER_NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "qmc": (("scipy", "qmc"),),
    "gp": (("torch", "gp"), ("scipy", "gp")),
    "cmaes": (("cmaes", "cmaes"),),
}


def check_sampler_available(sampler: str) -> None:
    """A one-line :class:`UserError` naming the extra to install when a sampler's dependency is missing."""
    import importlib.util

    for module, extra in SAMPLER_NEEDS.get(sampler, ()):
        if importlib.util.find_spec(module) is None:
            raise UserError(
                f"sampler {sampler!r} needs {module}, which is not installed: pip install 'dse[{extra}]'",
                field="search.sampler",
            )


class OptunaOptions(NoOptions):
    sampler: str = "tpe"  # checked against the samplers below, with the closest name suggested
    warm_start: str = "none"  # "model": the model's top points first ([search] warm_start sets it)
    ordinal: list[str] = []  # knobs to hand the sampler as ordered integers (the study fills it in)
    parallel: int = 1  # trials in flight at once (the study fills it in from --parallel)
    # proposals in a row that were rejected before launch, after which the agent stops (and says so)
    max_rejected: int = Field(500, ge=1, le=10**9)
    # TPE's random start (trials before the model) and its joint density over the knobs (Optuna's multivariate)
    tpe_startup: int = Field(10, ge=0, le=10_000)
    tpe_multivariate: bool = False


class OptunaAgent(Agent):
    name = "optuna"
    Options = OptunaOptions
    uses_mask = False  # rejected points are recorded as failed trials, so the sampler learns them
    uses_model = True  # for warm_start = "model" only
    NEAR_DRAWS = 32  # random neighbours drawn at each distance from a repeated proposal before a uniform untried one
    WARM_START_POINTS = 5

    def __init__(
        self,
        action_space,
        *,
        sampler: str = "tpe",
        warm_start: str = "none",
        ordinal=(),
        forecast=None,
        parallel: int = 1,
        max_rejected: int = 500,
        tpe_startup: int = 10,
        tpe_multivariate: bool = False,
        **kw,
    ):
        super().__init__(action_space, **kw)
        if warm_start not in ("none", "model"):
            raise UserError(f"unknown warm start {warm_start!r}; use none or model", field="search.warm_start")
        makers = _samplers(self.seed, parallel, tpe_startup, tpe_multivariate)
        if sampler not in makers:
            raise UserError(
                f"unknown sampler {sampler!r}{did_you_mean(sampler, makers)}; known: {', '.join(makers)}",
                field="search.sampler",
            )
        check_sampler_available(sampler)
        categorical = [n for n, k in zip(self.names, self.sizes) if k > 1 and n not in ordinal]
        if sampler == "cmaes" and categorical:
            # CMA-ES samples only numeric parameters: Optuna hands categorical ones to a random sampler, so a
            # space of categorical knobs gets exactly the random sampler's trials (measured: 15 of 15 runs).
            raise UserError(
                f"cmaes samples only ordered knobs (values listed ascending); {', '.join(categorical)} "
                "would be sampled at random: use tpe, or vary only ordered knobs",
                field="search.sampler",
            )
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with warnings.catch_warnings():  # some samplers are marked experimental; that is not the user's error
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study = optuna.create_study(direction="maximize", sampler=makers[sampler]())
        self.dists: dict[str, BaseDistribution] = {
            n: IntDistribution(0, k - 1) if (n in ordinal and k > 1) else CategoricalDistribution(list(range(k)))
            for n, k in zip(self.names, self.sizes)
        }
        total = math.prod(self.sizes)  # a Python int: exact however large
        if warm_start == "model" and total > WALK_LIMIT:
            raise UserError(
                f'warm_start = "model" ranks every point; this space has {total:,} raw points (at most {WALK_LIMIT:,})',
                field="search.warm_start",
            )
        if warm_start == "model" and forecast is not None:
            ranked = []
            for key in self.all_keys():
                f = forecast(self.to_action(key))
                if f is not None and f.peak_memory_gib <= f.memory_gib:
                    ranked.append((-f.reward, key))
            for _, key in sorted(ranked)[: self.WARM_START_POINTS]:
                self.study.enqueue_trial(self.to_action(key))
        self.outcomes: dict[tuple[int, ...], tuple[float, bool, bool]] = {}  # reward, ok, pruned
        self._total = total
        self._pending: dict[tuple[int, ...], optuna.trial.Trial | None] = {}
        self._rng = np.random.default_rng(self.seed)
        self._rejected = RejectionRun(max_rejected)

    def propose(self) -> Action | None:
        """One ask of the sampler. A point it proposes that was tried (or is in flight) is not asked again: each
        ask fits TPE to every trial told so far, and a sampler sure of its best region keeps proposing its best
        points (measured: 716 asks for 79 proposals of the 70B space, each repeat told again as a new trial, so
        the next fit was larger and surer still). Its trial is told FAIL (every sampler ignores FAIL trials, so
        the sampler's history holds each point once) and an untried point near the proposal runs instead."""
        if len(self.outcomes) + len(self._pending) >= self._total:
            return None
        if (why := self._rejected.stop_reason("optuna")) is not None:
            self.stop_reason = why
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            trial = self.study.ask(self.dists)
        key = self.key({n: int(trial.params[n]) for n in self.names})
        if key not in self.outcomes and key not in self._pending:
            self._pending[key] = trial
            return self.to_action(key)
        self.study.tell(trial, state=TrialState.FAIL)
        near = self._near(key)
        if near is None:
            return None
        self._pending[near] = None  # told through add_trial in observe()
        return self.to_action(near)

    def _untried(self, key: tuple[int, ...]) -> bool:
        return key not in self.outcomes and key not in self._pending

    def _near(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        """An untried point near ``key``: ``NEAR_DRAWS`` random draws that change one knob, then two, and so
        on (the sampler chose this region; a neighbour keeps its guidance), else a uniform untried point (listed,
        or drawn in a space too large to list); None when there is none."""
        varied = [i for i, n in enumerate(self.sizes) if n > 1]
        for d in range(1, len(varied) + 1):
            for _ in range(self.NEAR_DRAWS):
                point = list(key)
                for i in map(int, self._rng.choice(varied, size=d, replace=False)):
                    point[i] = (point[i] + 1 + int(self._rng.integers(self.sizes[i] - 1))) % self.sizes[i]
                if self._untried(tuple(point)):
                    return tuple(point)
        if self._total > WALK_LIMIT:
            for _ in range(WALK_LIMIT):
                drawn = tuple(int(self._rng.integers(n)) for n in self.sizes)
                if self._untried(drawn):
                    return drawn
            return None
        untried = [k for k in self.all_keys() if self._untried(k)]
        return untried[int(self._rng.integers(len(untried)))] if untried else None

    def _tell(self, trial, reward: float, ok: bool, pruned: bool = False) -> None:
        if ok:
            self.study.tell(trial, reward)
        else:
            if pruned and math.isfinite(reward):
                trial.report(reward, step=0)
            self.study.tell(trial, state=TrialState.PRUNED)

    def abandon(self, action: Action) -> None:
        """The sampler's trial for it is told FAIL (which samplers ignore), not left RUNNING, where the constant
        liar would keep scoring it as a bad point; the point stays in flight here, so it is not asked again."""
        key = self.key(action)
        trial = self._pending.get(key)
        if trial is not None:
            self.study.tell(trial, state=TrialState.FAIL)
            self._pending[key] = None

    def observe(self, action: Action, reward: float, ok: bool, **kw) -> None:
        super().observe(action, reward, ok, **kw)
        self._rejected.observe(kw.get("status"))
        key = self.key(action)
        pruned = kw.get("status") == "pruned" and math.isfinite(reward)
        self.outcomes[key] = (reward, ok, pruned)
        trial = self._pending.pop(key, None)
        if trial is not None:
            self._tell(trial, reward, ok, pruned)
        else:  # warm start, or a point chosen outside the sampler
            self.study.add_trial(
                create_trial(
                    params=dict(action),
                    distributions=self.dists,
                    value=reward if ok else None,
                    intermediate_values={0: reward} if pruned else None,
                    state=TrialState.COMPLETE if ok else TrialState.PRUNED,
                )
            )
