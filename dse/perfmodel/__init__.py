"""Analytical performance and memory model of Megatron-style LLM pretraining.

Public API: :func:`predict` (a resolved :class:`dse.rules.trial.TrialConfig` to a :class:`Prediction`),
:func:`predict_layout` (the same on plain values), :func:`flops.model_flops_per_step`,
:data:`hardware.HARDWARE`. Calibrated by ``bench/model_accuracy.py`` (see the docs, docs/performance-model.md).
How the model learns lives here too: ``calibrate`` (a user's runs, ``dse calibrate``) and ``refit`` (a study's runs).
"""

from dse.facts.hardware import HARDWARE, GpuSpec
from dse.perfmodel.flops import model_flops_per_step
from dse.perfmodel.model import Prediction, predict, predict_layout
from dse.perfmodel.timing import DEFAULT_PARAMS, Params

__all__ = [
    "predict",
    "predict_layout",
    "Prediction",
    "model_flops_per_step",
    "HARDWARE",
    "GpuSpec",
    "Params",
    "DEFAULT_PARAMS",
]
