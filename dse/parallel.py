"""Trials in flight at once (``dse run --parallel N``): each in a thread of its own, results back in the caller.

The backends block (a subprocess, ``sacct`` polling, the simulated log), so threads are enough: the study's
main thread proposes, launches and records, the threads only run :func:`dse.execute.run_trial`. The store
is written from the main thread only.

Ctrl-C reaches the main thread only. :meth:`Pool.cancel` hands the same ``KeyboardInterrupt`` to every
running trial's thread (CPython's ``PyThreadState_SetAsyncExc``), so that each backend's own Ctrl-C path
runs exactly as it does in a one-trial study: Slurm ``scancel``s its job, the local backend stops its
process group, the simulated one just ends. Why not a cancel flag handed to the backends: each backend's
cleanup already lives in its ``KeyboardInterrupt`` handler, and a second path would have to be kept in step
with it in every backend. The exception lands at the thread's next Python instruction: within a poll
interval of a Slurm wait, at once for the others (a local trial blocked in a plain ``subprocess.run``
gets it when its process ends; Ctrl-C at the terminal stops those processes too, as they share dse's
process group).
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Done:
    """A finished job: its key, and its value, or that it was interrupted, or the exception it raised."""

    key: Any
    value: Any = None
    interrupted: bool = False
    error: BaseException | None = None


@dataclass
class _Job:
    key: Any
    fn: Callable[[], Any]
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: bool = True
    cancelled: bool = False
    interruptible: bool = True
    thread: threading.Thread | None = None


class Pool:
    """Jobs in threads, at most ``size`` at once (the caller keeps to it: :attr:`free`).

    Written here rather than on ``concurrent.futures.ThreadPoolExecutor``: a cancel must reach the thread that
    runs a given trial (its ident, for ``PyThreadState_SetAsyncExc``) and must not land once that trial has
    recorded its end (the per-job lock), neither of which an executor's futures expose."""

    def __init__(self, size: int):
        self.size = size
        self._jobs: dict[Any, _Job] = {}
        self._done: queue.Queue[Done] = queue.Queue()

    @property
    def running(self) -> int:
        return len(self._jobs)

    @property
    def free(self) -> int:
        return self.size - len(self._jobs)

    def submit(self, key: Any, fn: Callable[[], Any], *, interruptible: bool = True) -> None:
        """Run ``fn`` in a thread of its own. ``interruptible=False``: :meth:`cancel` lets it finish instead (a
        job of moments that holds nothing outside the process: an exception landing inside its file writes
        would only cut them)."""
        job = _Job(key, fn, interruptible=interruptible)
        job.thread = threading.Thread(target=self._body, args=(job,), name=f"dse-trial-{key}", daemon=True)
        self._jobs[key] = job
        job.thread.start()

    def _body(self, job: _Job) -> None:
        done = Done(job.key)
        try:
            try:
                done.value = job.fn()
            except KeyboardInterrupt:
                done.interrupted = True
            except BaseException as e:  # handed to the main thread, which decides (InfrastructureError...)
                done.error = e
            with job.lock:  # after this no cancel is sent, so none can land outside this function
                job.running = False
        except KeyboardInterrupt:  # the cancel came as the trial ended: its result stands
            pass
        self._done.put(done)

    def wait(self, timeout: float = 0.5) -> list[Done]:
        """The jobs finished so far, waiting until at least one has (in slices of ``timeout`` seconds, so that
        a Ctrl-C reaches the caller at once). Empty when nothing is running."""
        out: list[Done] = []
        while self._jobs and not out:
            try:
                out.append(self._done.get(timeout=timeout))
            except queue.Empty:
                continue
            while True:
                try:
                    out.append(self._done.get_nowait())
                except queue.Empty:
                    break
        for d in out:
            job = self._jobs.pop(d.key)
            job.thread.join()
        return out

    def cancel(self) -> list[Done]:
        """Interrupt every running interruptible job (see the module docstring) and wait for all of them to end;
        what each came to (a job that finished before the interrupt reached it, or was not interruptible, keeps
        its value)."""
        for job in self._jobs.values():
            with job.lock:
                if job.running and not job.cancelled and job.interruptible:
                    job.cancelled = True
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(job.thread.ident),
                                                               ctypes.py_object(KeyboardInterrupt))
        out: list[Done] = []
        while self._jobs:
            try:
                out += self.wait()
            except KeyboardInterrupt:  # a second Ctrl-C while the jobs are being cancelled: keep waiting
                continue
        return out
