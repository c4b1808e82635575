"""The simulated backend: the performance model's figures written as the log a real NeMo 2 run prints.

In-process (no subprocess per trial) so that a grid over a whole space runs at hundreds of trials per
second; the log goes to the trial's run directory, so the parser, the reward and the store see a
simulated run exactly as a real one. The log is ``log.txt.gz`` (gzip) unless an early-stop monitor follows
it while it is written (``log.txt`` then). The figures come with the plan (``LaunchPlan.sim_run``, from
:func:`dse.perfmodel.simulate.simulate`), the same call the ``sim`` payload's environment is built from.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from dse.backends.base import Backend, RunResult, StopCheck
from dse.backends.scripts import COMPRESSED_LOG, LOG_NAME
from dse.launch import LaunchPlan
from dse.perfmodel.simulate import simulate
from dse.perfmodel.twin import Twin, make_twin
from dse.recipes.sim.logwriter import write_log


class SimBackend(Backend):
    """Writes the simulated log into the run directory; exit code as the simulated trainer would return."""

    interruptible = False  # milliseconds in-process: a Ctrl-C lets it finish (its log is never cut mid-write)
    packs_logs = True  # a grid of them would be a directory of 8 KiB on disk per 400-byte log (dse.logs.logpack)

    name = "sim"
    simulated = True

    def __init__(
        self, *, seed: int = 0, flops_convention: str = "causal", twin: Twin | None = None, startup_s: float = 300.0
    ):
        self.seed, self.flops_convention, self.twin, self.startup_s = seed, flops_convention, twin, startup_s

    @classmethod
    def from_space(cls, space, *, seed: int = 0) -> SimBackend:
        b = space.backend
        twin = make_twin(space, b.twin_seed) if b.truth == "twin" else None  # [backend] truth = "twin"
        return cls(seed=seed, flops_convention=b.flops_convention, twin=twin, startup_s=space.system.startup_s)

    def run(self, plan: LaunchPlan, run_dir: Path, stop: StopCheck | None = None) -> RunResult:
        # A plan built for this backend carries its figures; one built elsewhere (a test, a script) gets them
        # from the same call here. A twin truth replaces the model's figures with the twin's.
        if self.twin is not None:
            sim = simulate(plan.trial, self.seed, flops_convention=self.flops_convention, twin=self.twin)
        else:
            sim = plan.sim_run or simulate(plan.trial, self.seed, flops_convention=self.flops_convention)
        if stop is None:
            # Nothing follows the log while it is written: keep it gzip-compressed (13 KB of a 50-step log become
            # ~3 KB, a 4 KiB block on disk instead of 16); the parser and `dse parse`
            # read it as they read a plain log. Level 1: most of the size for a fraction of the CPU.
            log = run_dir / COMPRESSED_LOG
            with gzip.open(log, "wt", compresslevel=1, encoding="utf-8") as fh:
                code = write_log(sim, fh)
            steps = sim.oom_after if sim.oom else sim.max_steps
            return RunResult(
                run_dir=run_dir,
                log_path=log,
                exit_code=code,
                stopped=False,
                wall_s=self.startup_s + steps * sim.step_time_s,
            )
        log = run_dir / LOG_NAME  # the early-stop monitor follows a plain file
        written = [0]  # steps written so far

        def after_step(i: int) -> bool:
            # the early stop, simulated from the step series: the log ends where the stop was decided
            written[0] = i + 1
            fh.flush()
            return stop(log)

        with open(log, "w") as fh:
            code = write_log(sim, fh, after_step=after_step)
        stopped = code is None
        steps = written[0] if stopped else (sim.oom_after if sim.oom else sim.max_steps)
        return RunResult(
            run_dir=run_dir,
            log_path=log,
            exit_code=None if stopped else code,
            stopped=stopped,
            wall_s=self.startup_s + steps * sim.step_time_s,
        )
