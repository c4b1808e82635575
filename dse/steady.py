"""Steady-state early stop: end a trial as soon as its answer, the steady-state step time, is known.

The rule (:func:`converged`), on the step times a log has printed so far:

1. the warm-up is the parser's (:func:`dse.parse.steady_split`: the first max(2, 10 %) logged steps), so the
   estimate at the stop is exactly what :func:`dse.parse.parse_log` reports for the log cut there;
2. at least ``min_steps`` steady steps;
3. the median of the steady steps moved less than ``tolerance`` (relative) over the last ``window`` steps:
   for each of the ``window`` shorter prefixes, ``|median(prefix) / median(now) - 1| < tolerance``.

The defaults (:class:`dse.space.EarlyStopSettings`) were chosen on the recorded real H200 logs in the
repository (``bench/early_stop.py`` prints, for each log, the steps the rule needed and the error of its
estimate against the full-run median); the README has the figures.

:class:`Monitor` is the stop condition a backend is handed (it knows no parser): the backend calls it with
the path of the log it is writing, every ``poll_s`` seconds (or after each step, for the simulated backend),
and stops the job the way a user would when it answers True. The monitor reads the growing log with
:class:`dse.parse.LogFollower` (the same scanner, only the appended bytes each call).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dse.parse import LogFollower, ParseContext, RunMetrics, steady_split


@dataclass(frozen=True)
class Rule:
    """The convergence rule's parameters (validated where they are read: ``[backend.early_stop]``)."""

    min_steps: int = 5
    window: int = 5
    tolerance: float = 0.01


def estimate(times: Sequence[float | None]) -> float | None:
    """The steady-state step time of ``times`` as the parser computes it (median after warm-up)."""
    _, steady = steady_split(list(times))
    return statistics.median(steady) if steady else None


def converged(times: Sequence[float | None], rule: Rule) -> bool:
    """Whether the steady-state estimate of ``times`` (logged step times, warm-up included) has converged.

    Cost: ``window + 1`` medians of at most ``len(times)`` values, a few microseconds for a log of a
    hundred steps; the monitor calls it once per poll, not once per line."""
    n = len(times)
    _, steady = steady_split(list(times))
    if len(steady) < rule.min_steps or n <= rule.window:
        return False
    now = statistics.median(steady)
    if now <= 0:
        return False
    for k in range(n - rule.window, n):
        m = estimate(times[:k])
        if m is None or abs(m / now - 1.0) >= rule.tolerance:
            return False
    return True


def steps_needed(times: Sequence[float | None], rule: Rule) -> int | None:
    """The number of logged steps after which the rule first holds (None: not within ``times``)."""
    for n in range(1, len(times) + 1):
        if converged(times[:n], rule):
            return n
    return None


class Monitor:
    """The stop condition of one trial: called by the backend with the growing log's path; True = stop now.

    After a True answer :attr:`decided` is set and :meth:`metrics` gives the trial's result as of that
    point: whatever the job prints while it is being stopped (a signal's traceback, a scheduler's
    cancellation notice) is not read, since the answer was known before it.
    """

    def __init__(self, rule: Rule, *, poll_s: float = 5.0, want_ts: bool = False):
        self.rule, self.poll_s, self.want_ts = rule, poll_s, want_ts
        self.follower: LogFollower | None = None
        self.decided = False

    def __call__(self, log_path: Path) -> bool:
        if self.decided:
            return True
        if self.follower is None or self.follower.path != str(log_path):
            self.follower = LogFollower(log_path, want_ts=self.want_ts)
        if not self.follower.poll():
            return False
        if self.follower.scan.evidence:  # a failure already in the log (OOM, NCCL...): let the run end as it will
            return False
        self.decided = converged(self.follower.step_times(), self.rule)
        return self.decided

    def metrics(self, context: ParseContext) -> RunMetrics:
        """The trial's metrics at the stop (a clean end of the log read so far)."""
        assert self.follower is not None and self.decided, "metrics() before a stop was decided"
        return self.follower.metrics(context=context)
