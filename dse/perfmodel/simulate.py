"""The simulated run of a trial: the performance model's figures as the simulated trainer prints them.

One call for every simulated path (the embedded ``sim`` backend and the ``sim`` payload under the local or
Slurm backend), so both print the same figures under the same FLOPs convention. Lives under the model,
below ``dse.launch`` and ``dse.backends``, so neither needs the other to simulate.
"""

from __future__ import annotations

import zlib

from dse.facts import knobs
from dse.perfmodel.model import predict
from dse.perfmodel.timing import DEFAULT_PARAMS, Params
from dse.recipes.sim.logwriter import SimRun

# The knobs of the catalogue before CUDA graphs, NVFP4's companions, recompute modules, NCCL registration and the
# MoE knobs arrived: they always enter a trial's seed. A knob added since enters it only away from its catalogue
# default, so that adding a knob never re-rolls the simulated runs of a space that does not set it (the docs'
# examples, the tests' tolerances and a resumed study draw what they drew before). A new knob needs no entry here.
SEED_KNOBS = frozenset(
    {
        "tp", "pp", "vp", "cp", "ep", "sp", "mbs", "gbs", "seq_length", "recompute", "recompute_num_layers",
        "precision", "fp8_recipe", "fsdp", "tp_comm_overlap", "cpu_offload_layers", "attention_backend",
        "num_nodes", "max_steps",
    }
)  # fmt: skip


def _seeded(name: str, value) -> bool:
    knob = knobs.CATALOGUE.get(name)
    return knob is None or name in SEED_KNOBS or value != knob.default


def trial_seed(trial, seed: int = 0) -> int:
    """A seed that depends on the trial's knobs and the study seed only (stable across processes and across
    catalogue versions: see :data:`SEED_KNOBS`)."""
    kept = [(k, v) for k, v in trial.as_dict().items() if _seeded(k, v)]
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
