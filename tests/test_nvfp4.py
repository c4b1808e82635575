"""Precision nvfp4 end to end: its spelling per payload, its rules, the model's NVFP4 terms, the shipped spaces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dse.facts import knobs
from dse.facts.hardware import HARDWARE, gpus_where
from dse.perfmodel import predict_layout
from dse.perfmodel.model import fp8_quant_bytes, nvfp4_quant_bytes
from dse.recipes.models import RECIPES
from dse.rules import constraints
from dse.rules.space import load_space
from tests.test_constraints import make

ROOT = Path(__file__).resolve().parents[1]
NVFP4_SPACES = (
    "llama3_70b_gb300_nvfp4_space.toml",
    "llama3_405b_gb300_nvfp4_space.toml",
    "llama3_70b_b300_nvfp4_space.toml",
    "llama3_405b_b300_nvfp4_space.toml",
)


def test_mbridge_spells_bridges_nvfp4_recipe_and_ignores_the_fp8_recipe():
    for recipe in ("tensorwise", "mxfp8"):
        got = knobs.overrides({"precision": "nvfp4", "fp8_recipe": recipe}, "mbridge")
        assert got == ["mixed_precision=bf16_with_nvfp4_mixed"]


def test_sim_payload_spells_megatron_cores_fp4_fields():
    got = knobs.overrides({"precision": "nvfp4", "fp8_recipe": "delayed"}, "sim")
    assert "trainer.plugins.fp4=e2m1" in got and "trainer.plugins.fp4_recipe=nvfp4" in got
    assert not any("fp8=" in o or "fp8_recipe=" in o for o in got)


def test_only_blackwell_gpus_with_an_fp4_peak_run_nvfp4():
    assert set(gpus_where("nvfp4")) == {"b200", "b300", "gb200", "gb300"}
    assert all(HARDWARE[g].fp4_tflops for g in gpus_where("nvfp4"))


@pytest.mark.parametrize("payload, ok", [("mbridge", True), ("sim", True), ("nemo2", False), ("mcore", False)])
def test_nvfp4_runs_on_bridge_and_sim_only(payload, ok):
    rejection = constraints.check(make(gpu="gb300", precision="nvfp4", payload=payload))
    assert (rejection is None) == ok, rejection
    if not ok:
        assert rejection.rule == "nvfp4_payload" and "mbridge" in rejection.reason


def test_nvfp4_on_hopper_is_refused_by_name():
    rejection = constraints.check(make(gpu="h200", precision="nvfp4", payload="mbridge"))
    assert rejection.rule == "nvfp4_needs_blackwell" and "h200" in rejection.reason


def test_nvfp4_needs_aligned_widths_over_tp():
    # Llama 3 8B's 14,336-wide MLP over tp=8 is 1,792 = 56 x 32: aligned; a 14,344-wide one is not
    t = make(recipe="llama3_8b", gpu="b200", precision="nvfp4", tp=8, pp=1)
    assert constraints.nvfp4_dims_aligned(t) is None
    recipe = replace(t.recipe, arch=replace(t.recipe.arch, ffn_hidden_size=14344))
    broken = constraints.nvfp4_dims_aligned(replace(t, recipe=recipe))
    assert broken is not None and "ffn_hidden_size / tp=1793" in broken.reason


LARGE = dict(num_gpus=64, tp=1, pp=4, vp=5, mbs=1, gbs=256, seq_length=8192)


def test_nvfp4_beats_fp8_on_gb300_for_a_gemm_bound_layout():
    arch = RECIPES["llama3_70b"].arch
    fp8 = predict_layout(arch, "gb300", precision="fp8", fp8_recipe="mxfp8", **LARGE)
    fp4 = predict_layout(arch, "gb300", precision="nvfp4", **LARGE)
    assert fp4.tokens_per_s_per_gpu > 1.2 * fp8.tokens_per_s_per_gpu
    assert fp4.breakdown["time.layer_compute_s"] < fp8.breakdown["time.layer_compute_s"]
    # bf16 weights (no FP4 parameter gather) and Transformer Engine's row-wise and column-wise NVFP4 copies of them
    bf16 = predict_layout(arch, "gb300", precision="bf16", **LARGE)
    assert fp4.breakdown["mem.states_gib"] == pytest.approx(bf16.breakdown["mem.states_gib"], rel=0.3)
    assert fp4.breakdown["mem.fp8_weight_cache_gib"] > 0 == bf16.breakdown["mem.fp8_weight_cache_gib"]


def test_nvfp4_prices_more_quantisation_traffic_than_fp8():
    # two quantised copies (row-wise, and column-wise through the Hadamard transform), each behind an amax pass
    assert nvfp4_quant_bytes() > fp8_quant_bytes("tensorwise") > fp8_quant_bytes("delayed")
    # MXFP8's second (column-wise) copy costs more than one per-tensor copy cast in one pass
    assert nvfp4_quant_bytes() > fp8_quant_bytes("mxfp8") > fp8_quant_bytes("delayed")


def test_current_scaling_reads_each_input_once_more_than_delayed_scaling():
    # Float8CurrentScalingQuantizer: an amax pass over the bf16 input (2 B) before the cast; delayed scaling casts
    # with last step's scale and records the amax in the same pass; block scaling scales each block in-kernel
    assert fp8_quant_bytes("tensorwise") - fp8_quant_bytes("delayed") == 2.0
    assert fp8_quant_bytes("blockwise") == fp8_quant_bytes("delayed")


@pytest.mark.parametrize("name", NVFP4_SPACES)
def test_shipped_nvfp4_spaces_load_and_offer_nvfp4_and_fp8(name):
    space = load_space(ROOT / "conf" / "spaces" / name)
    assert set(space.knobs["precision"]) == {"fp8", "nvfp4"}
    assert "cpu_offload_layers" in space.knobs
    assert space.backend.payload == "mbridge"


def test_sim_payload_accepts_its_nvfp4_overrides():
    from dse.recipes.sim.__main__ import _DEFAULT_CONFIG, apply_overrides

    config = apply_overrides(_DEFAULT_CONFIG, knobs.overrides({"precision": "nvfp4"}, "sim"))
    plugins = config["trainer"]["plugins"]
    assert (plugins["fp4"], plugins["fp4_recipe"], plugins["fp8"]) == ("e2m1", "nvfp4", None)


def test_nvfp4_launches_with_transformer_engines_fast_math_as_nvidias_presets_do():
    from dse.launch import perf_env

    assert perf_env(make(gpu="gb300", precision="nvfp4", payload="mbridge"))["NVTE_USE_FAST_MATH"] == "1"
    assert "NVTE_USE_FAST_MATH" not in perf_env(make(gpu="gb300", precision="fp8", payload="mbridge"))


def test_mfu_of_an_nvfp4_run_is_against_the_fp4_peak():
    from dse.study.leaderboard import mfu

    assert mfu(3000.0, "gb300", "nvfp4") == pytest.approx(3000.0 / 15000.0)
    assert mfu(3000.0, "gb300", "fp8") == pytest.approx(3000.0 / 5000.0)


def test_tp_comm_overlap_left_to_auto_is_off_under_nvfp4():
    from dse.rules.trial import resolve_auto

    recipe = RECIPES["llama3_405b"]
    system = make(gpu="gb300").system
    on = resolve_auto(dict(tp=4, sp=None, precision="fp8", tp_comm_overlap=None), recipe, system)
    off = resolve_auto(dict(tp=4, sp=None, precision="nvfp4", tp_comm_overlap=None), recipe, system)
    assert (on["tp_comm_overlap"], off["tp_comm_overlap"]) == (True, False)


def test_recipes_default_to_nvidias_nvfp4_layouts():
    from dse.recipes.models import Layout

    assert RECIPES["llama3_70b"].default_layout("gb300", "nvfp4") == Layout(1, 4, 1, 5, 1, 256)
    assert RECIPES["llama3_405b"].default_layout("gb300", "nvfp4") == Layout(4, 8, 1, 4, 1, 1536)
    assert RECIPES["llama3_70b"].default_layout("gb200", "nvfp4").tp == 2
