"""How many of a space's points are valid: counted exactly by walking the space up to
:data:`dse.space.WALK_LIMIT` raw points, estimated by seeded uniform sampling above.

A space of a dozen knobs of a dozen values has 10^12 raw points, and one with seven knobs of 1,024 values
more than 2^63: they are counted with Python integers, and sampled one index per knob, so nothing ever
enumerates (or allocates) the whole space.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dse import constraints
from dse.space import WALK_LIMIT, Space
from dse.trial import resolve

SAMPLES = 20_000  # seeded draws for an estimate: about 1 s; the 95% interval is +-0.7% of the space at most
CONFIDENCE = 0.95  # of the interval around an estimate


@dataclass(frozen=True)
class Count:
    """Raw and valid points of a space. ``exact``: every raw point was checked; otherwise ``valid`` is the
    estimate from ``samples`` uniform draws, within ``[valid_low, valid_high]`` at 95%, and ``by_rule`` counts
    the draws each rule rejected."""

    raw: int
    valid: int
    exact: bool
    by_rule: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    valid_low: int = 0
    valid_high: int = 0


def rejection_rule(space: Space, point: dict) -> str | None:
    rej = constraints.check(resolve(space, point))
    return None if rej is None else rej.rule


def wilson(hits: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a binomial fraction (SciPy's; imported here, since only an estimate needs it and
    scipy.stats takes a while to import)."""
    from scipy.stats import binomtest

    ci = binomtest(hits, n).proportion_ci(confidence_level=confidence, method="wilson")
    return max(0.0, float(ci.low)), min(1.0, float(ci.high))


def sample_indices(sizes: list[int], rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` uniform raw points as rows of one index per knob: uniform over the product without its size ever
    being formed (so beyond 2^63 too)."""
    return rng.integers(0, np.asarray(sizes, dtype=np.int64), size=(n, len(sizes)))


def count_valid(
    space: Space, *, samples: int = SAMPLES, seed: int = 0, on_progress: Callable[[int, int], None] | None = None
) -> Count:
    """Exact up to ``WALK_LIMIT`` raw points (``on_progress(done, raw)`` every 1,000), estimated above."""
    raw = space.size
    by_rule: Counter[str] = Counter()
    if raw <= WALK_LIMIT:
        valid = 0
        for i, point in enumerate(space.points(), 1):
            rule = rejection_rule(space, point)
            if rule is None:
                valid += 1
            else:
                by_rule[rule] += 1
            if on_progress and i % 1000 == 0:
                on_progress(i, raw)
        return Count(raw, valid, True, dict(by_rule.most_common()), 0, valid, valid)
    sizes = [len(v) for v in space.knobs.values()]
    rng = np.random.default_rng(seed)
    hits = 0
    for row in sample_indices(sizes, rng, samples):
        rule = rejection_rule(space, space.point_at(tuple(int(i) for i in row)))
        if rule is None:
            hits += 1
        else:
            by_rule[rule] += 1
    lo, hi = wilson(hits, samples)
    return Count(
        raw,
        (raw * hits + samples // 2) // samples,
        False,
        dict(by_rule.most_common()),
        samples,
        math.floor(raw * lo),
        math.ceil(raw * hi),
    )
