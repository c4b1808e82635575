"""Model-guided search: screen every valid point with the performance model, launch by expected improvement,
learn from every real result, stop by itself.

What it keeps (all refitted after every observation, in well under a second on the 405B space):

* **Throughput**: ``u(x) = log(reward)`` (``-log(-reward)`` when minimising: the reward of step time is its
  negative) is modelled as the model's prediction plus a residual, a Bayesian linear model over one-hot
  features of every knob value and every pair of knob values, with Gaussian priors (an intercept for the
  model's overall bias, ``tau_knob`` per value, ``tau_pair`` per pair of values) and ``sigma`` per-point
  scatter. Why not the MAP parameter fit of ``bench/model_accuracy.py --fit``: it needs the model's physics
  inside the agent and a simplex per step, and it cannot learn errors the physics does not have (the
  layout effects a real cluster shows); the residual model learns both from a few runs and refits in
  milliseconds with numpy (:class:`dse.perfmodel.residual.ResidualModel`, in its kernel form: its cost grows with
  the runs, not with the space's knob values and pairs, so a 200,000-point space keeps no feature matrix).
* **Memory border**: measured peak minus predicted peak as ``a + b * predicted`` (Bayesian, priors of a few
  GiB and a few percent), from the peaks of successful runs; an out-of-memory run whose point the current
  fit says fits adds a pseudo-observation just past the GPU's memory. The probability that a point fits is
  the normal probability of its predicted headroom, less the model's measured memory miss: the most a launched
  run's peak came above the forecast it launched with (an out-of-memory run: at least to the GPU's memory). The
  study refits its model after each run, so the refit puts a point that ran out above the GPU's memory and the
  border alone would learn nothing from it; the miss keeps what the OOM says about the model's error, and a point
  predicted to fit by less than it is risky (a low probability of fitting, so ranked last and, when nothing else
  is likely to beat the best, left for the stop rule).
* **Acquisition**: expected improvement of ``u`` over the best measured, times the probability of fitting.
  Stops when no untried point has at least ``stop_prob`` probability (fit x improvement by more than
  ``min_gain``) of beating the best measured, and says so in :attr:`stop_reason`.

Without a forecast (a space with no model, or the agent contract tests) the same machinery runs on the
rewards themselves (standardised), with a flat prior and the action mask for validity.
Rejected points are never proposed (the forecast, or the mask, says which they are). With the study's memory
screen on (``screen_margin``, filled in by the study), the points the screen removes are left out from the start:
the study would record them ``screened`` without a run, and the agent's own probability of fitting would rank
them last anyway; leaving them out makes each proposal's scoring proportionally cheaper.

Several trials in flight (``dse run --parallel N``): a batch is chosen by the *kriging believer*: each point
proposed and not yet observed is fitted as if it had measured its posterior mean at the time it was proposed.
That leaves the mean where it was but shrinks the uncertainty of the point and of its neighbours (points
sharing its knob values), so the next proposal's expected improvement goes elsewhere, to points the
agent is unsure about that the batch does not already cover. A point in flight is never proposed again, and
the stop rule waits: while trials are in flight it only declines to propose (the study asks again after the
next result); it stops for good when nothing is in flight. Why this and not q-EI: it is the same posterior update the agent makes for a real result, in a few
lines, and needs no Monte-Carlo integration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import Field
from scipy.special import ndtr

from dse.agents.base import Action, Agent, Forecaster, NoOptions
from dse.errors import UserError
from dse.perfmodel.residual import SIGMA, TAU_BIAS, TAU_KNOB, TAU_PAIR, ResidualModel

MAX_POINTS = 200_000  # every point is screened and kept (its knob values, forecast and memory)


def _cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF, element-wise (SciPy's ``ndtr``)."""
    return ndtr(np.asarray(z, dtype=float))


def _pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _u(reward: float) -> float:
    """Rewards as log throughput: log(r) when maximising a rate, -log(-r) for a (negated) step time."""
    return math.log(reward) if reward > 0 else -math.log(-reward)


