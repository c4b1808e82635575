"""Backends run a :class:`dse.launch.LaunchPlan` and return the run directory and exit status.

Every backend ends in the same place: a run directory holding the script, the log in the trainer's own
format, and the exit status. Backends know no agent.
"""

from collections.abc import Callable
from importlib.metadata import entry_points

from dse.backends.base import Backend, RunResult

# Built-ins, used when the package's entry points are not installed (running from a source tree).
BUILTIN = {"sim": "dse.backends.sim:SimBackend", "local": "dse.backends.local:LocalBackend",
           "slurm": "dse.backends.slurm:SlurmBackend"}


def _load(target: str) -> type:
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_backends() -> dict[str, Callable[[], type]]:
    """Registry name -> loader, from the ``dse.backends`` entry points (lazy: nothing imported until chosen)."""
    registry: dict[str, Callable[[], type]] = {n: (lambda t=t: _load(t)) for n, t in BUILTIN.items()}
    for ep in entry_points(group="dse.backends"):
        registry[ep.name] = ep.load
    return registry


__all__ = ["Backend", "RunResult", "load_backends"]
