"""The ``twin`` truth of the simulated backend: a seeded machine that is wrong the way a model is wrong.

A search must be judged against a truth that is not the model it uses, or a model-guided search looks
perfect and tells us nothing. A twin is the same physics as :func:`dse.perfmodel.predict` with, drawn once
per twin seed:

1. every fitted parameter (:data:`dse.perfmodel.timing.FITTED`) drawn around its shipped value in its
   prior's space (:data:`dse.perfmodel.fit.PRIORS`: log for rates, logit for fractions), with a standard
   deviation of ``PARAM_SPREAD`` times the prior's width; the memory reserve drawn around its shipped
   3 GiB (normal, sd ``RESERVE_SD_GIB``, kept in 1..8 GiB) and the allocator fragmentation in logit space
   (sd ``FRAGMENTATION_SD``), so the OOM border moves by a few GiB;
2. a layout-dependent error on the step time: a standard normal effect per (knob, value) for every knob
   the space varies, and one per pair of values for the pairs that interact (``INTERACTING``: tp x pp,
   pp x vp, cp x seq_length, mbs x recompute) at ``PAIR_WEIGHT`` of a single effect; the sum is multiplied
   by a scale chosen (bisection) so that the twin's step time differs from the shipped model's by
   ``TARGET_MAPE`` (9%) mean absolute percentage error over the space's valid points, noise included
   (the error the model shows on held-out published rows: 7.4-12%);
3. a per-point log-normal noise of ``NOISE_SIGMA`` (3%), seeded by the twin seed and the point.

Every draw is a pure function of (twin seed, knob, value): the same seed gives the same twin in every
process. Only the simulated backend reads a twin; an agent never does (``dse space --twin-seed`` prints
its MAPE against the model for the user).
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from dse.perfmodel.fit import PRIORS
from dse.perfmodel.model import Prediction, predict
from dse.perfmodel.timing import DEFAULT_PARAMS, FITTED, Params
from dse.rules.space import WALK_LIMIT

PARAM_SPREAD = 0.3
RESERVE_SD_GIB = 1.5
FRAGMENTATION_SD = 0.5
NOISE_SIGMA = 0.03
TARGET_MAPE = 0.09
PAIR_WEIGHT = 0.7
INTERACTING = (("tp", "pp"), ("pp", "vp"), ("cp", "seq_length"), ("mbs", "recompute"))
_NORMAL = statistics.NormalDist()


@lru_cache(maxsize=65536)
def unit_normal(*key: object) -> float:
    """A standard normal value that is a pure function of ``key`` (crc32 of its repr, through the inverse CDF)."""
    h = zlib.crc32(repr(key).encode())
    return _NORMAL.inv_cdf((h + 0.5) / 2**32)


def draw_params(seed: int, base: Params = DEFAULT_PARAMS) -> Params:
    """The twin's physical parameters: fitted ones drawn in prior space, memory reserve and fragmentation."""
    rng = np.random.default_rng([seed, 0x7717])
    values = {}
    for name in FITTED:
        prior = PRIORS[name]
        z = prior.to_z(getattr(base, name)) + rng.normal() * PARAM_SPREAD * prior.width
        values[name] = prior.from_z(z)
    values["memory_reserve_gib"] = float(np.clip(base.memory_reserve_gib + rng.normal() * RESERVE_SD_GIB, 1.0, 8.0))
    frag = base.memory_fragmentation
    z = math.log(frag / (1 - frag)) + rng.normal() * FRAGMENTATION_SD
    values["memory_fragmentation"] = 1.0 / (1.0 + math.exp(-z))
    return base.with_values(**values)


def _layout_knobs(trial) -> tuple[str, ...]:
    return tuple(n for n in trial.varied if n in trial.values)


