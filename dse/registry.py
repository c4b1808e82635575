"""Entry-point registries for what users extend: agents (``dse.agents``) and backends (``dse.backends``).

One helper for both, as Optuna and Gymnasium do it: a registry is built where the program starts (never at
import time, never a class-level dict), maps a name to a lazy loader (nothing is imported until chosen), and
type-checks what it loads. The built-in names are listed here as plain strings so that the space file can be
validated against the registry without importing an agent or a backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import TypeVar

from dse.errors import UserError, did_you_mean

AGENTS = "dse.agents"
BACKENDS = "dse.backends"
# Built-ins, used when the package's entry points are not installed (running from a source tree).
BUILTIN: dict[str, dict[str, str]] = {
    AGENTS: {
        "grid": "dse.agents.grid:GridAgent",
        "random": "dse.agents.random:RandomAgent",
        "optuna": "dse.agents.optuna_agent:OptunaAgent",
        "guided": "dse.agents.guided:GuidedAgent",
        "policy": "dse.agents.policy:PolicyAgent",
    },
    BACKENDS: {
        "sim": "dse.backends.sim:SimBackend",
        "local": "dse.backends.local:LocalBackend",
        "slurm": "dse.backends.slurm:SlurmBackend",
    },
}

Registry = Mapping[str, Callable[[], object]]
T = TypeVar("T")


def _target(target: str) -> Callable[[], object]:
    def load() -> object:
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    return load


def load(group: str) -> dict[str, Callable[[], object]]:
    """Name -> loader for an entry-point group: the built-ins, then installed entry points (which win)."""
    registry: dict[str, Callable[[], object]] = {n: _target(t) for n, t in BUILTIN.get(group, {}).items()}
    for ep in entry_points(group=group):
        registry[ep.name] = ep.load
    return registry


def names(group: str) -> list[str]:
    """The names a registry offers, without importing any of them."""
    return list(load(group))


def get(
    registry: Registry, name: str, base: type[T], *, group: str, field: str | None = None, param: str | None = None
) -> type[T]:
    """The class registered as ``name``, checked to subclass ``base``; a :class:`UserError` otherwise, naming
    ``field`` (of a file) or ``param`` (the caller's argument that gave the name)."""
    if name not in registry:
        raise UserError(
            f"unknown {group.removeprefix('dse.').rstrip('s')} {name!r}{did_you_mean(name, registry)}; "
            f"known: {', '.join(registry)}",
            field=field,
            param=param,
        )
    cls = registry[name]()
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise UserError(
            f"entry point {group}:{name} is {cls!r}, not a {base.__module__}.{base.__qualname__} subclass",
            field=field,
            param=param,
        )
    return cls
