"""The performance model's forecast of each point of a space, for agents that use a model.

The shipped model (``dse.perfmodel.predict``), or the model calibrated to the user's stack when the space
names a ``[backend] calibration`` (``dse calibrate``), so the guided agent starts from what the user's own runs
taught; never a backend's truth: on the simulated backend's ``twin`` truth the agent is judged against a
machine that differs from what it is told.
"""

from __future__ import annotations

from dse import constraints
from dse.agents.base import Action, Forecast, Forecaster
from dse.calibrate import calibrated_params
from dse.perfmodel import predict
from dse.space import Space
from dse.trial import resolve


def model_forecaster(space: Space) -> Forecaster:
    """``action -> Forecast`` (None for a point the constraints reject) for ``space``'s objective."""
    names = space.knob_names
    metric, sense = space.objective.metric, space.objective.sense
    convention = space.backend.flops_convention
    params = calibrated_params(space.backend.calibration)

    def forecast(action: Action) -> Forecast | None:
        trial = resolve(space, {n: space.knobs[n][int(action[n])] for n in names})
        if constraints.check(trial) is not None:
            return None
        p = predict(trial, flops_convention=convention, params=params)
        value = float(getattr(p, metric))
        return Forecast(
            reward=value if sense == "maximize" else -value,
            peak_memory_gib=p.peak_memory_gib,
            memory_gib=p.gpu_memory_gib,
        )

    return forecast
