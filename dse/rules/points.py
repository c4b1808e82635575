"""A space's points resolved and checked once each: :class:`Points` keeps, per point (its knob values), the
resolved trial (:func:`dse.rules.trial.resolve`) and the first validity rule it breaks (:func:`dse.rules.constraints.check`).

It is the lower half of a study's evaluator (:class:`dse.evaluator.Evaluator` adds the model's prediction and the
memory screen): code below the model (the environment, the count of valid points) takes a ``Points`` and is handed
the study's evaluator, so that a point is resolved and checked once however many callers ask. A trial is immutable
and a rule depends on the trial alone, so what is kept never goes stale.
"""

from __future__ import annotations

import contextlib
from collections import Counter, OrderedDict
from collections.abc import Mapping
from typing import Any

from dse.recipes.models import Recipe
from dse.rules import constraints
from dse.rules.space import Space
from dse.rules.trial import TrialConfig, resolve

__all__ = ["CACHE", "Points", "point_key"]

# points kept (least recently used dropped first): every point of each shipped space (at most 13,824), a few MB
CACHE = 16_384
_BROKEN_UNKNOWN = object()  # no check kept yet (None is a kept verdict: valid)


def point_key(point: Mapping[str, Any]) -> tuple:
    """The key of a point: its knob values by name (``repr``: 1, 1.0 and True stay apart, as they resolve apart)."""
    return tuple(sorted((k, repr(v)) for k, v in point.items()))


class Lru(OrderedDict):
    """A dict that keeps the ``size`` entries used last. A study's pool threads share it (``--parallel``): each step
    is one operation on the dict, and an entry another thread dropped meanwhile is a miss, never an error."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get_recent(self, key: tuple, default: Any = None) -> Any:
        value = self.get(key, default)
        if value is not default:
            with contextlib.suppress(KeyError):
                self.move_to_end(key)
        return value

    def put(self, key: tuple, value: Any) -> None:
        self[key] = value
        if len(self) > self.size:
            with contextlib.suppress(KeyError):
                self.popitem(last=False)


class Points:
    """``space``'s points, each resolved and checked once (``computed`` counts what was computed, by kind).
    ``recipe`` replaces the space's registered recipe (``dse predict --model-file``), as in :func:`resolve`."""

    def __init__(self, space: Space, *, recipe: Recipe | None = None, cache: int = CACHE):
        self.space = space
        self.recipe = recipe
        self.computed: Counter[str] = Counter()
        self._trials = Lru(cache)
        self._broken = Lru(cache)

    def trial(self, point: Mapping[str, Any]) -> TrialConfig:
        """``point`` resolved: catalogue defaults < recipe layout < settings < point."""
        return self._trial(point_key(point), point)

    def check(self, point: Mapping[str, Any]) -> constraints.Rejection | None:
        """The first validity rule ``point`` breaks, or None."""
        key = point_key(point)
        got = self._broken.get_recent(key, _BROKEN_UNKNOWN)
        if got is _BROKEN_UNKNOWN:
            got = constraints.check(self._trial(key, point))
            self.computed["check"] += 1
            self._broken.put(key, got)
        return got

    def valid(self, point: Mapping[str, Any]) -> bool:
        return self.check(point) is None

    def _trial(self, key: tuple, point: Mapping[str, Any]) -> TrialConfig:
        got = self._trials.get_recent(key)
        if got is None:
            got = resolve(self.space, point, recipe=self.recipe)
            self.computed["resolve"] += 1
            self._trials.put(key, got)
        return got
