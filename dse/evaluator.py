"""The evaluator: one object per study (and per ``dse space``, ``dry-run`` and ``predict`` command) that owns a
point's way from its knob values to the model's word on it, each step done once per point and kept:

- resolve and check (:class:`dse.rules.points.Points`): the trial and the first validity rule it breaks, kept for good;
- predict: the model's :class:`~dse.perfmodel.model.Prediction` under the study's model (:class:`dse.perfmodel.refit.StudyModel`:
  the shipped parameters or the space's ``[backend] calibration``, refit on the study's measured runs). A refit gives
  the model new parameters; the evaluator then drops every prediction it kept (the trials and checks stay);
- screen: the memory screen's verdict on a valid point (``[search] screen``, ``screen_margin``, the out-of-memory
  neighbour rule) and the point's forecast cost (:class:`PointForecast`);
- forecast: what an agent that uses a model is told of an action (:meth:`Evaluator.forecaster`).

Every caller of a study asks the study's evaluator (the cost forecast, the baseline, the agent's forecasts, the
environment's rules, the screen and each launch's predicted figures), so a point is resolved, checked and predicted
once per model however many ask. A resolved :class:`~dse.rules.trial.TrialConfig` may be passed where a point is expected
(a probe's trial, a run read back): it is predicted by the model directly, without being kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dse.agents.base import Action, Forecast, Forecaster
from dse.perfmodel.calibrate import calibrated_miss, calibrated_params
from dse.perfmodel.model import Prediction
from dse.perfmodel.refit import StudyModel
from dse.recipes.models import Recipe
from dse.rules.points import CACHE, Lru, Points, point_key
from dse.rules.space import Space
from dse.rules.trial import TrialConfig

__all__ = ["Evaluator", "PointForecast", "prior_model", "screened_peak", "study_model"]

PointLike = Mapping[str, Any] | TrialConfig  # a point's knob values, or a point already resolved


def prior_model(space: Space) -> StudyModel:
    """The model a study starts from (the space's calibration, else the shipped parameters), learning nothing."""
    return StudyModel(space, calibrated_params(space.backend.calibration), learns=False, cache=0)


def study_model(space: Space, learns: bool) -> StudyModel:
    """The model of a study of ``space``: the space's calibration (else the shipped parameters) with the miss of a
    peak it carries, refit on the study's runs where ``learns`` (the backend's runs are evidence)."""
    calibration = space.backend.calibration
    return StudyModel(space, calibrated_params(calibration), learns=learns, memory_miss=calibrated_miss(calibration))


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


class Evaluator(Points):
    """``space``'s points from knob values to the model's figures and the screen's verdict (see the module
    docstring), under ``model`` (default: a study's, :func:`study_model`, where ``learns`` is given: refit as its
    runs come where it is true; else :func:`prior_model`). The memory screen is on unless the space says
    ``screen = "none"``; off, it screens nothing but still forecasts."""

    def __init__(
        self,
        space: Space,
        model: StudyModel | None = None,
        *,
        learns: bool | None = None,
        recipe: Recipe | None = None,
        cache: int = CACHE,
    ):
        if model is None:
            model = prior_model(space) if learns is None else study_model(space, learns)
        self.model = model
        super().__init__(space, recipe=recipe, cache=cache)
        self.on = space.search.screen != "none"
        self._predictions = Lru(cache)
        self._params = self.model.params  # the parameters the kept predictions were made under

    # -- the model ---------------------------------------------------------------------------------------
    def predict(self, point: PointLike) -> Prediction:
        """The model's prediction of ``point`` under its parameters now: computed once per point and model (a refit
        drops what was kept). The caller checks the rules first (the model cannot predict a broken layout)."""
        if isinstance(point, TrialConfig):
            return self.model.predict(point)
        params = self.model.params
        if params is not self._params:  # the model was refit: every kept prediction is stale
            self._predictions.clear()
            self._params = params
        key = point_key(point)
        got = self._predictions.get_recent(key)
        # each prediction is kept with the parameters it was made under, so that one a pool thread made under the
        # parameters before a refit is never read as the refit model's
        if got is None or got[0] is not params:
            got = (params, self.model.prepared(self._trial(key, point)).predict(params))
            self.computed["predict"] += 1
            self._predictions.put(key, got)
        return got[1]

    def resolved(self, point: PointLike) -> TrialConfig:
        return point if isinstance(point, TrialConfig) else self.trial(point)

    # -- the screen --------------------------------------------------------------------------------------
    @property
    def margin(self) -> float:
        """The margin now: the space's until the study has measured a peak, then from the model's measured error."""
        return self.model.margin

    @property
    def source(self) -> str:
        if self.model.runs and self.model.learns:
            return f"the model refit on {len(self.model.runs)} runs of this study"
        return "the space's calibration" if self.space.backend.calibration else "the shipped model"

    def point(self, point: PointLike) -> PointForecast:
        """The model's forecast of one valid point."""
        trial = self.resolved(point)
        p = self.predict(point)
        steps = int(trial.values["max_steps"])
        hours = trial.num_gpus * (p.step_time_s * steps + self.space.system.startup_s) / 3600.0
        screened = self.on and screened_peak(p.peak_memory_gib, p.gpu_memory_gib, self.model.margin)
        return PointForecast(p.peak_memory_gib, p.gpu_memory_gib, p.step_time_s, hours, screened)

    def buffers_gib(self, point: PointLike) -> float:
        """What a probe of the point cannot see and a real run holds beside its tensors (GiB, predicted): the
        model's reserve for the CUDA context and NCCL's communicators and buffers, and NCCL user-buffer
        registration where the point turns it on, and what the payload's runs hold outside PyTorch's allocator beyond
        the reserve (dse.perfmodel.memory.MemoryCounts.outside_gib)."""
        return self.model.prepared(self.resolved(point)).memory.outside_gib(self.model.params)

    def reason(self, point: PointLike) -> str | None:
        """Why the screen keeps a valid point from launching (its predicted peak and the GPU's memory), or None."""
        if not self.on:
            return None
        model = self.model_reason(point)  # the model's word first (kept per point); the neighbour rule overrides it
        return self.model.oom_neighbour(self.resolved(point)) or model

    def model_reason(self, point: PointLike) -> str | None:
        """The model's part of :meth:`reason`: the predicted peak beyond the GPU's memory and the margin."""
        f = self.point(point)
        if not f.screened:
            return None
        return (
            f"predicted peak memory {f.peak_memory_gib:.1f} GiB > {f.memory_gib:.0f} GiB GPU memory "
            f"+ {100 * self.margin:.0f}% margin ({self.source})"
        )

    # -- what an agent is told -----------------------------------------------------------------------------
    def forecast(self, point: Mapping[str, Any]) -> Forecast | None:
        """The model's forecast of ``point`` for the space's objective (None for a point the rules reject)."""
        if self.check(point) is not None:
            return None
        p = self.predict(point)
        value = float(getattr(p, self.space.objective.metric))
        return Forecast(
            reward=value if self.space.objective.sense == "maximize" else -value,
            peak_memory_gib=p.peak_memory_gib,
            memory_gib=p.gpu_memory_gib,
        )

    def forecaster(self) -> Forecaster:
        """``action -> Forecast`` (:meth:`forecast` of the action's point): each call asks the model as it is then."""
        names, knobs = self.space.knob_names, self.space.knobs

        def forecast(action: Action) -> Forecast | None:
            return self.forecast({n: knobs[n][int(action[n])] for n in names})

        return forecast
