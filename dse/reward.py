"""The reward an agent sees: the objective's metric, signed so that higher is better.

A run that is not ``ok``, or has no value for the metric, gets the space's failure reward; its partial
metrics are never used. A metric is never invented.
"""

from __future__ import annotations

import math

from dse.parse import RunMetrics
from dse.space import Objective


def reward(metrics: RunMetrics, objective: Objective) -> float:
    value = getattr(metrics, objective.metric)
    if not metrics.ok or value is None or not math.isfinite(value):
        return objective.failed_reward
    return float(value) if objective.sense == "maximize" else -float(value)
