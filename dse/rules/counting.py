"""How many of a space's points are valid: counted exactly by walking the space up to
:data:`dse.rules.space.WALK_LIMIT` raw points, estimated by seeded uniform sampling above.

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

from dse.errors import UserError
from dse.facts import knobs
from dse.rules import constraints
from dse.rules.points import Points
from dse.rules.space import WALK_LIMIT, Space
from dse.rules.trial import TrialConfig

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
    # per rule, the first point it rejected: its reason and the knobs of that reason the space does not vary
    # (:func:`fixed_knobs`), so that a report can say which setting or recipe default did it
    examples: dict[str, Example] = field(default_factory=dict)

    def rules_line(self, top: int = 3) -> str:
        """The first ``top`` rules by the points they removed, e.g. ``fsdp_no_pp 1,440, uneven_stages 96``."""
        shown = [f"{rule} {n:,}" for rule, n in list(self.by_rule.items())[:top]]
        more = len(self.by_rule) - top
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    def empty_reason(self) -> str:
        """Why no point is valid, in one line: the rules that removed them, and the knobs the space does not vary
        that took part (its settings, the recipe's layout), each with its rule's reason; without such knobs, the
        first rule's reason."""
        what = "each of the" if self.exact else f"each of {self.samples:,} seeded draws of the"
        head = f"no valid point: {what} {self.raw:,} raw points breaks a rule ({self.rules_line()})"
        fixed = [(rule, ex) for rule, ex in self.examples.items() if ex.fixed and rule in self.by_rule]
        if not fixed:
            first = next(iter(self.by_rule), None)
            return f"{head}; {first}: {self.examples[first].reason}" if first in self.examples else head
        parts = [f"{', '.join(ex.fixed.values())} in {rule} ({ex.reason})" for rule, ex in fixed]
        return (
            f"{head}; knobs the space does not vary take part: {'; '.join(parts)}; "
            "vary them in [knobs] or set them in [settings]"
        )


@dataclass(frozen=True)
class Example:
    """The first point a rule rejected: the rule's reason, and ``fixed``: each knob of the reason the space does not
    vary, as ``name=value (where the value comes from)``."""

    reason: str
    fixed: dict[str, str]


def fixed_knobs(space: Space, trial: TrialConfig, rejection: constraints.Rejection) -> dict[str, str]:
    """The knobs of ``rejection`` that ``space`` does not vary, each ``name=value (origin)``: set by the space's
    ``[settings]``, by the recipe's layout for the GPU and precision (NVIDIA's preset where dse ships one), or the
    catalogue's default. A point cannot move them, so when every point breaks a rule, these are what to change."""
    out: dict[str, str] = {}
    for name in rejection.knobs:
        if name in space.knobs or name not in trial.values:
            continue
        if name in space.settings:
            origin = "the space's [settings]"
        elif name in knobs.CATALOGUE and knobs.CATALOGUE[name].recipe_layout:
            origin = trial.recipe.layout_source(trial.system.gpu, str(trial.values["precision"]), trial.num_gpus)
        else:
            origin = "dse's default"
        out[name] = f"{name}={trial.values[name]} ({origin})"
    return out


def rejection_rule(space: Space, point: dict, points: Points | None = None) -> str | None:
    """The rule ``point`` breaks, or None; checked by ``points`` (a study's evaluator) when given."""
    rej = (points or Points(space, cache=1)).check(point)
    return None if rej is None else rej.rule


def _rejection(points: Points, point: dict, examples: dict[str, Example]) -> str | None:
    """The rule ``point`` breaks (None: valid); the first point of each rule is kept in ``examples``."""
    rej = points.check(point)
    if rej is None:
        return None
    if rej.rule not in examples:
        examples[rej.rule] = Example(rej.reason, fixed_knobs(points.space, points.trial(point), rej))
    return rej.rule


def first_valid(space: Space, *, samples: int = SAMPLES, seed: int = 0, points: Points | None = None) -> dict | None:
    """A valid point of ``space`` (the first one walked, or drawn above :data:`WALK_LIMIT` raw points), or None:
    the walk stops at the first, so a space with valid points is cheap to check. ``points``: the study's evaluator
    (what it checks is kept for the study)."""
    points = points or Points(space, cache=1)
    if space.size <= WALK_LIMIT:
        return next((p for p in space.points() if points.valid(p)), None)
    rng = np.random.default_rng(seed)
    sizes = [len(v) for v in space.knobs.values()]
    for row in sample_indices(sizes, rng, samples):
        point = space.point_at(tuple(int(i) for i in row))
        if points.valid(point):
            return point
    return None


def check_not_empty(space: Space, points: Points | None = None) -> None:
    """Refuse a space with no valid point (one line naming the rules and the knobs the space does not vary that
    removed every point): a study of it would launch nothing and look like a success. Above the walk limit the
    space is drawn, not walked: a space no draw finds valid is refused only when it is walked."""
    points = points or Points(space, cache=1)
    if first_valid(space, points=points) is not None or space.size > WALK_LIMIT:
        return
    raise UserError(count_valid(space, points=points).empty_reason(), file=space.source or None, field="knobs")


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
    space: Space,
    *,
    samples: int = SAMPLES,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
    points: Points | None = None,
) -> Count:
    """Exact up to ``WALK_LIMIT`` raw points (``on_progress(done, raw)`` every 1,000), estimated above. ``points``:
    the study's evaluator (what it checks is kept for the study)."""
    points = points or Points(space, cache=1)
    raw = space.size
    by_rule: Counter[str] = Counter()
    examples: dict[str, Example] = {}
    if raw <= WALK_LIMIT:
        valid = 0
        for i, point in enumerate(space.points(), 1):
            rule = _rejection(points, point, examples)
            if rule is None:
                valid += 1
            else:
                by_rule[rule] += 1
            if on_progress and i % 1000 == 0:
                on_progress(i, raw)
        return Count(raw, valid, True, dict(by_rule.most_common()), 0, valid, valid, examples)
    sizes = [len(v) for v in space.knobs.values()]
    rng = np.random.default_rng(seed)
    hits = 0
    for row in sample_indices(sizes, rng, samples):
        rule = _rejection(points, space.point_at(tuple(int(i) for i in row)), examples)
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
        examples,
    )
