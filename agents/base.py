"""The agent protocol, and the registry of agents built from the ``dse.agents`` entry points.

An agent proposes actions (dicts of knob -> index into the knob's values) and is told each outcome. It
never sees a backend, a log or the store; on resume it is warm-started from the history of
(action, reward, ok, status, metrics). An agent that ``uses_model`` is also handed the shipped performance
model's :class:`Forecast` of each action (never the backend's truth).
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, ValidationError

from dse import registry as reg
from dse.errors import UserError
from dse.logs.parse import UNLAUNCHED_STATUSES

Action = dict[str, int]
ActionMask = Callable[[Action], bool]


@dataclass(frozen=True)
class Forecast:
    """What a model predicts for one valid point, in the agent's terms: the reward (signed as the
    environment's: higher is better), the peak memory per GPU and the GPU's memory (GiB)."""

    reward: float
    peak_memory_gib: float
    memory_gib: float


# The model's forecast of an action, or None when the environment would reject the point. Built by the study
# from the shipped performance model (never from a backend's truth), handed to agents with ``uses_model``.
Forecaster = Callable[[Action], "Forecast | None"]


class NoOptions(BaseModel):
    """An agent's options (``[search.options]`` in the space file): a strict pydantic model per agent (strict
    types as the space's: a string is not a number, a number not a boolean)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def action_key(action: Mapping[str, Any], names: Iterable[str]) -> tuple[int, ...]:
    """A hashable key for an action, independent of the dict's insertion order."""
    return tuple(int(action[n]) for n in names)


class Agent(abc.ABC):
    """Base class. ``action_mask`` (gymnasium-style action masking) lets an agent skip points that the
    environment would reject; agents that want to learn from rejections ignore it."""

    name = "base"
    uses_mask = False
    uses_model = False  # True: the constructor takes ``forecast`` (a Forecaster, or None where there is no model)
    stop_reason: str | None = None  # why propose() returned None, when the agent decided to stop by itself
    Options: type[BaseModel] = NoOptions  # what ``[search.options]`` may set; validated by make_agent
    requires: tuple[str, ...] = ()  # modules of an optional extra the agent needs (its error names the extra)
    # options that name a file: a relative path is relative to the space file (dse.study.loop.agent_settings)
    path_options: tuple[str, ...] = ()

    def __init__(
        self, action_space: spaces.Dict, *, seed: int = 0, action_mask: ActionMask | None = None, **options: Any
    ):
        if not isinstance(action_space, spaces.Dict) or not all(
            isinstance(s, spaces.Discrete) for s in action_space.spaces.values()
        ):
            raise TypeError("agents need a gymnasium Dict action space of Discrete spaces")
        if options:
            raise UserError(f"agent {self.name!r} takes no option(s) {', '.join(options)}", field="search.options")
        self.action_space, self.seed, self.action_mask = action_space, seed, action_mask
        self.names = list(action_space.spaces)
        self.sizes = [int(cast(spaces.Discrete, action_space.spaces[n]).n) for n in self.names]  # checked above
        self.seen: set[tuple[int, ...]] = set()

    def prepare(self) -> None:
        """Read or build what the options name (a policy file...), once, after the constructor: :func:`make_agent`
        calls it unless told not to, and ``dse validate`` builds agents without it, so that checking a space reads
        no file an option names (its constructor or options model checks only that the file is there). The default
        has nothing to read."""
        return None

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

    def observe(
        self,
        action: Action,
        reward: float,
        ok: bool,
        *,
        status: str | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> None:
        """The outcome of ``action``: its reward, whether the run succeeded, and (when known) the run's status
        (``ok``, ``oom``, ``rejected``...) and parsed metrics. The default remembers that it was tried."""
        self.seen.add(self.key(action))

    def abandon(self, action: Action) -> None:
        """``action``, proposed, will not run in this process: its launch failed for infrastructure (sbatch refused
        it, Slurm kept it pending past ``slurm.max_pending``), which says nothing of the layout. Close what was
        opened for it and learn nothing; it is not proposed again here (``dse run --resume`` runs it again). The
        default has nothing open."""
        return None  # a hook with a default, not abstract: grid and random keep no state for a point in flight

    def reforecast(self) -> None:
        """The model behind the agent's forecast was refit on the study's runs (dse.perfmodel.refit): an agent that keeps
        forecasts asks again. The default keeps none."""
        return None

    def warm_start(self, history: Iterable[tuple]) -> None:
        """Replay finished trials (resume): ``(action, reward, ok)`` or ``(action, reward, ok, status, metrics)``."""
        for action, reward, ok, *rest in history:
            status, metrics = (list(rest) + [None, None])[:2]
            self.observe(action, reward, ok, status=status, metrics=metrics)


def load_agents() -> dict[str, Callable[[], object]]:
    """Registry name -> loader, from the ``dse.agents`` entry points (lazy: nothing imported until chosen)."""
    return reg.load(reg.AGENTS)


def agent_class(name: str, registry: Mapping[str, Callable[[], object]]) -> type[Agent]:
    return reg.get(registry, name, Agent, group=reg.AGENTS, field="search.agent")


def agent_options(cls: type[Agent], options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` validated by the agent's own model; a one-line :class:`UserError` naming the option."""
    try:
        return dict(cls.Options.model_validate(dict(options)))
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(cls.Options.model_fields) or "none"
            msg = f"agent {cls.name!r} has no option {where!r}; its options: {allowed}"
        else:
            msg = f"{err['msg']} (got {err.get('input')!r})"
        raise UserError(msg, field=f"search.options.{where}") from None


def make_agent(
    name: str,
    registry: Mapping[str, Callable[[], object]],
    action_space: spaces.Dict,
    *,
    seed: int = 0,
    action_mask: ActionMask | None = None,
    forecast: Forecaster | None = None,
    prepare: bool = True,
    **options: Any,
) -> Agent:
    """The agent called ``name``, built with its validated options (and the model's ``forecast`` for an agent
    that ``uses_model``), and prepared (:meth:`Agent.prepare`) unless ``prepare`` is False."""
    cls = agent_class(name, registry)
    extra = {"forecast": forecast} if cls.uses_model else {}
    agent = cls(
        action_space,
        seed=seed,
        action_mask=action_mask if cls.uses_mask else None,
        **agent_options(cls, options),
        **extra,
    )
    if prepare:
        agent.prepare()
    return agent


#: Statuses of points that cost nothing because they were never launched (a constraint refused them, or the
#: memory screen did): a run of them does not spend the budget, so an agent counts them itself to stop.
NOT_LAUNCHED = UNLAUNCHED_STATUSES


class RejectionRun:
    """The run of consecutive proposals that were not launched; an agent stops once it reaches ``limit``
    (a space with no valid point would otherwise be proposed from forever, the budget counting launches)."""

    def __init__(self, limit: int):
        self.limit, self.run = limit, 0

    def observe(self, status: str | None) -> None:
        self.run = self.run + 1 if status in NOT_LAUNCHED else 0

    def stop_reason(self, agent: str) -> str | None:
        """Why the agent stops now (None: it goes on)."""
        if self.run < self.limit:
            return None
        return (
            f"{agent}: {self.run:,} proposed points in a row were rejected or screened before launch; the space may "
            "hold no valid point that fits (`dse space FILE` counts them): change the fixed settings or list other "
            "knob values"
        )
