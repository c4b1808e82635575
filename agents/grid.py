"""Grid search: every valid point once, in a deterministic order (the first knob varies slowest).

A grid walks every raw point, so it refuses a space of more than :data:`dse.rules.space.WALK_LIMIT` raw points (the
count and what to use instead in one line) rather than spin through 10^12 of them.
"""

from __future__ import annotations

import math

from dse.agents.base import Action, Agent
from dse.errors import UserError
from dse.rules.space import WALK_LIMIT


class GridAgent(Agent):
    name = "grid"
    uses_mask = True  # invalid points are skipped without a launch or a record

    def __init__(self, action_space, **kw):
        super().__init__(action_space, **kw)
        total = math.prod(self.sizes)  # a Python int: exact however large
        if total > WALK_LIMIT:
            raise UserError(
                f"a grid walks every point; this space has {total:,} raw points (at most "
                f'{WALK_LIMIT:,}): use agent "random" or "optuna" with [search] trials, or list '
                "fewer knob values",
                field="search.agent",
            )
        self._total = total
        self._proposed = 0
        self._it = self.all_keys()

    def propose(self) -> Action | None:
        for key in self._it:
            if key in self.seen:
                continue
            action = self.to_action(key)
            if self.valid(action):
                self._proposed += 1
                return action
        if not self._proposed and not self.seen:
            self.stop_reason = (
                f"grid: none of the {self._total:,} raw points is valid (`dse space` counts them by rule)"
            )
        return None
