"""The reward an agent sees: the objective's metric, signed so that higher is better.

A run that is not ``ok``, or has no value for the metric, gets the space's failure reward; its partial
metrics are never used. A metric is never invented.

A ``pruned`` run (decision) gets the reward of its optimistic bound (``RunMetrics.prune_bound``: the metric at
the 95 % bound on its median step time that is best for it), not the failure reward and not its estimate:
it ran without failing, so an agent should not learn its layout as broken (as from an OOM); it lost by more
than the margin, and the bound is the most it could have scored, so every agent ranks it below the best by
at least the margin. The agents' ``ok`` flag is False for it, so Optuna is told PRUNED, never COMPLETE.
"""

from __future__ import annotations

import math

from dse.logs.parse import RunMetrics
from dse.rules.space import Objective


def reward(metrics: RunMetrics, objective: Objective) -> float:
    value = getattr(metrics, objective.metric)
    if metrics.status == "pruned":
        value = metrics.prune_bound
        if value is None or not math.isfinite(value):
            return objective.failed_reward
        return float(value) if objective.sense == "maximize" else -float(value)
    if not metrics.ok or value is None or not math.isfinite(value):
        return objective.failed_reward
    return float(value) if objective.sense == "maximize" else -float(value)
