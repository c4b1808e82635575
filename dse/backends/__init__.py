"""Backends run a :class:`dse.launch.LaunchPlan` and return the run directory and exit status.

Every backend ends in the same place: a run directory holding the script, the log in the trainer's own
format, and the exit status. Backends know no agent.
"""

from collections.abc import Callable

from dse import registry as reg
from dse.backends.base import Backend, RunResult


def load_backends() -> dict[str, Callable[[], object]]:
    """Registry name -> loader, from the ``dse.backends`` entry points (lazy: nothing imported until chosen)."""
    return reg.load(reg.BACKENDS)


__all__ = ["Backend", "RunResult", "load_backends"]
