"""B300's Llama defaults are Megatron-Bridge's B300 presets and are predicted to fit; FP8 weights on Blackwell hold
no transpose; the V1 405B preset's eight micro-batches all go through the warm-up (why the recipe takes V2)."""

from __future__ import annotations

import pytest

from dse.perfmodel import predict_layout
from dse.perfmodel.memory import inflight_chunks, resident_weight_bytes, state_bytes_per_param
from dse.recipes.models import LAYOUT_FIELDS, RECIPES

# the world size each preset names (llama3_workload_base_configs.py: 8 and 64; llama31_...: 128 for V1, 256 for V2)
PRESET_GPUS = {"llama3_8b": (8,), "llama3_70b": (64,), "llama3_405b": (128, 256)}
MODEL_FIELDS = tuple(f for f in LAYOUT_FIELDS if not f.startswith(("moe_", "ep", "etp", "pp_")))


def _predict(model: str, precision: str, num_gpus: int, **over):
    r = RECIPES[model]
    lay = r.default_layout("b300", precision)
    kw = {k: getattr(lay, k) for k in MODEL_FIELDS} | over
    return predict_layout(r.arch, "b300", num_gpus=num_gpus, seq_length=r.seq_length, precision=precision, **kw)


@pytest.mark.parametrize("model", sorted(PRESET_GPUS))
@pytest.mark.parametrize("precision", ["bf16", "fp8", "nvfp4"])
def test_b300_default_layouts_fit(model: str, precision: str) -> None:
    for num_gpus in PRESET_GPUS[model]:
        pred = _predict(model, precision, num_gpus)
        assert pred.fits, (model, precision, num_gpus, pred.peak_memory_gib)


def test_405b_b300_defaults_are_bridges_128_gpu_recipes() -> None:
    r = RECIPES["llama3_405b"]
    fields = ("tp", "pp", "cp", "vp", "mbs", "gbs", "fsdp", "cpu_offload_layers")
    layouts = {p: tuple(getattr(r.default_layout("b300", p), f) for f in fields) for p in ("bf16", "fp8", "nvfp4")}
    assert layouts["bf16"] == (2, 1, 1, 1, 1, 768, True, 40)
    assert layouts["fp8"] == layouts["nvfp4"] == (4, 8, 1, 4, 1, 768, False, 0)


def test_v1_405b_preset_runs_every_microbatch_in_warmup_and_does_not_fit() -> None:
    # TP 2, PP 8, VP 8, GBS 64 on 128 GPUs: DP 8, so 8 micro-batches; Megatron-Core's warm-up on the first stage,
    # 2(p-1) + (v-1)p = 70, exceeds m·v = 64: the first stage holds all 64 chunk micro-batches at its peak
    assert sum(inflight_chunks(8, 8, 8, 0)) == 64
    pred = _predict("llama3_405b", "fp8", 128, tp=2, pp=8, vp=8, gbs=64)
    assert not pred.fits
    assert pred.peak_memory_gib > 300


def test_fp8_weights_hold_no_transpose_on_blackwell() -> None:
    assert resident_weight_bytes(True, "tensorwise", non_tn_fp8_gemm=True) == 1.0
    assert resident_weight_bytes(True, "delayed", non_tn_fp8_gemm=True) == 1.0
    assert resident_weight_bytes(True, "tensorwise", non_tn_fp8_gemm=False) == 2.0  # Hopper: data + transpose
    assert resident_weight_bytes(True, "mxfp8", non_tn_fp8_gemm=True) == 2.0  # row-wise and column-wise copies
    assert resident_weight_bytes(False, "tensorwise", non_tn_fp8_gemm=True) == 2.0  # bf16 weights
    assert state_bytes_per_param(8, grad_bytes=2, resident_weight_bytes=1) == pytest.approx(1 + 2 + 12 / 8)


def test_blackwell_fp8_states_are_a_byte_per_parameter_below_hopper_accounting() -> None:
    # the same FP8 layout: the states on B300 (no transpose) against MXFP8 on B300 (two copies) differ by one byte
    # per local parameter, and the peak moves down with them
    kw = {"tp": 4, "pp": 8, "vp": 4, "gbs": 1536}
    cs = _predict("llama3_405b", "fp8", 256, fp8_recipe="tensorwise", **kw)
    mx = _predict("llama3_405b", "fp8", 256, fp8_recipe="mxfp8", **kw)
    states_cs, states_mx = cs.breakdown["mem.states_gib"], mx.breakdown["mem.states_gib"]
    assert states_cs < states_mx and cs.peak_memory_gib < mx.peak_memory_gib
    params_gib = states_mx - states_cs
    assert params_gib == pytest.approx(405e9 / 32 / 2**30, rel=0.1)  # one byte per parameter of the stage
