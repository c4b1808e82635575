"""The backend protocol."""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from dse.launch import LaunchPlan

if TYPE_CHECKING:
    from dse.rules.space import Space
    from dse.rules.trial import TrialConfig


class StopCheck(Protocol):
    """What a backend is handed to stop a run early (dse.logs.steady.Monitor): called with the path of the log
    the run is writing, it answers True once the run should stop. A backend calls it every ``poll_s``
    seconds while the run lasts (the simulated backend after each step it writes) and then stops the job
    the way a user would; it neither parses the log nor knows the rule."""

    poll_s: float

    def __call__(self, log_path: Path) -> bool: ...


@dataclass(frozen=True)
class InfrastructureFailure:
    """The machinery around a trial failed (a launcher that cannot start, a command not found, sbatch refusing the
    job, Slurm keeping it pending past its limit), not its layout: the trial is ``failed``, agents do not learn
    from it and ``--resume`` runs it again (dse.study.trials). A backend returns it as its :attr:`RunResult.reason`;
    the store keeps it as reason text, :attr:`PREFIX` then the message (``str(failure)``), which :meth:`of`
    reads back."""

    message: str

    PREFIX: ClassVar[str] = "infrastructure: "

    def __str__(self) -> str:
        return self.PREFIX + self.message

    @classmethod
    def of(cls, status: str, reason: object) -> InfrastructureFailure | None:
        """The infrastructure failure a recorded trial (its status and reason text) is, or None when it is not one
        (any other outcome; a reason that is no text, as pandas' NaN for none)."""
        if status == "failed" and isinstance(reason, str) and reason.startswith(cls.PREFIX):
            return cls(reason[len(cls.PREFIX) :])
        return None


@dataclass(frozen=True)
class RunResult:
    """What a backend hands back: where the run lives and how it ended (as the scheduler saw it).

    ``wall_s`` (see below) feeds the trial's GPU-hours. ``exit_code`` is None when the process never reported one (killed, lost). ``scheduler_state`` is the
    scheduler's word for the end (Slurm's ``COMPLETED``, ``TIMEOUT``, ``OUT_OF_MEMORY``, ``CANCELLED``...),
    None for backends without a scheduler. The parser turns these plus the log into a status. ``reason`` is
    set only when the backend knows why nothing ran: an :class:`InfrastructureFailure` (sbatch refused the
    script, in the scheduler's own words), or a text (a point the backend cannot run): the trial fails with it
    as its reason, and no log is parsed.
    """

    run_dir: Path
    log_path: Path
    exit_code: int | None
    scheduler_state: str | None = None
    job_id: str | None = None
    # the run's wall time when the backend knows it better than the caller's clock (the simulated backend:
    # start-up plus simulated steps); None: the environment times backend.run itself
    wall_s: float | None = None
    # True when the backend stopped the run because its StopCheck said so (not when it ended by itself)
    stopped: bool = False
    reason: InfrastructureFailure | str | None = None


#: The same launch failure this many times in a row ends the study: nothing launched will start (a missing
#: torchrun, a misconfigured cluster), so every further trial would be spent on it.
FAILURES_TO_STOP = 3


class LaunchFailures:
    """A backend's run of identical launch failures (the last message, how many times in a row), shared by
    the runs in flight at once (a lock): :meth:`failed` counts one, :meth:`launched` ends the run."""

    def __init__(self, limit: int = FAILURES_TO_STOP):
        self.limit = limit
        self._last: tuple[str, int] = ("", 0)
        self._lock = threading.Lock()

    def failed(self, message: str) -> None:
        with self._lock:
            last, n = self._last
            self._last = (message, n + 1 if message == last else 1)

    def launched(self) -> None:
        with self._lock:
            self._last = ("", 0)

    def repeated(self) -> tuple[str, int] | None:
        """(message, times) once the same failure came ``limit`` times in a row; None before."""
        with self._lock:
            message, n = self._last
        return (message, n) if n >= self.limit else None


class Backend(abc.ABC):
    """Runs one plan to its end. Implementations must not raise for a failed run: a failure is data."""

    name: str = "base"
    simulated: bool = False  # True: the plan must carry the simulated figures (LaunchPlan.sim_run)
    # False: a run ends in moments and holds nothing outside dse (the in-process simulated backend), so a Ctrl-C
    # under --parallel lets it finish; True: it is handed a stop check that also reads the study's cancel event
    # (dse.execute.CancelCheck), and stops its run when that says so, as for an early stop
    interruptible: bool = True
    # The backend's declared infrastructure errors: what its run raises when the machinery around a trial fails
    # (a launcher that cannot start, a scheduler command that breaks). Each becomes the trial's outcome
    # (failed, the error as its reason); any other exception is a bug and stops the study (dse.execute).
    run_errors: tuple[type[Exception], ...] = (OSError,)
    # True: its run directories (exactly a compressed log, dse.logs.logpack.packable) are packed once recorded
    packs_logs: bool = False

    @classmethod
    def from_space(cls, space: Space, *, seed: int = 0) -> Backend:
        """The backend for a study of ``space`` (its system, its [backend] table). ``seed`` is the study's."""
        # a subclass that keeps this default takes the space as its one positional argument (local, slurm)
        return cls(space)  # type: ignore[call-arg]

    script_name: str | None = None  # the launch script write_script writes (None: this backend writes none)

    @classmethod
    def write_script(cls, plan: LaunchPlan, run_dir: Path) -> Path:
        """Write the script this backend would launch ``plan`` with into ``run_dir`` (``dse dry-run``,
        ``best/``); submits nothing. Backends that launch no script refuse."""
        from dse.errors import UserError

        raise UserError(f"backend {cls.name!r} writes no launch script", param="backend")

    @classmethod
    def check_script(cls, plan: LaunchPlan, run_dir: Path) -> None:
        """Raise the :class:`~dse.errors.UserError` that :meth:`write_script` would raise for ``plan``, writing
        nothing outside ``run_dir`` (the study's preflight and ``dse validate``). The default writes the script
        there; a backend whose rendering is slow overrides it with its checks alone."""
        cls.write_script(plan, run_dir)

    def refusal(self, trial: TrialConfig) -> str | None:
        """Why this backend cannot run ``trial`` at all (a replay table that holds no run of its point), or None.
        The environment asks it with the validity rules, before launch: a refused point is ``rejected`` with this
        reason under the backend's name, costs nothing and is masked from agents, as a point that breaks a rule."""
        return None

    def stop_reason(self) -> str | None:
        """Why the study should end now (this backend can run nothing: a misconfigured cluster), or None.
        The study asks after recording each trial and ends with this as a user error."""
        return None

    @abc.abstractmethod
    def run(self, plan: LaunchPlan, run_dir: Path, stop: StopCheck | None = None) -> RunResult:
        """Run ``plan`` with ``run_dir`` as its run directory (created by the caller, empty). With ``stop``,
        stop the run once ``stop(log)`` answers True and return ``RunResult(stopped=True)``; a backend
        that cannot stop a run early may ignore it (the trial then runs to its end)."""

    def finished_after_interrupt(self, trial: TrialConfig, run_dir: Path) -> RunResult | None:
        """After a Ctrl-C stopped the wait for ``trial``'s run in ``run_dir``: its result when the run had in
        fact ended by itself (a Slurm job that COMPLETED before the cancel came), to be parsed as if the wait
        had seen it end; None (the default) when it was interrupted."""
        return None
