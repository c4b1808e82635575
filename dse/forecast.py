"""The performance model's forecast of each point of a space: for agents that use a model, for the memory
screen that every agent's study applies before a launch, and for the cost of a study before it starts.

The shipped model (``dse.perfmodel.predict``), or the model calibrated to the user's stack when the space
names a ``[backend] calibration`` (``dse calibrate``), so the guided agent starts from what the user's own runs
taught; never a backend's truth: on the simulated backend's ``twin`` truth the agent is judged against a
machine that differs from what it is told.

The memory screen: a valid point whose predicted peak memory exceeds the GPU's memory by more than
``[search] screen_margin`` is not launched (status ``screened``). The default margin comes from the model's
memory error on every known outcome (``bench/screen_evidence.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dse.agents.base import Action, Forecast, Forecaster
from dse.perfmodel.calibrate import calibrated_params
from dse.perfmodel.refit import StudyModel
from dse.rules import constraints
from dse.rules.space import DEFAULT_SCREEN_MARGIN, WALK_LIMIT, Space
from dse.rules.trial import TrialConfig, resolve

__all__ = ["DEFAULT_SCREEN_MARGIN", "Screen", "StudyCost", "model_forecaster", "screened_peak", "study_cost"]
COST_SAMPLES = 2_000  # seeded draws for the cost of a space too large to walk


def prior_model(space: Space) -> StudyModel:
    """The model a study starts from (the space's calibration, else the shipped parameters), learning nothing."""
    return StudyModel(space, calibrated_params(space.backend.calibration), learns=False, cache=0)


def model_forecaster(space: Space, model: StudyModel | None = None) -> Forecaster:
    """``action -> Forecast`` (None for a point the constraints reject) for ``space``'s objective, under ``model``
    (the study's, refit as its runs come: each call asks its current parameters) or the prior's."""
    names = space.knob_names
    metric, sense = space.objective.metric, space.objective.sense
    model = model or prior_model(space)

    def forecast(action: Action) -> Forecast | None:
        trial = resolve(space, {n: space.knobs[n][int(action[n])] for n in names})
        if constraints.check(trial) is not None:
            return None
        p = model.predict(trial)
        value = float(getattr(p, metric))
        return Forecast(
            reward=value if sense == "maximize" else -value,
            peak_memory_gib=p.peak_memory_gib,
            memory_gib=p.gpu_memory_gib,
        )

    return forecast


def screened_peak(peak_gib: float, capacity_gib: float, margin: float) -> bool:
    """Whether a predicted peak is beyond the screen: above the GPU's memory by more than ``margin`` of it."""
    return peak_gib > capacity_gib * (1.0 + margin)


@dataclass(frozen=True)
class PointForecast:
    """The model's figures for one valid point: its peak memory against the GPU's, the step time, the cost of a
    run (GPUs x (steps x step time + the system's start-up) in GPU-hours) and the screen's verdict."""

    peak_memory_gib: float
    memory_gib: float
    step_time_s: float
    gpu_hours: float
    screened: bool

    @property
    def fits(self) -> bool:
        return self.peak_memory_gib <= self.memory_gib


class Screen:
    """The memory screen of a space (``[search] screen``, ``screen_margin``): ``reason(trial)`` says why a valid
    point is not launched, or None. Off (``screen = "none"``) it screens nothing but still forecasts."""

    def __init__(self, space: Space, model: StudyModel | None = None):
        self.space = space
        self.on = space.search.screen != "none"
        self.model = model or prior_model(space)

    @property
    def margin(self) -> float:
        """The margin now: the space's until the study has measured a peak, then from the model's measured error."""
        return self.model.margin

    @property
    def source(self) -> str:
        if self.model.runs and self.model.learns:
            return f"the model refit on {len(self.model.runs)} runs of this study"
        return "the space's calibration" if self.space.backend.calibration else "the shipped model"

    def point(self, trial: TrialConfig) -> PointForecast:
        """The model's forecast of one valid point."""
        p = self.model.predict(trial)
        steps = int(trial.values["max_steps"])
        hours = trial.num_gpus * (p.step_time_s * steps + self.space.system.startup_s) / 3600.0
        screened = self.on and screened_peak(p.peak_memory_gib, p.gpu_memory_gib, self.margin)
        return PointForecast(p.peak_memory_gib, p.gpu_memory_gib, p.step_time_s, hours, screened)

    def buffers_gib(self, trial: TrialConfig) -> float:
        """What a probe of ``trial`` cannot see and a real run holds beside its tensors (GiB, predicted): the
        model's reserve for the CUDA context and NCCL's communicators and buffers, and NCCL user-buffer
        registration where the point turns it on, and what the payload's runs hold outside PyTorch's allocator beyond
        the reserve (dse.perfmodel.memory.MemoryCounts.outside_gib)."""
        return self.model.prepared(trial).memory.outside_gib(self.model.params)

    def reason(self, trial: TrialConfig) -> str | None:
        """Why the screen keeps ``trial`` from launching (its predicted peak and the GPU's memory), or None."""
        if not self.on:
            return None
        if (why := self.model.oom_neighbour(trial)) is not None:
            return why
        return self.model_reason(trial)

    def model_reason(self, trial: TrialConfig) -> str | None:
        """The model's part of :meth:`reason`: the predicted peak beyond the GPU's memory and the margin."""
        f = self.point(trial)
        if not f.screened:
            return None
        return (
            f"predicted peak memory {f.peak_memory_gib:.1f} GiB > {f.memory_gib:.0f} GiB GPU memory "
            f"+ {100 * self.margin:.0f}% margin ({self.source})"
        )


@dataclass(frozen=True)
class StudyCost:
    """What a study is forecast to cost before it starts. ``points``: the valid points forecast (all of them,
    or ``samples`` seeded draws' worth when ``exact`` is False); ``screened``: how many of them the screen
    removes; ``runs``: the launched runs counted; ``gpu_hours``: their predicted cost; ``median_run``: the
    median predicted cost of one launched run (start-up included)."""

    points: int
    screened: int
    runs: int
    gpu_hours: float
    median_run: float
    exact: bool
    budget: int | None


def _valid_trials(space: Space, seed: int = 0) -> tuple[Iterator[TrialConfig], bool, float]:
    """The valid points' trials: all of them up to the walk limit; else seeded uniform draws, with the factor
    that scales a draw count to the space (valid points are estimated, not enumerated)."""
    if space.size <= WALK_LIMIT:
        trials = (resolve(space, p) for p in space.points())
        return (t for t in trials if constraints.check(t) is None), True, 1.0
    sizes = np.asarray([len(v) for v in space.knobs.values()], dtype=np.int64)
    rows = np.random.default_rng(seed).integers(0, sizes, size=(COST_SAMPLES, len(sizes)))
    trials = (resolve(space, space.point_at(tuple(int(i) for i in r))) for r in rows)
    return (t for t in trials if constraints.check(t) is None), False, space.size / COST_SAMPLES


def study_cost(space: Space, budget: int | None) -> StudyCost:
    """The forecast cost of a study of ``space``: without a budget (a grid) every valid point the screen keeps
    runs once; with one, ``budget`` runs (at most the points kept) at the median predicted cost of a run."""
    screen = Screen(space)
    trials, exact, scale = _valid_trials(space)
    costs: list[float] = []
    points = screened = 0
    for t in trials:
        f = screen.point(t)
        points += 1
        if f.screened:
            screened += 1
        else:
            costs.append(f.gpu_hours)
    median = statistics.median(costs) if costs else 0.0
    kept = round(len(costs) * scale)
    if budget is None:
        runs, hours = kept, sum(costs) * scale
    else:
        runs = min(budget, kept)
        hours = runs * median
    return StudyCost(round(points * scale), round(screened * scale), runs, hours, median, exact, budget)
