"""Steady-state early stop: end a trial as soon as its answer, the steady-state step time, is known.

The rule (:func:`converged`), on the step times a log has printed so far:

1. the warm-up is the parser's (:func:`dse.logs.parse.steady_split`: the first max(2, 10 %) logged steps), so the
   estimate at the stop is exactly what :func:`dse.logs.parse.parse_log` reports for the log cut there;
2. at least ``min_steps`` steady steps;
3. the median of the steady steps moved less than ``tolerance`` (relative) over the last ``window`` steps:
   for each of the ``window`` shorter prefixes, ``|median(prefix) / median(now) - 1| < tolerance``.

The defaults (:class:`dse.rules.space.EarlyStopSettings`) were chosen on the recorded real H200 logs in the
repository (``bench/early_stop.py`` prints, for each log, the steps the rule needed and the error of its
estimate against the full-run median); docs/early-stop.md has the figures.

:class:`Monitor` is the stop condition a backend is handed (it knows no parser): the backend calls it with
the path of the log it is writing, every ``poll_s`` seconds (or after each step, for the simulated backend),
and stops the job the way a user would when it answers True. The monitor reads the growing log with
:class:`dse.logs.parse.LogFollower` (the same scanner, only the appended bytes each call).

Pruning (:class:`Prune`, ``[backend.early_stop] prune_margin``): a trial that has not converged yet is stopped
as a loser when even its optimistic figure is worse than the best the study has measured by more than the
margin. The optimistic figure comes from a one-sided, distribution-free confidence bound on the median of
the steady steps (:func:`median_lower_bound`: an order statistic, 95 %), so a noisy trial is not pruned on
one lucky or unlucky step. Why an order statistic and not a bootstrap: it needs no random draws (the
decision is reproducible), no scipy, and it is exact for any distribution of step times, given
exchangeable steps; it needs at least 5 steady steps at 95 %. A trial that has converged is recorded as
measured (``ok``), pruned or not: its answer is known, and it costs the same.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from dse.logs.parse import LogFollower, ParseContext, RunMetrics, steady_split


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


#: Confidence of the pruning bound (one-sided): the bound is below the true median 95 % of the time.
CONFIDENCE = 0.95


def median_lower_bound(values: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """A one-sided lower confidence bound on the median of the distribution ``values`` were drawn from.

    The k-th smallest value, k the largest with P(Binomial(n, 1/2) >= k) >= ``confidence`` (the median lies
    above the k-th order statistic exactly when at least k of the n values do): distribution-free, no random
    draws. None when n is too small for any k (n < 5 at 95 %). Exact integer arithmetic; O(n) big-integer
    additions, a millisecond at n = 10,000."""
    n = len(values)
    total = 1 << n
    conf = Fraction(confidence).limit_denominator(10**6)
    need = -(-total * conf.numerator // conf.denominator)  # ceil(2^n * confidence), exact
    k, below, comb = 0, 0, 1  # comb = C(n, k); below = sum of C(n, j) for j <= k = 2^n * P(Bin <= k)
    while k < n:
        below += comb
        if total - below < need:  # 2^n * P(Bin >= k + 1) falls short: k is the largest that holds
            break
        comb = comb * (n - k) // (k + 1)
        k += 1
    return sorted(values)[k - 1] if k else None


def steps_needed(times: Sequence[float | None], rule: Rule) -> int | None:
    """The number of logged steps after which the rule first holds (None: not within ``times``)."""
    for n in range(1, len(times) + 1):
        if converged(times[:n], rule):
            return n
    return None


@dataclass(frozen=True)
class Prune:
    """What pruning needs: the margin (relative), the objective's metric and sense, and ``best``, a callable
    that gives the best value of that metric the study has measured so far (None: nothing yet). A callable,
    not a value, because the best can change while a trial runs (several workers on one study); it is
    called at most once per poll."""

    margin: float
    metric: str  # a RunMetrics field derived from the step time: tflops_per_gpu, tokens_per_s_per_gpu, step_time_s
    maximize: bool
    best: Callable[[], float | None]
    confidence: float = CONFIDENCE

    def optimistic(self, metrics: RunMetrics, steady: Sequence[float]) -> float | None:
        """The trial's metric at the bound on its median step time that is best for the trial (None: too
        few steps). Throughputs are proportional to 1 / step time, so they scale by median / bound."""
        low = median_lower_bound(steady, self.confidence)
        est, value = metrics.step_time_s, getattr(metrics, self.metric)
        if low is None or low <= 0 or est is None or value is None:
            return None
        return low if self.metric == "step_time_s" else value * est / low

    def loses(self, value: float, best: float) -> bool:
        """Whether ``value`` is worse than ``best`` by more than the margin (relative to ``best``)."""
        if self.maximize:
            return value < best * (1.0 - self.margin)
        return value > best * (1.0 + self.margin)


class Monitor:
    """The stop condition of one trial: called by the backend with the growing log's path; True = stop now.

    After a True answer :attr:`decided` is set, :attr:`outcome` says why (``"converged"`` or ``"pruned"``),
    and :meth:`metrics` gives the trial's result as of that point: whatever the job prints while it is
    being stopped (a signal's traceback, a scheduler's cancellation notice) is not read, since the answer
    was known before it. With ``prune`` (and the ``context`` the metrics need), a trial not yet converged is
    stopped once :meth:`Prune.loses` holds for its optimistic figure (:attr:`bound`) against the study's
    best then (:attr:`best`).
    """

    def __init__(
        self,
        rule: Rule,
        *,
        poll_s: float = 5.0,
        want_ts: bool = False,
        prune: Prune | None = None,
        context: ParseContext | None = None,
    ):
        self.rule, self.poll_s, self.want_ts = rule, poll_s, want_ts
        self.prune, self.context = prune, context
        self.follower: LogFollower | None = None
        self.decided = False
        self.outcome: str | None = None
        self.bound: float | None = None
        self.best: float | None = None

    def __call__(self, log_path: Path) -> bool:
        if self.decided:
            return True
        if self.follower is None or self.follower.path != str(log_path):
            self.follower = LogFollower(log_path, want_ts=self.want_ts)
        if not self.follower.poll():
            return False
        if self.follower.scan.evidence:  # a failure already in the log (OOM, NCCL...): let the run end as it will
            return False
        times = self.follower.step_times()
        if converged(times, self.rule):
            self.decided, self.outcome = True, "converged"
        elif self.prune is not None and self._loses(times):
            self.decided, self.outcome = True, "pruned"
        return self.decided

    def _loses(self, times: Sequence[float | None]) -> bool:
        _, steady = steady_split(list(times))
        steady = [t for t in steady if t is not None]
        if len(steady) < self.rule.min_steps:
            return False
        assert self.prune is not None and self.follower is not None  # __call__ checks the one, sets the other
        best = self.prune.best()
        if best is None:
            return False
        bound = self.prune.optimistic(self.follower.metrics(context=self.context or ParseContext()), steady)
        if bound is None or not self.prune.loses(bound, best):
            return False
        self.bound, self.best = bound, best
        return True

    def metrics(self, context: ParseContext) -> RunMetrics:
        """The trial's metrics at the stop (a clean end of the log read so far)."""
        assert self.follower is not None and self.decided, "metrics() before a stop was decided"
        return self.follower.metrics(context=context)
