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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dse.agents.base import Forecaster
from dse.evaluator import Evaluator, PointForecast, prior_model, screened_peak
from dse.perfmodel.refit import StudyModel
from dse.rules.space import DEFAULT_SCREEN_MARGIN, WALK_LIMIT, Space

__all__ = [
    "DEFAULT_SCREEN_MARGIN",
    "PointForecast",
    "Screen",
    "StudyCost",
    "model_forecaster",
    "prior_model",
    "screened_peak",
    "study_cost",
]
COST_SAMPLES = 2_000  # seeded draws for the cost of a space too large to walk

# The memory screen of a space is its evaluator's: ``Screen(space, model)`` (``reason``, ``point``, ``margin``) for
# code that holds no study's evaluator.
Screen = Evaluator


def model_forecaster(space: Space | Evaluator, model: StudyModel | None = None) -> Forecaster:
    """``action -> Forecast`` (None for a point the constraints reject) for ``space``'s objective, under ``model``
    (the study's, refit as its runs come: each call asks its current parameters) or the prior's; given an
    evaluator, its forecaster (its model, its kept points)."""
    evaluator = space if isinstance(space, Evaluator) else Evaluator(space, model)
    return evaluator.forecaster()


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


def _valid_points(evaluator: Evaluator, seed: int = 0) -> tuple[Iterator[Mapping[str, Any]], bool, float]:
    """The valid points: all of them up to the walk limit; else seeded uniform draws, with the factor that scales
    a draw count to the space (valid points are estimated, not enumerated)."""
    space = evaluator.space
    if space.size <= WALK_LIMIT:
        return (p for p in space.points() if evaluator.valid(p)), True, 1.0
    sizes = np.asarray([len(v) for v in space.knobs.values()], dtype=np.int64)
    rows = np.random.default_rng(seed).integers(0, sizes, size=(COST_SAMPLES, len(sizes)))
    points = (space.point_at(tuple(int(i) for i in r)) for r in rows)
    return (p for p in points if evaluator.valid(p)), False, space.size / COST_SAMPLES


def study_cost(space: Space | Evaluator, budget: int | None) -> StudyCost:
    """The forecast cost of a study of ``space`` (or of an evaluator's space, with its model and kept points):
    without a budget (a grid) every valid point the screen keeps runs once; with one, ``budget`` runs (at most the
    points kept) at the median predicted cost of a run."""
    evaluator = space if isinstance(space, Evaluator) else Evaluator(space)
    points, exact, scale = _valid_points(evaluator)
    costs: list[float] = []
    n = screened = 0
    for p in points:
        f = evaluator.point(p)
        n += 1
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
    return StudyCost(round(n * scale), round(screened * scale), runs, hours, median, exact, budget)
