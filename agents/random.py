"""Random search: seeded, uniform over the valid points, never the same point twice.

A space of at most 2,000,000 raw points is walked in a seeded permutation (every valid point is reached). A
larger one (up to 10^19 points and beyond: the size is a Python int) is sampled one index per knob, which is
uniform over the product without enumerating it; only proposed points are remembered, so memory grows with
the trials, never with the space. Sampling stops after ``max_invalid_draws`` consecutive draws that found no
new valid point (the valid points are too rare to sample, or all tried), or as many proposals in a row that
the environment rejected (without a mask), and says so in ``stop_reason``.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from dse.agents.base import Action, Agent, NoOptions, RejectionRun

_ENUMERATE_LIMIT = 2_000_000  # larger spaces are sampled by rejection instead of a permutation
# Consecutive fruitless draws before random gives up: 1-2 s of rule checks (bench/space_size.py). A space whose
# valid fraction is 10^-3 ends a search this way with probability e^-20 per proposal; one of 10^-5 usually does
# (`dse space` estimates the fraction).
MAX_INVALID_DRAWS = 20_000
_BATCH = 256  # index tuples drawn per numpy call


class RandomOptions(NoOptions):
    max_invalid_draws: int = Field(MAX_INVALID_DRAWS, ge=1, le=10**9)


class RandomAgent(Agent):
    name = "random"
    uses_mask = True
    Options = RandomOptions

    def __init__(self, action_space, *, max_invalid_draws: int = MAX_INVALID_DRAWS, **kw):
        super().__init__(action_space, **kw)
        self._rng = np.random.default_rng(self.seed)
        self._total = math.prod(self.sizes)  # a Python int: exact above 2^63 (numpy's int64 product overflows)
        self._order = iter(self._rng.permutation(self._total)) if self._total <= _ENUMERATE_LIMIT else None
        self._tried: set[tuple[int, ...]] = set()  # proposed points only
        self._max_misses = max_invalid_draws
        self._draws: list[tuple[int, ...]] = []
        self._rejected = RejectionRun(max_invalid_draws)

    def _key(self, flat: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(flat, self.sizes))

    def _draw(self) -> tuple[int, ...]:
        if not self._draws:
            rows = self._rng.integers(0, np.asarray(self.sizes, dtype=np.int64), size=(_BATCH, len(self.sizes)))
            self._draws = [tuple(int(i) for i in r) for r in rows[::-1]]
        return self._draws.pop()

    def observe(self, action: Action, reward: float, ok: bool, **kw) -> None:
        super().observe(action, reward, ok, **kw)
        self._rejected.observe(kw.get("status"))

    def propose(self) -> Action | None:
        if (why := self._rejected.stop_reason("random")) is not None:  # without a mask: the environment rejects
            self.stop_reason = why
            return None
        misses = 0
        while True:
            if misses >= self._max_misses:  # a listed space too: its walk would check every point first
                self.stop_reason = (
                    f"random: {misses:,} draws in a row found no new valid point among "
                    f"{self._total:,} raw points; the valid ones are too rare to sample "
                    "(`dse space` estimates how many): list fewer knob values"
                )
                return None
            if self._order is not None:
                flat = next(self._order, None)
                if flat is None:
                    return None
                key = self._key(flat)
            else:
                key = self._draw()
            if key in self.seen or key in self._tried:
                misses += self._order is None  # a walk meets each point once: a resumed one meets those run
                continue
            action = self.to_action(key)
            if self.valid(action):
                self._tried.add(key)
                return action
            misses += 1
