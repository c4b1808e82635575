"""The simulated backend: the performance model's figures written as the log a real NeMo 2 run prints.

In-process (no subprocess per trial) so that a grid over a whole space runs at hundreds of trials per
second; the log goes to the trial's run directory, so the parser, the reward and the store see a
simulated run exactly as a real one.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from dse.backends.base import Backend, RunResult
from dse.launch import LaunchPlan
from dse.perfmodel import predict
from dse.trial import TrialConfig
from recipes.sim.logwriter import SimRun, write_log

LOG_NAME = "log.txt"


def trial_seed(trial: TrialConfig, seed: int = 0) -> int:
    """A seed that depends on the trial's knobs and the study seed only (stable across processes)."""
    key = repr(sorted(trial.as_dict().items())) + f"|{seed}"
    return zlib.crc32(key.encode())


def simulate(trial: TrialConfig, seed: int = 0, *, flops_convention: str = "causal") -> SimRun:
    """The run the simulated trainer prints for ``trial``: model figures, jitter seed, OOM if it won't fit."""
    p = predict(trial, flops_convention=flops_convention)
    return SimRun(step_time_s=p.step_time_s, tflops_per_gpu=p.tflops_per_gpu, gbs=trial.gbs,
                  max_steps=trial.max_steps, peak_memory_gib=p.peak_memory_gib, gpu_memory_gib=p.gpu_memory_gib,
                  oom=not p.fits, oom_after=0, seed=trial_seed(trial, seed))


class SimBackend(Backend):
    """Writes the simulated log into the run directory; exit code as the simulated trainer would return."""

    name = "sim"

    def __init__(self, *, seed: int = 0, flops_convention: str = "causal"):
        self.seed, self.flops_convention = seed, flops_convention

    @classmethod
    def from_space(cls, space, *, seed: int = 0) -> "SimBackend":
        return cls(seed=seed, flops_convention=space.backend.flops_convention)

    def run(self, plan: LaunchPlan, run_dir: Path) -> RunResult:
        sim = simulate(plan.trial, self.seed, flops_convention=self.flops_convention)
        log = run_dir / LOG_NAME
        with open(log, "w") as fh:
            code = write_log(sim, fh)
        return RunResult(run_dir=run_dir, log_path=log, exit_code=code)
