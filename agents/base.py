"""The agent protocol, and the registry of agents built from the ``dse.agents`` entry points.

An agent proposes actions (dicts of knob -> index into the knob's values) and is told each outcome. It
never sees a backend, a log or the store; on resume it is warm-started from the history of
(action, reward, ok) triples.
"""

from __future__ import annotations

import abc
import importlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any

from gymnasium import spaces

from dse.errors import UserError, did_you_mean

Action = dict[str, int]
ActionMask = Callable[[Action], bool]

# Built-ins, used when the package's entry points are not installed (running from a source tree).
BUILTIN = {"grid": "agents.grid:GridAgent", "random": "agents.random:RandomAgent",
           "optuna": "agents.optuna_agent:OptunaAgent"}


def action_key(action: Mapping[str, Any], names: Iterable[str]) -> tuple[int, ...]:
    """A hashable key for an action, independent of the dict's insertion order."""
    return tuple(int(action[n]) for n in names)


class Agent(abc.ABC):
    """Base class. ``action_mask`` (gymnasium-style action masking) lets an agent skip points that the
    environment would reject; agents that want to learn from rejections ignore it."""

    name = "base"
    uses_mask = False

    def __init__(self, action_space: spaces.Dict, *, seed: int = 0, action_mask: ActionMask | None = None,
                 **options: Any):
        if not isinstance(action_space, spaces.Dict) or not all(
                isinstance(s, spaces.Discrete) for s in action_space.spaces.values()):
            raise TypeError("agents need a gymnasium Dict action space of Discrete spaces")
        if options:
            raise UserError(f"agent {self.name!r} takes no option(s) {', '.join(options)}", field="search")
        self.action_space, self.seed, self.action_mask = action_space, seed, action_mask
        self.names = list(action_space.spaces)
        self.sizes = [int(action_space.spaces[n].n) for n in self.names]
        self.seen: set[tuple[int, ...]] = set()

    def key(self, action: Mapping[str, Any]) -> tuple[int, ...]:
        return action_key(action, self.names)

    def to_action(self, key: Iterable[int]) -> Action:
        return dict(zip(self.names, (int(k) for k in key)))

    def all_keys(self) -> Iterator[tuple[int, ...]]:
        """Every point of the space in grid order (the first knob varies slowest)."""
        return itertools.product(*(range(n) for n in self.sizes))

    def valid(self, action: Action) -> bool:
        return self.action_mask is None or self.action_mask(action)

    @abc.abstractmethod
    def propose(self) -> Action | None:
        """The next action, or None when the agent has nothing left to try."""

    def observe(self, action: Action, reward: float, ok: bool) -> None:
        """The outcome of ``action``. The default remembers that it was tried."""
        self.seen.add(self.key(action))

    def warm_start(self, history: Iterable[tuple[Action, float, bool]]) -> None:
        """Replay finished trials (resume)."""
        for action, reward, ok in history:
            self.observe(action, reward, ok)


def _load(target: str) -> type:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_agents() -> dict[str, Callable[[], type[Agent]]]:
    """Registry name -> loader (lazy: nothing is imported until an agent is chosen)."""
    registry: dict[str, Callable[[], type[Agent]]] = {n: (lambda t=t: _load(t)) for n, t in BUILTIN.items()}
    for ep in entry_points(group="dse.agents"):
        registry[ep.name] = ep.load
    return registry


def make_agent(name: str, registry: Mapping[str, Callable[[], type]], action_space: spaces.Dict, *,
               seed: int = 0, action_mask: ActionMask | None = None, **options: Any) -> Agent:
    if name not in registry:
        raise UserError(f"unknown agent {name!r}{did_you_mean(name, registry)}; known: {', '.join(registry)}",
                        field="search.agent")
    cls = registry[name]()
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise UserError(f"entry point dse.agents:{name} is {cls!r}, not an agents.Agent subclass", field="search.agent")
    return cls(action_space, seed=seed, action_mask=action_mask if cls.uses_mask else None, **options)
