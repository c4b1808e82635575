"""The simulated run of a trial: the performance model's figures as the simulated trainer prints them.

One call for every simulated path (the embedded ``sim`` backend and the ``sim`` payload under the local or
Slurm backend), so both print the same figures under the same FLOPs convention. Lives under the model,
below ``dse.launch`` and ``dse.backends``, so neither needs the other to simulate.
"""

from __future__ import annotations

import zlib

from dse import knobs
from dse.perfmodel.model import predict
from dse.perfmodel.timing import DEFAULT_PARAMS, Params
from dse.recipes.sim.logwriter import SimRun

# Knobs that enter a trial's seed only away from their catalogue default: the MoE knobs, which a dense model does
# not read, so that their arrival left every dense space's simulated runs as they were
_SEED_IF_SET = knobs.MOE_KNOBS | {"pp_first_layers", "pp_last_layers"}


def trial_seed(trial, seed: int = 0) -> int:
    """A seed that depends on the trial's knobs and the study seed only (stable across processes)."""
    items = trial.as_dict().items()
    kept = [(k, v) for k, v in items if k not in _SEED_IF_SET or v != knobs.CATALOGUE[k].default]
    key = repr(sorted(kept)) + f"|{seed}"
    return zlib.crc32(key.encode())


def simulate(
    trial, seed: int = 0, *, flops_convention: str = "causal", params: Params = DEFAULT_PARAMS, twin=None
) -> SimRun:
    """The run the simulated trainer prints for ``trial``: model figures (or a :class:`dse.perfmodel.twin.Twin`'s),
    jitter seed, OOM if it won't fit."""
    p = (
        twin.predict(trial, flops_convention=flops_convention)
        if twin is not None
        else predict(trial, flops_convention=flops_convention, params=params)
    )
    return SimRun(
        step_time_s=p.step_time_s,
        tflops_per_gpu=p.tflops_per_gpu,
        gbs=trial.layout.gbs,
        max_steps=trial.layout.max_steps,
        peak_memory_gib=p.peak_memory_gib,
        gpu_memory_gib=p.gpu_memory_gib,
        oom=not p.fits,
        oom_after=0,
        seed=trial_seed(trial, seed),
    )
