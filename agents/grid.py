"""Grid search: every valid point once, in a deterministic order (the first knob varies slowest)."""

from __future__ import annotations

from agents.base import Action, Agent


class GridAgent(Agent):
    name = "grid"
    uses_mask = True  # invalid points are skipped without a launch or a record

    def __init__(self, action_space, **kw):
        super().__init__(action_space, **kw)
        self._it = self.all_keys()

    def propose(self) -> Action | None:
        for key in self._it:
            if key in self.seen:
                continue
            action = self.to_action(key)
            if self.valid(action):
                return action
        return None
