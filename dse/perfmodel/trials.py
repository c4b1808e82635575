"""Building a :class:`dse.trial.TrialConfig` from plain values (``dse predict``, the accuracy bench).

The system is the GPU generation's default cluster (GPUs per node, NVLink domain and NIC bandwidth from
:data:`dse.perfmodel.hardware.HARDWARE`); every knob not given takes its catalogue default.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from dse import knobs
from dse.errors import UserError
from dse.perfmodel.hardware import HARDWARE
from dse.space import System
from dse.trial import TrialConfig

_SYSTEMS: dict[str, System] = {}


def default_system(gpu: str) -> System:
    """The GPU's default system (cached: System is immutable)."""
    if gpu not in _SYSTEMS:
        hw = HARDWARE[gpu]
        _SYSTEMS[gpu] = System(name=gpu, gpu=gpu, gpus_per_node=hw.gpus_per_node, nvlink_domain=hw.nvlink_domain,
                               scaleout_gbps=hw.scaleout_gbps)
    return _SYSTEMS[gpu]


def make_trial(recipe, gpu: str, num_gpus: int, *, system: System | None = None, **values: Any) -> TrialConfig:
    """A trial of ``recipe`` on ``num_gpus`` GPUs of ``gpu`` with the given knob values.

    ``num_gpus`` must be a multiple of the system's GPUs per node (a :class:`UserError` otherwise).
    """
    system = system or default_system(gpu)
    if num_gpus % system.gpus_per_node:
        raise UserError(f"{num_gpus} is not a multiple of the {system.gpus_per_node} GPUs per node of {gpu}",
                        field="num_gpus")
    out = {name: k.default for name, k in knobs.CATALOGUE.items()}
    out["seq_length"] = recipe.seq_length
    out.update(values)
    out["num_nodes"] = num_gpus // system.gpus_per_node
    return TrialConfig(recipe=recipe, system=system, values=MappingProxyType(out), env=MappingProxyType({}),
                       varied=())
