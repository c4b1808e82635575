"""Trials in flight at once (``dse run --parallel N``, and ``--worker``): a thread pool, results back in the caller.

The backends block (a subprocess, ``sacct`` polling, the simulated log), so threads are enough: the study's
main thread proposes, launches and records, the pool's threads only run trials (:func:`dse.execute.run_trial`
through the environment). The store is written from the main thread only.

Ctrl-C reaches the main thread only. :meth:`Pool.cancel` sets :attr:`Pool.cancel_event`, which each running
trial's backend reads through its stop check (:class:`dse.execute.CancelCheck`, the same hook an early stop
uses): Slurm ``scancel``s its job, the local backend stops its process group, and the trial ends as
:class:`dse.errors.Cancelled`. A backend that is not :attr:`~dse.backends.base.Backend.interruptible` (the
simulated one: milliseconds in-process) is let finish, and its result stands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any


@dataclass
class Done:
    """A finished job: its key, and its value or the exception it raised."""

    key: Any
    value: Any = None
    error: BaseException | None = None


class Pool:
    """Jobs on a :class:`concurrent.futures.ThreadPoolExecutor`, at most ``size`` at once (the caller keeps to
    it: :attr:`free`), and the event that cancels them (:attr:`cancel_event`, handed to each run)."""

    def __init__(self, size: int):
        self.size = size
        self.cancel_event = threading.Event()
        self._executor = futures.ThreadPoolExecutor(max_workers=size, thread_name_prefix="dse-trial")
        self._running: dict[futures.Future, Any] = {}

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def free(self) -> int:
        return self.size - len(self._running)

    def submit(self, key: Any, fn: Callable[[], Any]) -> None:
        """Run ``fn`` in a thread of the pool; its result comes back from :meth:`wait` under ``key``."""
        self._running[self._executor.submit(fn)] = key

    def wait(self, timeout: float = 0.5) -> list[Done]:
        """The jobs finished so far (by key), waiting until at least one has, in slices of ``timeout`` seconds
        so that a Ctrl-C reaches the caller at once. Empty when nothing is running."""
        while self._running:
            finished, _ = futures.wait(self._running, timeout=timeout, return_when=futures.FIRST_COMPLETED)
            if finished:
                return sorted((self._done(f) for f in finished), key=lambda d: d.key)
        return []

    def _done(self, future: futures.Future) -> Done:
        key = self._running.pop(future)
        error = future.exception()
        return Done(key, None if error is not None else future.result(), error)

    def cancel(self) -> list[Done]:
        """Set the cancel event and wait for every running job to end (a second Ctrl-C meanwhile does not
        stop the wait); what each came to (a job that ended before its run saw the event keeps its value)."""
        self.cancel_event.set()
        out: list[Done] = []
        while self._running:
            try:
                out += self.wait()
            except KeyboardInterrupt:
                continue
        return out

    def close(self) -> None:
        """Let the pool's threads go (every job has ended by then: :meth:`wait` or :meth:`cancel`)."""
        self._executor.shutdown(wait=True)
