"""Backends run a :class:`dse.launch.LaunchPlan` and return the run directory and exit status.

Every backend ends in the same place: a run directory holding the script, the log in the trainer's own
format, and the exit status. Backends know no agent.
"""

from dse.backends.base import Backend, RunResult

__all__ = ["Backend", "RunResult"]
