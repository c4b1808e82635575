"""Random search: seeded, uniform over the valid points, never the same point twice."""

from __future__ import annotations

import numpy as np

from agents.base import Action, Agent

_ENUMERATE_LIMIT = 2_000_000  # larger spaces are sampled by rejection instead of a permutation


class RandomAgent(Agent):
    name = "random"
    uses_mask = True

    def __init__(self, action_space, **kw):
        super().__init__(action_space, **kw)
        self._rng = np.random.default_rng(self.seed)
        self._total = int(np.prod(self.sizes, dtype=np.int64))
        self._order = iter(self._rng.permutation(self._total)) if self._total <= _ENUMERATE_LIMIT else None
        self._tried: set[tuple[int, ...]] = set()

    def _key(self, flat: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(flat, self.sizes))

    def propose(self) -> Action | None:
        while True:
            if self._order is not None:
                flat = next(self._order, None)
                if flat is None:
                    return None
            else:
                if len(self._tried) >= self._total:
                    return None
                flat = int(self._rng.integers(self._total))
            key = self._key(flat)
            if key in self.seen or key in self._tried:
                continue
            self._tried.add(key)
            action = self.to_action(key)
            if self.valid(action):
                return action
