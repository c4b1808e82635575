"""Write a NeMo 2 / Lightning-format training log from a step time, as a real run would print it.

Plain Python (no controller imports), shared by the embedded simulated backend and the simulated trainer
payload (``python -m recipes.sim``). Values are printed in ``{:.4}`` format as NeMo 2 does
(``1.249e+03``). Warm-up steps are slower; every step carries seeded jitter; an OOM run prints a few
lines of start-up and then the traceback that PyTorch prints, and exits non-zero.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

OOM_EXIT_CODE = 1


@dataclass(frozen=True)
class SimRun:
    """What the simulated trainer needs to print one run. ``oom`` ends the run after ``oom_after`` steps."""

    step_time_s: float
    tflops_per_gpu: float
    gbs: int
    max_steps: int = 50
    peak_memory_gib: float = 0.0
    gpu_memory_gib: float = 80.0
    oom: bool = False
    oom_after: int = 0
    seed: int = 0
    jitter: float = 0.01  # relative standard deviation of step time
    warmup_steps: int = 3
    warmup_factor: float = 4.0  # first step is this much slower; decays over the warm-up
    loss_start: float = 12.0


def _fmt(x: float) -> str:
    return f"{float(x):.4}"


def write_log(run: SimRun, out: TextIO, after_step: Callable[[int], bool] | None = None) -> int | None:
    """Write the log of ``run`` to ``out``; return the exit code the process would have.

    ``after_step(i)`` is called after step ``i``'s line (pacing, an early stop); when it returns True the
    log ends there and None is returned (the run was stopped from outside: no exit code of its own)."""
    rng = random.Random(run.seed)
    out.write("GPU available: True (cuda), used: True\n")
    out.write("[NeMo I] Using the simulated trainer (dse); figures come from the performance model\n")
    steps = run.oom_after if run.oom else run.max_steps
    consumed = 0
    for i in range(steps):
        factor = 1.0
        if i < run.warmup_steps:
            factor = 1.0 + (run.warmup_factor - 1.0) * (1.0 - i / run.warmup_steps)
        t = run.step_time_s * factor * max(0.5, 1.0 + rng.gauss(0.0, run.jitter))
        consumed += run.gbs
        loss = run.loss_start * math.exp(-0.02 * i) + rng.gauss(0.0, 0.02)
        tflops = run.tflops_per_gpu * run.step_time_s / t
        out.write(
            f"Training epoch 0, iteration {i}/{run.max_steps - 1} | lr: {_fmt(3e-4 * min(1.0, (i + 1) / 10))} | "
            f"global_batch_size: {run.gbs} | global_step: {i} | reduced_train_loss: {_fmt(loss)} | "
            f"train_step_timing in s: {_fmt(t)} | TFLOPS_per_GPU: {_fmt(tflops)} | "
            f"max_memory_reserved: {_fmt(run.peak_memory_gib * 1.05 * 2**30)} | "
            f"max_memory_allocated: {_fmt(run.peak_memory_gib * 2**30)} | consumed_samples: {consumed}\n"
        )
        if after_step is not None and after_step(i):
            return None
    if run.oom:
        need = max(0.5, run.peak_memory_gib - run.gpu_memory_gib + 1.0)
        out.write(
            "Traceback (most recent call last):\n"
            '  File "/opt/NeMo/nemo/lightning/pytorch/strategies/megatron_strategy.py", line 664, in training_step\n'
            "    out = self.model.training_step(dataloader_iter, *args, **kwargs)\n"
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need:.2f} GiB. GPU 0 has a total "
            f"capacity of {run.gpu_memory_gib:.2f} GiB of which {0.3:.2f} GiB is free. Including non-PyTorch memory, "
            f"this process has {run.gpu_memory_gib - 0.4:.2f} GiB memory in use.\n"
        )
        return OOM_EXIT_CODE
    out.write(f"`Trainer.fit` stopped: `max_steps={run.max_steps:d}` reached.\n")
    return 0