@dataclass(frozen=True)
class Twin:
    """One drawn twin. ``scale`` multiplies the layout effects (log step time); see the module docstring."""

    seed: int
    params: Params
    scale: float = 0.0
    noise_sigma: float = NOISE_SIGMA

    def layout_effect(self, trial) -> float:
        """Sum of the unscaled layout effects of ``trial`` (log step time)."""
        varied = _layout_knobs(trial)
        v = trial.values
        total = sum(unit_normal(self.seed, "knob", k, repr(v[k])) for k in varied)
        for a, b in INTERACTING:
            if (a in varied or b in varied) and a in v and b in v:
                total += PAIR_WEIGHT * unit_normal(self.seed, "pair", a, repr(v[a]), b, repr(v[b]))
        return total

    def noise(self, trial) -> float:
        """The per-point log-normal noise (log step time), seeded by the twin seed and the point."""
        return self.noise_sigma * unit_normal(self.seed, "noise", repr(sorted(trial.as_dict().items())))

    def predict(self, trial, *, flops_convention: str = "causal") -> Prediction:
        """What the twin machine measures for ``trial``: the model at the twin's parameters, times its errors."""
        p = predict(trial, flops_convention=flops_convention, params=self.params)
        return self._apply(p, self.scale * self.layout_effect(trial) + self.noise(trial))

    @staticmethod
    def _apply(p: Prediction, log_factor: float) -> Prediction:
        f = math.exp(log_factor)
        return replace(
            p,
            step_time_s=p.step_time_s * f,
            tokens_per_s_per_gpu=p.tokens_per_s_per_gpu / f,
            tflops_per_gpu=p.tflops_per_gpu / f,
        )


CALIBRATION_DRAWS = 5_000  # raw points drawn to calibrate the twin of a space too large to walk (a second or two)


def valid_trials(space) -> list:
    """Every point of ``space`` that passes the validity rules, resolved."""
    from dse.rules import constraints
    from dse.rules.trial import resolve

    out = []
    for point in space.points():
        t = resolve(space, point)
        if constraints.check(t) is None:
            out.append(t)
    return out


def sampled_valid_trials(space, seed: int, draws: int = CALIBRATION_DRAWS) -> list:
    """The valid ones among ``draws`` seeded uniform raw points of ``space`` (one index per knob, so a space of
    10^12 points and more is never enumerated): what the twin of such a space is calibrated on."""
    from dse.rules import constraints
    from dse.rules.trial import resolve

    sizes = np.asarray([len(v) for v in space.knobs.values()], dtype=np.int64)
    rows = np.random.default_rng(seed).integers(0, sizes, size=(draws, len(sizes)))
    out = []
    for key in sorted({tuple(int(i) for i in r) for r in rows}):
        t = resolve(space, space.point_at(key))
        if constraints.check(t) is None:
            out.append(t)
    return out


def _mape(model: np.ndarray, base: np.ndarray, layout: np.ndarray, noise: np.ndarray, scale: float) -> float:
    return float(np.mean(np.abs(base * np.exp(scale * layout + noise) / model - 1.0)))


def make_twin(space, seed: int, *, trials: Sequence | None = None, target_mape: float = TARGET_MAPE) -> Twin:
    """The twin of ``space`` for ``seed``: parameters drawn, layout scale calibrated to ``target_mape``."""
    twin = Twin(seed=seed, params=draw_params(seed))
    if trials is None:
        trials = valid_trials(space) if space.size <= WALK_LIMIT else sampled_valid_trials(space, seed)
    if not trials:
        return twin
    model = np.array([predict(t).step_time_s for t in trials])
    base = np.array([predict(t, params=twin.params).step_time_s for t in trials])
    layout = np.array([twin.layout_effect(t) for t in trials])
    noise = np.array([twin.noise(t) for t in trials])
    lo, hi = 0.0, 1.0
    if _mape(model, base, layout, noise, lo) >= target_mape or not np.any(layout):
        return twin  # the parameter draw alone is already that far from the model
    for _ in range(40):  # bisection: the MAPE grows with the scale over this range
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _mape(model, base, layout, noise, mid) < target_mape else (lo, mid)
    return replace(twin, scale=0.5 * (lo + hi))


def mape(twin: Twin, trials: Iterable) -> float:
    """Mean absolute percentage error of the twin's step time against the shipped model's, as a fraction."""
    errs = [abs(twin.predict(t).step_time_s / predict(t).step_time_s - 1.0) for t in trials]
    return float(np.mean(errs)) if errs else float("nan")
