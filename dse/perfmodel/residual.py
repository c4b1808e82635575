"""The residual model of a search: what the model's forecast misses, learned from the search's own runs.

The guided agent (:mod:`dse.agents.guided`) and the shortlist encoding of the learned policy (:mod:`dse.rl.shortlist`)
both estimate a point as its forecast (log throughput) plus a residual: a Bayesian linear model over one-hot
features of an intercept (the model's overall bias, prior sd ``tau_bias``), each knob value (``tau_knob``) and each
pair of values of two knobs (``tau_pair``), every run an observation with ``sigma`` scatter about it. A point shares
its knob values with many others, so a few runs correct the model's ranking of the whole space, and a run corrects
most the points most like it.

It is computed in its kernel form, not over the features: with independent Gaussian priors on the weights, the
covariance of two points' residuals is ``tau_bias^2 + tau_knob^2 * s + tau_pair^2 * s * (s - 1) / 2``, where ``s`` is
the number of knobs on which they agree (a pair of knobs is shared exactly when both of its knobs are). The
posterior at every point then needs only the runs' Gram matrix (runs x runs) and each point's agreement with each
run (points x runs), never the features (points x values and pairs of values, up to thousands of columns) or
their covariance; the two forms are the same Gaussian posterior (the weight-space and function-space views of
Bayesian linear regression), and this one grows with the number of runs, which a search keeps small.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.linalg import cho_factor, cho_solve

# The priors the guided agent defaults to (its ``[search.options]``) and the shortlist encoding uses: sd of the
# model's overall bias, of each knob value's effect, of each pair of values' effect, and a point's scatter (log
# throughput: 0.06 is a 6% effect)
TAU_BIAS = 0.15
TAU_KNOB = 0.06
TAU_PAIR = 0.04
SIGMA = 0.03


class ResidualModel:
    """The residual model over ``keys`` (points x knobs, each a value index), with its prior sds and scatter."""

    def __init__(self, keys: np.ndarray, tau_bias: float, tau_knob: float, tau_pair: float, sigma: float):
        self.keys = np.asarray(keys, dtype=np.int64)
        if self.keys.ndim != 2:
            self.keys = self.keys.reshape(len(self.keys), -1)
        self.tau = (tau_bias, tau_knob, tau_pair)
        self.sigma = sigma
        self._agree: dict[int, np.ndarray] = {}  # run's point -> every point's number of knobs agreeing with it

    def _kernel(self, s: np.ndarray, scale: float) -> np.ndarray:
        """Prior covariance of two points' residuals that agree on ``s`` knobs (in units of ``scale``)."""
        tb, tk, tp = (t * scale for t in self.tau)
        s = s.astype(float)
        return tb * tb + tk * tk * s + tp * tp * s * (s - 1.0) / 2.0

    def _agreement(self, row: int) -> np.ndarray:
        col = self._agree.get(row)
        if col is None:
            col = (self.keys == self.keys[row]).sum(axis=1).astype(np.int16)
            self._agree[row] = col
        return col

    def posterior(self, rows: Sequence[int], y: Sequence[float], scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """Per point: the posterior mean of the residual, and the standard deviation of the point's value (the
        residual's posterior and the point's own ``sigma`` scatter), given residuals ``y`` observed at ``rows``
        (a row may appear more than once). ``scale`` multiplies every prior sd and the scatter."""
        n, k = self.keys.shape
        prior = float(self._kernel(np.array([k]), scale)[0])
        noise = (self.sigma * scale) ** 2
        if not len(rows):
            return np.zeros(n), np.full(n, np.sqrt(prior + noise))
        S = np.stack([self._agreement(int(r)) for r in rows], axis=1)  # points x runs
        Kx = self._kernel(S, scale)
        Kr = Kx[np.asarray(rows, dtype=np.int64)] + noise * np.eye(len(rows))
        factor = cho_factor(Kr, lower=True)
        mean = Kx @ cho_solve(factor, np.asarray(y, dtype=float))
        var = prior - np.einsum("ij,ji->i", Kx, cho_solve(factor, Kx.T)) + noise
        return mean, np.sqrt(np.maximum(var, 1e-12))