class GuidedOptions(NoOptions):
    """``[search.options]`` of the guided agent (the defaults are the ones measured in the README)."""

    # relative rewards and probabilities: bounded far beyond any useful value, finite
    tau_bias: float = Field(TAU_BIAS, gt=0, le=100, allow_inf_nan=False)
    tau_knob: float = Field(TAU_KNOB, gt=0, le=100, allow_inf_nan=False)
    tau_pair: float = Field(TAU_PAIR, gt=0, le=100, allow_inf_nan=False)
    sigma: float = Field(SIGMA, gt=0, le=100, allow_inf_nan=False)
    min_gain: float = Field(0.005, ge=0, le=100, allow_inf_nan=False)
    stop_prob: float = Field(0.02, gt=0, lt=1, allow_inf_nan=False)
    # the study's memory screen ([search] screen_margin; None: off)
    screen_margin: float | None = Field(None, ge=0, le=10, allow_inf_nan=False)
    # GiB held back from every point's headroom from the start: the miss the model the study starts from has
    # measured (the study fills it in from its calibration file; it grows with this study's own misses)
    memory_miss: float = Field(0.0, ge=0, le=10_000, allow_inf_nan=False)


class GuidedAgent(Agent):
    name = "guided"
    Options = GuidedOptions
    uses_mask = True
    uses_model = True

    def __init__(
        self,
        action_space,
        *,
        forecast: Forecaster | None = None,
        tau_bias: float = TAU_BIAS,
        tau_knob: float = TAU_KNOB,
        tau_pair: float = TAU_PAIR,
        sigma: float = SIGMA,
        min_gain: float = 0.005,
        stop_prob: float = 0.02,
        screen_margin: float | None = None,
        memory_miss: float = 0.0,
        **kw,
    ):
        super().__init__(action_space, **kw)
        total = math.prod(self.sizes)
        if total > MAX_POINTS:
            raise UserError(
                f"the guided agent screens every point; this space has {total:,} (at most {MAX_POINTS:,})",
                field="search.agent",
            )
        self.forecast = forecast
        self.min_gain, self.stop_prob = min_gain, stop_prob
        self._rng = np.random.default_rng(self.seed)
        keys, base, peak, cap = [], [], [], []
        for key in self.all_keys():
            action = self.to_action(key)
            if forecast is not None:
                f = forecast(action)
                if f is None or not (f.reward and math.isfinite(f.reward)):
                    continue
                if screen_margin is not None and f.peak_memory_gib > f.memory_gib * (1.0 + screen_margin):
                    continue  # the study's screen would record it without a run
                keys.append(key)
                base.append(_u(f.reward))
                peak.append(f.peak_memory_gib)
                cap.append(f.memory_gib)
            elif self.valid(action):
                keys.append(key)
        self.keys = keys
        self.index = {k: i for i, k in enumerate(keys)}
        n = len(keys)
        self.base = np.array(base) if forecast is not None else np.zeros(n)
        self.peak = np.array(peak) if forecast is not None else np.zeros(n)
        self.cap = np.array(cap) if forecast is not None else np.full(n, np.inf)
        # without a forecast the effects are of the order of the rewards' own scatter: the priors relative to tau_knob
        tb, tk, tp = (
            (tau_bias, tau_knob, tau_pair) if forecast is not None else (tau_bias / tau_knob, 1.0, tau_pair / tau_knob)
        )
        self.residual = ResidualModel(np.array(keys, dtype=int).reshape(n, len(self.sizes)), tb, tk, tp, sigma)
        self.tried = np.zeros(n, dtype=bool)
        self.obs_rows: list[int] = []
        self.obs_u: list[float] = []
        self.mem_rows: list[int] = []  # successful runs with a measured peak
        self.mem_peak: list[float] = []  # their measured peaks
        self.oom_rows: list[int] = []
        self.memory_miss = memory_miss  # GiB: the largest under-prediction of a peak at launch (_note_miss)
        self.runs = 0
        self._post: tuple[np.ndarray, np.ndarray] | None = None
        self.pending: dict[int, float] = {}  # row in flight -> the u believed for it (its mean when proposed)

    # -- learning --------------------------------------------------------------------------------------
    def _scale(self) -> float:
        """Units of u: log throughput with a forecast; the scatter of the rewards without one."""
        if self.forecast is not None:
            return 1.0
        if len(self.obs_u) >= 2 and np.std(self.obs_u) > 0:
            return float(np.std(self.obs_u))
        return max(abs(self.obs_u[0]), 1.0) if self.obs_u else 1.0

    def _posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of u at every point: the model plus the residual model's posterior
        (:class:`dse.perfmodel.residual.ResidualModel`; without a forecast, of the rewards themselves, in units of
        their scatter)."""
        if self._post is not None:
            return self._post
        rows = self.obs_rows + list(self.pending)  # in flight: believed at their mean (kriging believer)
        y = np.array(self.obs_u + list(self.pending.values()), dtype=float) - self.base[rows]
        mean, sd = self.residual.posterior(rows, y, scale=self._scale())
        self._post = (self.base + mean, sd)
        return self._post

    def _fit_probability(self) -> np.ndarray:
        """Probability that each point fits in memory, from the learned border (1 without a forecast)."""
        if self.forecast is None:
            return np.ones(len(self.keys))
        # delta = measured - predicted peak = a + b * predicted; priors a ~ N(0, 3^2) GiB, b ~ N(0, 0.05^2)
        rows = list(self.mem_rows)
        deltas = [m - float(self.peak[r]) for r, m in zip(rows, self.mem_peak)]
        prior = np.diag([1 / 3.0**2, 1 / 0.05**2])
        noise2 = 0.5**2
        for _ in range(3):  # OOMs the current fit calls fitting become pseudo-observations past the border
            X = np.column_stack([np.ones(len(rows)), self.peak[rows]]) if rows else np.zeros((0, 2))
            A = X.T @ X / noise2 + prior
            cov = np.linalg.inv(A)
            w = cov @ (X.T @ np.array(deltas)) / noise2 if rows else np.zeros(2)
            added = False
            for r in self.oom_rows:  # past the border the miss leaves (one OOM counted once, not twice)
                need = self.cap[r] - self.memory_miss - self.peak[r] + 0.5
                if w[0] + w[1] * self.peak[r] < need and r not in rows:
                    rows.append(r)
                    deltas.append(need)
                    added = True
            if not added:
                break
        P = np.column_stack([np.ones(len(self.keys)), self.peak])
        mu = P @ w
        sd = np.sqrt(np.einsum("ij,jk,ik->i", P, cov, P) + noise2)
        return _cdf((self.cap - self.memory_miss - self.peak - mu) / sd)

    def _note_miss(self, ok: bool, status: str | None, metrics: Mapping[str, Any]) -> None:
        """The model's measured memory error on this study: how far a launched run's peak came above what the model
        predicted for it at launch (the study keeps that forecast beside the measured figures:
        ``predicted_peak_memory_gib`` against ``predicted_memory_gib`` of GPU memory); an out-of-memory run came
        at least to the GPU's memory. The largest such miss so far is held back from every point's headroom
        (:meth:`_fit_probability`): a point predicted to fit by less than the model has already been wrong by is
        risky, and is ranked (and counted by the stop rule) at its low probability of fitting. Over-predictions
        launch nothing that runs out of memory and are not counted."""
        predicted, capacity = metrics.get("predicted_peak_memory_gib"), metrics.get("predicted_memory_gib")
        if predicted is None:
            return  # not launched by this study's model (a point with no forecast)
        if status == "oom" and capacity is not None:
            miss = float(capacity) - float(predicted)
        elif ok and metrics.get("peak_memory_gib") is not None:
            miss = float(metrics["peak_memory_gib"]) - float(predicted)
        else:
            return
        if math.isfinite(miss):
            self.memory_miss = max(self.memory_miss, miss)

    def reforecast(self) -> None:
        """The study's model was refit (dse.perfmodel.refit): every kept point's forecast asked again, so the ranking, the
        memory border and the stop rule read the refit model (the residual model then learns what it still
        misses)."""
        if self.forecast is None:
            return
        for i, key in enumerate(self.keys):
            f = self.forecast(self.to_action(key))
            if f is not None and f.reward and math.isfinite(f.reward):
                self.base[i], self.peak[i] = _u(f.reward), f.peak_memory_gib
        self._post = None

    def abandon(self, action: Action) -> None:
        """No longer in flight (so no longer believed at its mean, and no longer holding back the stop rule, which
        waits for results in flight) and not proposed again; nothing is learnt from it."""
        i = self.index.get(self.key(action))
        if i is not None and self.pending.pop(i, None) is not None:
            self.tried[i] = True
            self._post = None

    def observe(
        self,
        action: Action,
        reward: float,
        ok: bool,
        *,
        status: str | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> None:
        super().observe(action, reward, ok, status=status, metrics=metrics)
        i = self.index.get(self.key(action))
        if status not in ("rejected", "screened"):  # points never launched are no runs
            self.runs += 1
            if self.forecast is not None:
                self._note_miss(ok, status, metrics or {})
        if i is None:
            return
        self.tried[i] = True
        self.pending.pop(i, None)
        self._post = None
        if ok and math.isfinite(reward) and (reward != 0 or self.forecast is None):
            self.obs_rows.append(i)
            self.obs_u.append(_u(reward) if self.forecast is not None else float(reward))
            peak = (metrics or {}).get("peak_memory_gib")
            if peak is not None and self.forecast is not None:
                self.mem_rows.append(i)
                self.mem_peak.append(float(peak))
        elif status == "oom" and self.forecast is not None:
            self.oom_rows.append(i)

    # -- choosing --------------------------------------------------------------------------------------
    def scores(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per point: posterior mean and sd of u, probability of fitting, and fit x expected improvement."""
        mean, sd = self._posterior()
        fit = self._fit_probability()
        if self.obs_u:
            best = max(self.obs_u)
        else:  # nothing measured yet: improvement over the worst candidate, so the model's order leads
            best = float(np.min(mean)) if len(mean) else 0.0
        z = (mean - best) / sd
        ei = fit * sd * (z * _cdf(z) + _pdf(z))
        return mean, sd, fit, ei

    def propose(self) -> Action | None:
        in_flight = np.zeros(len(self.keys), dtype=bool)
        in_flight[list(self.pending)] = True
        untried = ~self.tried & ~in_flight
        if not untried.any():
            if not self.pending:
                self.stop_reason = f"stopped: every valid point tried, after {self.runs} runs"
            return None
        mean, sd, fit, ei = self.scores()
        if self.obs_u:
            best = max(self.obs_u)
            gain = math.log1p(self.min_gain) * (self._scale() if self.forecast is None else 1.0)
            p_beat = fit * (1.0 - _cdf((best + gain - mean) / sd))
            if p_beat[untried].max() < self.stop_prob:
                if self.pending:  # not yet: a result in flight may change the picture (the study asks again)
                    return None
                likely = untried & (fit >= 0.5)
                if self.forecast is not None and likely.any():
                    gap = 100.0 * (1.0 - math.exp(float(mean[likely].max()) - best))
                else:
                    gap = float("nan")
                self.stop_reason = (
                    (f"stopped: no untried point predicted within {gap:.1f}% of the best, after {self.runs} runs")
                    if math.isfinite(gap)
                    else (f"stopped: no untried point likely to beat the best, after {self.runs} runs")
                )
                return None
        score = np.where(untried, ei, -np.inf) + self._rng.random(len(ei)) * 1e-12
        i = int(np.argmax(score))
        self.pending[i] = float(mean[i])
        self._post = None
        return self.to_action(self.keys[i])
