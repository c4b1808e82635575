"""The performance model against the published closed forms it is built on, and its OOM classification."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from dse.facts.hardware import GPU_NAMES as GPU_GENERATIONS
from dse.perfmodel import HARDWARE, model_flops_per_step, predict, predict_layout
from dse.perfmodel.fit import fit, nelder_mead
from dse.perfmodel.memory import inflight_chunks, layer_activation_bytes, state_bytes_per_param
from dse.perfmodel.timing import DEFAULT_PARAMS, bubble_fraction
from dse.perfmodel.trials import make_trial
from dse.recipes.models import RECIPES

CALIBRATION = Path(__file__).resolve().parent.parent / "bench" / "data" / "published_perf_calibration.tsv"

# The architecture table of shared/reference/README.md, typed in again (layers, hidden, heads, groups,
# FFN, vocab, gated), so that the FLOPs check does not read the numbers it checks from the registry.
REFERENCE_ARCHS = {
    "llama3_8b": (32, 4096, 32, 8, 14336, 128256, True),
    "llama3_70b": (80, 8192, 64, 8, 28672, 128256, True),
    "llama3_405b": (126, 16384, 128, 8, 53248, 128256, True),
    "nemotron3_8b": (32, 4096, 32, 32, 16384, 256000, False),
    "nemotron4_15b": (32, 6144, 48, 8, 24576, 256000, False),
    "nemotron4_340b": (96, 18432, 96, 8, 73728, 256000, False),
}


def reference_flops(name: str, B: int, s: int, convention: str) -> int:
    """FLOPs/step = 6·B·s·[ L·( e·h·F + 2·h·a·d + 2·h·g·d + c·a·d·s ) + h·V ], in exact integers."""
    L, h, a, g, F, V, gated = REFERENCE_ARCHS[name]
    d = h // a
    e = 3 if gated else 2
    c = 1 if convention == "causal" else 2
    return 6 * B * s * (L * (e * h * F + 2 * h * a * d + 2 * h * g * d + c * a * d * s) + h * V)


@pytest.mark.parametrize("name", sorted(REFERENCE_ARCHS))
@pytest.mark.parametrize("convention", ["causal", "noncausal"])
def test_flops_match_the_reference_formula(name, convention):
    for B, s in ((128, 8192), (32, 4096), (1, 2048)):
        got = model_flops_per_step(RECIPES[name].arch, B, s, convention)
        assert got == pytest.approx(reference_flops(name, B, s, convention), rel=1e-12)


def test_noncausal_counts_the_attention_products_in_full():
    arch = RECIPES["llama3_70b"].arch
    diff = model_flops_per_step(arch, 8, 8192, "noncausal") - model_flops_per_step(arch, 8, 8192, "causal")
    assert diff == pytest.approx(6 * 8 * 8192 * 80 * 64 * 128 * 8192)


def test_unknown_convention_is_refused():
    with pytest.raises(ValueError, match="convention"):
        model_flops_per_step(RECIPES["llama3_8b"].arch, 1, 1024, "sparse")


# ---- pipeline bubble (Narayanan et al. 2021) -------------------------------------------------------


@pytest.mark.parametrize("p,m,v", [(2, 8, 1), (8, 64, 1), (4, 16, 2), (8, 64, 5), (16, 384, 4)])
def test_bubble_closed_forms(p, m, v):
    assert bubble_fraction(p, m, v) == pytest.approx((p - 1) / (v * m))
    if v == 1:
        assert bubble_fraction(p, m) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("pp,vp", [(4, 1), (8, 1), (4, 5), (8, 5)])
def test_predicted_bubble_is_the_closed_form_of_the_microbatch_time(pp, vp):
    t = make_trial(RECIPES["llama3_70b"], "h100", 64, tp=4, pp=pp, vp=vp, gbs=128, precision="fp8")
    b = predict(t).breakdown
    m = 128 / (1 * 64 / (4 * pp))
    assert b["microbatches"] == m
    assert b["bubble_fraction"] == pytest.approx((pp - 1) / (vp * m))
    assert b["time.bubble_s"] == pytest.approx((pp - 1) / vp * b["time.per_microbatch_s"])


@pytest.mark.parametrize(
    "kw",
    [
        dict(tp=4, pp=8, vp=5, gbs=64, precision="fp8"),
        dict(tp=2, pp=1, cp=2, gbs=32, fsdp=True, recompute="full", seq_length=16384),
        dict(tp=1, pp=1, gbs=16, cpu_offload_layers=20, precision="bf16"),
    ],
)
def test_step_time_is_the_sum_of_its_terms_and_the_breakdown_is_typed(kw):
    """The typed breakdown (time and memory terms) is also the flat mapping that ``dse predict`` prints, in its
    order; the step time is every micro-batch slot plus the per-step terms, the peak memory the memory part's."""
    from dse.perfmodel.model import BREAKDOWN_KEYS, Breakdown

    p = predict(make_trial(RECIPES["llama3_70b"], "b200", 64, **kw))
    b = p.breakdown
    assert isinstance(b, Breakdown)
    assert list(b) == [key for key, _, _ in BREAKDOWN_KEYS] == list(p.as_dict()["breakdown"])
    assert b["time.bubble_s"] == b.time.bubble_s and b["mem.logits_gib"] == b.memory.logits_gib
    assert b["microbatches"] == b.time.microbatches and "time.nothing_s" not in b
    t = b.time
    assert (
        p.step_time_s
        == t.step_s
        == pytest.approx(
            t.microbatches * t.per_microbatch_s
            + t.bubble_s
            + t.pp_p2p_s
            + t.dp_exposed_s
            + t.optimizer_s
            + t.grad_accumulation_s
            + t.overhead_s,
            rel=1e-15,
        )
    )
    assert p.peak_memory_gib == b.memory.peak_gib and p.fits == (b.memory.peak_gib <= p.gpu_memory_gib)


def test_interleaving_shrinks_the_bubble_of_the_step():
    base = dict(tp=4, pp=8, gbs=64, precision="fp8")
    one = predict(make_trial(RECIPES["llama3_70b"], "h100", 64, vp=1, **base))
    five = predict(make_trial(RECIPES["llama3_70b"], "h100", 64, vp=5, **base))
    assert five.breakdown["time.bubble_s"] < one.breakdown["time.bubble_s"] / 4
    assert five.step_time_s < one.step_time_s


# ---- activation memory (Korthikanti et al. 2022) ---------------------------------------------------

S, B, H, A = 2048, 1, 12288, 96  # GPT-3 175B, as in the paper


def test_activations_without_parallelism():
    assert layer_activation_bytes(S, B, H, A, 1, sp=False) == pytest.approx(S * B * H * (34 + 5 * A * S / H))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activations_with_tensor_and_sequence_parallelism(t):
    got = layer_activation_bytes(S, B, H, A, t, sp=True)
    assert got == pytest.approx(S * B * H * (34 + 5 * A * S / H) / t)


@pytest.mark.parametrize("t", [2, 8])
def test_activations_with_tensor_parallelism_only(t):
    got = layer_activation_bytes(S, B, H, A, t, sp=False)
    assert got == pytest.approx(S * B * H * (10 + 24 / t + 5 * A * S / (H * t)))


@pytest.mark.parametrize("t", [1, 8])
def test_activations_with_selective_recompute(t):
    assert layer_activation_bytes(S, B, H, A, t, sp=True, recompute="selective") == pytest.approx(34 * S * B * H / t)


def test_activations_with_full_recompute():
    assert layer_activation_bytes(S, B, H, A, 1, recompute="full") == pytest.approx(2 * S * B * H)


@pytest.mark.parametrize("p,v", [(4, 1), (8, 1), (4, 2), (8, 5), (16, 4)])
def test_first_stage_holds_korthikantis_layer_count(p, v):
    L = 16 * p * v
    counts = inflight_chunks(p, v, m=1024, rank=0)
    layers = sum(counts) * L / (p * v)
    assert layers == pytest.approx(L * (1 + (p - 1) / (p * v)) if v > 1 else L)


def test_few_microbatches_cap_the_inflight_count():
    assert inflight_chunks(8, 1, m=3) == [3]
    assert sum(inflight_chunks(8, 4, m=2)) == 8  # every chunk of both micro-batches


@pytest.mark.parametrize("d", [1, 2, 8, 64, 1024])
def test_distributed_optimizer_bytes_per_parameter(d):
    assert state_bytes_per_param(d) == pytest.approx(6 + 12 / d)
    assert state_bytes_per_param(d, fsdp=True) == pytest.approx(18 / d)


# ---- OOM classification ----------------------------------------------------------------------------


def calibration_rows():
    with open(CALIBRATION, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def row_trial(r, **override):
    knobs = dict(
        tp=int(r["tp"]),
        pp=int(r["pp"]),
        cp=int(r["cp"]),
        vp=int(r["vp"]),
        mbs=int(r["mbs"]),
        gbs=int(r["gbs"]),
        seq_length=int(r["seq_length"]),
        precision=r["precision"],
        fsdp=r["fsdp"] == "1",
        tp_comm_overlap=int(r["tp"]) > 1,
        cpu_offload_layers=int(r.get("cpu_offload_layers") or 0),
    )
    knobs.update(override)
    return make_trial(RECIPES[r["model"]], r["gpu"], int(r["num_gpus"]), **knobs)


def test_405b_without_model_parallelism_does_not_fit_on_h100():
    t = make_trial(RECIPES["llama3_405b"], "h100", 1024, tp=1, pp=1, cp=1, vp=1, mbs=1, gbs=512, precision="fp8")
    p = predict(t)
    assert not p.fits
    assert p.peak_memory_gib > 80


# Every calibration row, the GB200 70B FSDP row with its 40 offloaded layers included (cpu_offload_layers column).
@pytest.mark.parametrize("row", calibration_rows(), ids=lambda r: r["id"])
def test_published_layouts_fit(row):
    p = predict(row_trial(row))
    assert p.fits, f"{p.peak_memory_gib:.1f} GiB > {p.gpu_memory_gib} GiB"


def test_logits_and_the_backward_working_layer_do_not_add_up():
    """The last stage peaks at the larger of the logits (end of the forward pass) and the first layer
    backward's working set, not at their sum: a vocabulary too small to matter leaves the peak unchanged."""
    from dataclasses import replace

    arch = RECIPES["llama3_8b"].arch
    kw = dict(num_gpus=8, tp=1, pp=1, mbs=2, gbs=128, seq_length=8192, precision="fp8")
    big = predict_layout(arch, "b200", **kw).breakdown
    small_vocab = replace(arch, vocab_size=1024)
    small = predict_layout(small_vocab, "b200", **kw).breakdown
    # 128k vocabulary: the logits (3.9 GiB at 2 bytes each) exceed one layer's activations and set the peak
    assert big["mem.logits_gib"] > big["mem.activations_gib"] / arch.num_layers
    assert small["mem.logits_gib"] < small["mem.activations_gib"] / arch.num_layers


def test_fsdp_buffers_double_buffer_two_layers_and_one_unfused_weight_gradient():
    from dse.perfmodel.memory import fsdp_buffer_bytes

    assert fsdp_buffer_bytes(100.0, 30.0, 1.0, 2.0) == pytest.approx(2 * 100 * 3 + 2 * 30)
    arch = RECIPES["llama3_70b"].arch
    kw = dict(num_gpus=64, tp=1, pp=1, mbs=1, gbs=128, seq_length=8192, fsdp=True)
    fp8 = predict_layout(arch, "gb200", precision="fp8", **kw).breakdown["mem.fsdp_buffers_gib"]
    bf16 = predict_layout(arch, "gb200", precision="bf16", **kw).breakdown["mem.fsdp_buffers_gib"]
    assert fp8 < bf16  # FP8 weights are gathered in one byte and gradients reduced in bf16


def test_offload_memory_follows_the_closed_form():
    """Offloading n of the L layers keeps L - n + 1 layers' activations (one in the double buffer) plus the
    backward working layer: each offloaded layer frees exactly one layer's activations, less one buffer."""
    kw = dict(tp=1, pp=1, mbs=2, gbs=256, precision="fp8", fsdp=True)
    arch = RECIPES["llama3_70b"].arch
    act = (
        layer_activation_bytes(
            8192,
            2,
            arch.hidden_size,
            arch.num_attention_heads,
            1,
            sp=False,
            g=arch.num_query_groups,
            ffn=arch.ffn_hidden_size,
            gated=True,
            flash_attention=True,
            dropout=False,
            fp8=True,
        )
        / 2**30
        * (1 + DEFAULT_PARAMS.memory_fragmentation)
    )
    peak = {
        n: predict(make_trial(RECIPES["llama3_70b"], "gb200", 64, cpu_offload_layers=n, **kw)).peak_memory_gib
        for n in (0, 1, 40, 79)
    }
    assert peak[0] - peak[1] == pytest.approx(0.0, abs=1e-6)  # one layer out, one layer in the buffer
    assert peak[0] - peak[40] == pytest.approx(39 * act, rel=1e-6)
    assert peak[0] - peak[79] == pytest.approx(78 * act, rel=1e-6)


def test_offload_costs_time_on_a_slow_link_and_more_with_more_layers():
    kw = dict(tp=1, pp=1, mbs=2, gbs=256, precision="fp8", fsdp=True)
    arch = RECIPES["llama3_70b"].arch
    step = {
        (gpu, n): predict_layout(arch, gpu, num_gpus=64, seq_length=8192, cpu_offload_layers=n, **kw).step_time_s
        for gpu in ("b200", "gb200")
        for n in (0, 20, 40)
    }
    # PCIe Gen5 (B200) is slower than NVLink-C2C (GB200): offload costs more there, and more with more layers
    assert step["b200", 0] < step["b200", 20] < step["b200", 40]
    assert step["gb200", 0] <= step["gb200", 20] <= step["gb200", 40]
    assert step["b200", 40] - step["b200", 0] > step["gb200", 40] - step["gb200", 0]
    fast = DEFAULT_PARAMS.with_values(host_link_eff=100.0)  # a link fast enough to hide behind compute
    assert predict_layout(
        arch, "b200", num_gpus=64, seq_length=8192, cpu_offload_layers=40, params=fast, **kw
    ).step_time_s == pytest.approx(step["b200", 0])


def test_recompute_trades_memory_for_time():
    r = next(x for x in calibration_rows() if x["id"] == "mb2511_h100_70b")
    runs = {rc: predict(row_trial(r, recompute=rc)) for rc in ("none", "selective", "full")}
    assert runs["full"].peak_memory_gib < runs["selective"].peak_memory_gib <= runs["none"].peak_memory_gib
    assert runs["none"].step_time_s < runs["selective"].step_time_s < runs["full"].step_time_s


# ---- time behaviour --------------------------------------------------------------------------------


def test_tokens_and_tflops_follow_from_the_step_time():
    t = make_trial(RECIPES["llama3_8b"], "h100", 8, mbs=1, gbs=128, precision="fp8")
    p = predict(t, flops_convention="noncausal")
    assert p.tokens_per_s_per_gpu == pytest.approx(128 * 8192 / (p.step_time_s * 8))
    flops = model_flops_per_step(t.arch, 128, 8192, "noncausal")
    assert p.tflops_per_gpu == pytest.approx(flops / (p.step_time_s * 8) / 1e12)
    assert predict(t).tokens_per_s_per_gpu == pytest.approx(p.tokens_per_s_per_gpu)  # convention-free


def test_fp8_speeds_up_gemms_and_newer_gpus_are_faster():
    arch = RECIPES["llama3_70b"].arch
    kw = dict(num_gpus=64, tp=4, pp=4, vp=5, gbs=128, seq_length=8192, tp_comm_overlap=True)
    bf16 = predict_layout(arch, "h100", precision="bf16", **kw)
    fp8 = predict_layout(arch, "h100", precision="fp8", **kw)
    assert 1.1 < bf16.step_time_s / fp8.step_time_s < 2.0  # GEMMs only: never the full 2x of the peaks
    b200 = predict_layout(arch, "b200", precision="fp8", **kw)
    assert b200.step_time_s < fp8.step_time_s


def test_gpt3_175b_on_a100_is_in_the_published_range():
    """Korthikanti et al. 2022: 175B on 64 A100s, sp + selective recompute, ~51% of peak in model FLOPs."""
    from dse.recipes.models import ModelArch, Recipe

    arch = ModelArch("gpt3_175b", 96, 12288, 96, 96, 4 * 12288, 51200, False)
    t = make_trial(Recipe("gpt3_175b", arch, "", None, 2048, 64), "a100", 64, tp=8, pp=8, gbs=64, recompute="selective")
    p = predict(t, flops_convention="noncausal")
    assert 0.40 * 312 < p.tflops_per_gpu < 0.65 * 312


def test_invalid_points_do_not_raise():
    t = make_trial(RECIPES["llama3_70b"], "h100", 64, tp=3, pp=7, cp=3, vp=3, gbs=100, mbs=3)
    p = predict(t)
    assert p.step_time_s > 0 and math.isfinite(p.peak_memory_gib)


def test_every_gpu_generation_has_a_spec():
    assert set(GPU_GENERATIONS) <= set(HARDWARE)
    for spec in HARDWARE.values():
        assert spec.peak_tflops("fp8") >= spec.bf16_tflops


# ---- fitting ---------------------------------------------------------------------------------------


def test_nelder_mead_finds_a_quadratic_minimum():
    target = np.array([1.0, -2.0, 0.5])
    x = nelder_mead(lambda z: float(np.sum((z - target) ** 2)), np.zeros(3), iters=2000, tol=1e-14)
    assert x == pytest.approx(target, abs=1e-4)


def test_fit_recovers_parameters_that_generated_the_data():
    truth = DEFAULT_PARAMS.with_values(gemm_eff_fp8=0.50, attn_eff=0.45)
    rows = [
        (row_trial(r), predict(row_trial(r), params=truth).tokens_per_s_per_gpu)
        for r in calibration_rows()
        if r["gpu"] == "h100"
    ]

    def tokens(t, params):
        return predict(t, params=params).tokens_per_s_per_gpu

    got = fit(tokens, rows, names=("gemm_eff_fp8", "attn_eff"), obs_sigma=0.001)
    assert got.gemm_eff_fp8 == pytest.approx(0.50, rel=0.03)
    assert got.attn_eff == pytest.approx(0.45, rel=0.05)


def test_fit_finds_a_threshold_parameter_whose_loss_is_flat_at_its_prior():
    """The Grace host's time per layer acts only past the layers' GPU time, so at its prior's centre (3 ms) the
    loss does not move with it; the fit's coordinate pass over the prior's range still finds the value that made
    the data (GB200 layouts with 6-10 ms layers, one with longer layers that it must leave alone)."""
    truth = DEFAULT_PARAMS.with_values(host_layer_s_grace=0.012)
    arch = RECIPES["llama3_70b"].arch
    layouts = [
        dict(num_gpus=64, tp=2, pp=4, cp=2, vp=5, mbs=1, gbs=128),
        dict(num_gpus=64, tp=4, pp=4, vp=5, mbs=1, gbs=128),
        dict(num_gpus=64, tp=1, pp=1, mbs=2, gbs=256, fsdp=True, cpu_offload_layers=40),
    ]
    rows = [
        (kw, predict_layout(arch, "gb200", seq_length=8192, precision="fp8", params=truth, **kw).tokens_per_s_per_gpu)
        for kw in layouts
    ]

    def tokens(kw, params):
        return predict_layout(arch, "gb200", seq_length=8192, precision="fp8", params=params, **kw).tokens_per_s_per_gpu

    assert tokens(layouts[0], DEFAULT_PARAMS.with_values(host_layer_s_grace=0.003)) == tokens(
        layouts[0], DEFAULT_PARAMS.with_values(host_layer_s_grace=0.004)
    )  # flat at the prior
    got = fit(tokens, rows, names=("host_layer_s_grace",), obs_sigma=0.001)
    assert got.host_layer_s_grace == pytest.approx(0.012, rel=0.02)


def test_unfused_attention_stores_korthikantis_scores_and_costs_time_growing_with_s():
    """attention_backend=local (Megatron's own, softmax in fp32 step by step): 6as²b/t of scores come back into the
    activations (the fp32 softmax output and the bf16 probabilities); unfused (TE's, one fused softmax kernel, no
    attention dropout) keeps 2as²b/t; the s×s scores through HBM make the step slower, by more at longer sequences,
    and the local spec's separate fp32 passes slower than TE's fused kernel; auto/flash/fused agree."""
    arch = RECIPES["llama3_8b"].arch
    kw = dict(num_gpus=8, tp=2, gbs=32, mbs=1)
    slow = {}
    for s in (2048, 8192):
        runs = {
            b: predict_layout(arch, "h100", seq_length=s, attention_backend=b, **kw)
            for b in ("auto", "flash", "fused", "unfused", "local")
        }
        assert runs["auto"].step_time_s == runs["flash"].step_time_s == runs["fused"].step_time_s
        assert runs["local"].step_time_s > runs["unfused"].step_time_s > runs["auto"].step_time_s
        for backend, per_score in (("local", 6), ("unfused", 2)):
            extra = runs[backend].breakdown["mem.activations_gib"] - runs["auto"].breakdown["mem.activations_gib"]
            scores = per_score * arch.num_attention_heads * s * s * 1 / 2  # per layer, b = 1, t = 2
            assert extra * 2**30 >= arch.num_layers * scores  # every in-flight layer (plus the working one) holds them
        assert runs["unfused"].peak_memory_gib < runs["local"].peak_memory_gib
        slow[s] = runs["unfused"].step_time_s / runs["auto"].step_time_s
    assert slow[8192] > slow[2048]


def test_the_local_specs_eager_kernels_cost_hbm_time_per_layer_and_grow_with_gqa_and_swiglu():
    """The local layer spec runs RoPE, SwiGLU and the K/V repeat as eager PyTorch ops: the layer's element-wise term
    is the unfused one's plus those bytes per token at the same element-wise rate, and no other term moves; an MHA
    model with GeLU has fewer of them per hidden element than a GQA SwiGLU one."""
    from dse.perfmodel.layout import ModelLayout, machine_for
    from dse.perfmodel.model import Prepared, elementwise_time, local_spec_bytes
    from dse.perfmodel.stack import NVIDIA_RECIPES

    def prepared(arch, backend):
        layout = ModelLayout(num_gpus=8, tp=2, gbs=32, mbs=1, seq_length=2048, attention_backend=backend)
        return Prepared.of(arch, "h100", layout, NVIDIA_RECIPES)

    llama = RECIPES["llama3_8b"].arch
    local, unfused = prepared(llama, "local"), prepared(llama, "unfused")
    machine = machine_for(local.hw, DEFAULT_PARAMS, local.layout)
    got = elementwise_time(local.shape, local.layout, machine, NVIDIA_RECIPES)
    base = elementwise_time(unfused.shape, unfused.layout, machine, NVIDIA_RECIPES)
    extra = local.shape.tokens * local_spec_bytes(local.shape) * DEFAULT_PARAMS.elementwise_scale / machine.hbm_Bps
    assert got > base and got - base == pytest.approx(extra)
    mha = llama.__class__(**{**llama.__dict__, "num_query_groups": llama.num_attention_heads, "gated_mlp": False})
    assert local_spec_bytes(prepared(mha, "local").shape) < local_spec_bytes(local.shape)


def test_selective_recompute_drops_the_unfused_scores():
    r = next(x for x in calibration_rows() if x["id"] == "mb2511_h100_70b")
    fused, unfused = (predict(row_trial(r, recompute="selective", attention_backend=b)) for b in ("auto", "unfused"))
    assert unfused.step_time_s > fused.step_time_s
    # only the working layer's scores remain: far less than the in-flight layers' activations
    assert unfused.peak_memory_gib - fused.peak_memory_gib < 0.5 * fused.breakdown["mem.activations_gib"]


def test_mxfp8_quantisation_costs_more_than_per_tensor_scaling_and_nothing_in_bf16():
    arch = RECIPES["llama3_8b"].arch
    kw = dict(num_gpus=8, tp=1, pp=1, mbs=1, gbs=128, seq_length=8192)
    fp8 = {r: predict_layout(arch, "b200", precision="fp8", fp8_recipe=r, **kw) for r in ("tensorwise", "mxfp8")}
    assert fp8["mxfp8"].step_time_s > fp8["tensorwise"].step_time_s
    assert fp8["mxfp8"].breakdown["time.layer_compute_s"] > fp8["tensorwise"].breakdown["time.layer_compute_s"]
    bf16 = {
        r: predict_layout(arch, "b200", precision="bf16", fp8_recipe=r, **kw).step_time_s
        for r in ("tensorwise", "mxfp8")
    }
    assert bf16["mxfp8"] == bf16["tensorwise"]


def test_predict_reads_the_trials_fp8_recipe():
    rec = RECIPES["llama3_8b"]
    kw = dict(tp=1, pp=1, cp=1, vp=1, mbs=1, gbs=128, seq_length=8192, precision="fp8")
    t = {r: predict(make_trial(rec, "b200", 8, fp8_recipe=r, **kw)).step_time_s for r in ("tensorwise", "mxfp8")}
    assert t["mxfp8"] > t["tensorwise"]


def test_blackwell_ultra_tensor_ratio_speeds_only_gb300_tensor_work():
    """GB300's sustained tensor-core rate over GB200's (Params.ultra_tensor_ratio) divides GB300's GEMM time and
    leaves GB200's alone; at ratio 1 GB300 is faster only by its special-function units."""
    arch = RECIPES["llama3_8b"].arch
    kw = dict(num_gpus=8, tp=1, pp=1, mbs=2, gbs=128, seq_length=8192, precision="fp8")

    def step(gpu, r):
        return predict_layout(arch, gpu, params=DEFAULT_PARAMS.with_values(ultra_tensor_ratio=r), **kw).step_time_s

    assert step("gb200", 1.0) == step("gb200", 1.3)
    assert step("gb300", 1.3) < step("gb300", 1.0) <= step("gb200", 1.0)
    # no more than the whole step divided by the ratio: only the tensor-core part speeds up
    assert step("gb300", 1.3) > step("gb300", 1.0) / 1.3


def test_mxfp8_gemm_ratio_prices_only_mxfp8_gemms():
    """Params.mxfp8_gemm_ratio scales the FP8 GEMM rate of the mxfp8 recipe; per-tensor recipes and bf16 are
    untouched."""
    arch = RECIPES["llama3_8b"].arch
    kw = dict(num_gpus=8, tp=1, pp=1, mbs=2, gbs=128, seq_length=8192)

    def step(r, **k):
        return predict_layout(
            arch, "b200", params=DEFAULT_PARAMS.with_values(mxfp8_gemm_ratio=r), **kw, **k
        ).step_time_s

    assert step(0.8, precision="fp8", fp8_recipe="tensorwise") == step(1.0, precision="fp8", fp8_recipe="tensorwise")
    assert step(0.8, precision="bf16") == step(1.0, precision="bf16")
    assert step(0.8, precision="fp8", fp8_recipe="mxfp8") > step(1.0, precision="fp8", fp8_recipe="mxfp8")


def test_blackwell_ultra_doubled_sfus_cut_only_the_softmax_exponentials(monkeypatch):
    """GB300 and GB200 share dense peaks, HBM bandwidth and NVLink; without data parallelism and with the same
    NIC the step differs only by the softmax exponentials: one per causal score element forward, one backward,
    at each GPU's special-function-unit rate (dse.facts.hardware). Blackwell Ultra's sustained tensor rate is set to
    GB200's here (ultra_tensor_ratio=1), its SM count too (160 against 148: the GEMMs' waves differ), and the Grace
    host's time per layer off (host_layer_s_grace=0: these layers are shorter than it), to isolate the
    exponentials."""
    monkeypatch.setitem(HARDWARE, "gb300", dataclasses.replace(HARDWARE["gb300"], sms=HARDWARE["gb200"].sms))
    arch = RECIPES["llama3_8b"].arch
    kw = dict(
        num_gpus=4,
        tp=4,
        pp=1,
        mbs=1,
        gbs=16,
        seq_length=16384,
        precision="fp8",
        scaleout_gbps=400.0,
        params=DEFAULT_PARAMS.with_values(ultra_tensor_ratio=1.0, host_layer_s_grace=0.0),
    )
    gb200, gb300 = (predict_layout(arch, g, **kw) for g in ("gb200", "gb300"))
    T, s, a = 16384, 16384, arch.num_attention_heads / 4  # heads per GPU at tp=4 (no data parallelism)
    per_layer = T * s * a * (1 / HARDWARE["gb200"].sfu_exp_tera_per_s - 1 / HARDWARE["gb300"].sfu_exp_tera_per_s) / 1e12
    m = 16
    assert HARDWARE["gb300"].sfu_exp_tera_per_s > HARDWARE["gb200"].sfu_exp_tera_per_s
    assert gb200.step_time_s - gb300.step_time_s == pytest.approx(m * arch.num_layers * per_layer, rel=1e-6)
    # Hopper has no SFU figure in the table: its attention efficiency covers the softmax
    assert HARDWARE["h100"].sfu_exp_tera_per_s is None


def test_context_parallel_ring_merges_cost_their_bytes(monkeypatch):
    """cp_merge_bytes: nothing for c = 1, 8(c-1)+4 / 14(c-1)+4 / 8(c-1)+4 bytes per Q, Q and KV element; the step
    time of a CP layout exceeds the same prediction without the merges by exactly those bytes at HBM speed
    (forward, backward, and the forward again under full recompute of the layer)."""
    import dse.perfmodel.model as M

    assert M.cp_merge_bytes(1) == (0.0, 0.0, 0.0)
    assert M.cp_merge_bytes(2) == (12.0, 18.0, 12.0) and M.cp_merge_bytes(5) == (36.0, 60.0, 36.0)
    arch = RECIPES["llama3_8b"].arch
    kw = dict(num_gpus=4, tp=2, pp=1, cp=2, mbs=1, gbs=8, seq_length=16384, precision="bf16")
    with_merge = predict_layout(arch, "h100", **kw)
    rec = predict_layout(arch, "h100", recompute="full", **kw)
    monkeypatch.setattr(M, "cp_merge_bytes", lambda c: (0.0, 0.0, 0.0))
    without = predict_layout(arch, "h100", **kw)
    rec_without = predict_layout(arch, "h100", recompute="full", **kw)
    m, T, t, d = 8, 16384 / 2, 2, arch.head_dim  # micro-batches (dp = 1), tokens per micro-batch per GPU
    q = T * arch.num_attention_heads / t * d
    kv = T * 2 * max(arch.num_query_groups / t, 1) * d
    scale = DEFAULT_PARAMS.elementwise_scale / (HARDWARE["h100"].hbm_gbps * 1e9)
    fwd, bwd = q * 12.0 * scale, (q * 18.0 + kv * 12.0) * scale
    per_step = m * arch.num_layers * (fwd + bwd)
    # rel 1e-2: the merges also lengthen the window that hides the KV ring's transfers, a little
    assert with_merge.step_time_s - without.step_time_s == pytest.approx(per_step, rel=1e-2)
    assert rec.step_time_s - rec_without.step_time_s == pytest.approx(per_step + m * arch.num_layers * fwd, rel=1e-2)
    assert with_merge.step_time_s - without.step_time_s < per_step


def test_wave_utilisation_counts_the_idle_sms_of_the_last_wave():
    """A GEMM's 128 x 128 output tiles run one per SM at a time: 36 tiles busy 36 of H100's 132 SMs, a multiple of
    the SMs busies them all, one tile more adds a wave that runs nearly empty; a GPU of unknown SM count loses
    nothing."""
    from dse.perfmodel.model import wave_utilisation

    assert wave_utilisation(6 * 128, 6 * 128, 132) == pytest.approx(36 / 132)
    assert wave_utilisation(12 * 128, 11 * 128, 132) == 1.0
    assert wave_utilisation(12 * 128, 11 * 128 + 1, 132) == pytest.approx(144 / 264)
    assert wave_utilisation(100.0, 100.0, 132) == pytest.approx(1 / 132)  # a part tile is a whole tile
    assert wave_utilisation(6 * 128, 6 * 128, 0) == 1.0


def test_userbuffers_split_gemms_keep_fewer_sms_busy():
    """With userbuffers (tp_comm_overlap) each all-gather + GEMM and GEMM + reduce-scatter runs as one GEMM per TP
    rank's chunk of the tokens: Llama 3.1 405B at TP 8, CP 2 on H100 multiplies 512-row chunks, whose waves leave
    SMs idle, so the layer's GEMM time grows while its FLOPs do not; without the overlap, and on a GPU of unknown SM
    count, the GEMMs are the roofline of their FLOPs and bytes alone."""
    from dse.perfmodel.layout import Machine, ModelLayout, Shape
    from dse.perfmodel.model import gemm_backward_time, gemm_chunk_rows, gemm_forward_time, linear_shapes

    arch = RECIPES["llama3_405b"].arch
    kw = dict(num_gpus=1024, tp=8, pp=8, cp=2, vp=8, mbs=1, gbs=512, seq_length=8192, precision="fp8")

    def gemm_s(gpu, overlap: bool) -> float:
        layout = ModelLayout(**kw, tp_comm_overlap=overlap)
        shape = Shape.of(arch, layout)
        machine = Machine.of(gpu, DEFAULT_PARAMS, layout)
        rows = gemm_chunk_rows(shape, layout)
        assert rows == (shape.tokens / 8 if overlap else shape.tokens)
        return gemm_forward_time(shape, machine, rows) + gemm_backward_time(shape, machine, rows)

    h100 = HARDWARE["h100"]
    assert gemm_s(h100, True) > 1.05 * gemm_s(h100, False)
    blind = dataclasses.replace(h100, sms=0)
    assert gemm_s(blind, True) == gemm_s(blind, False)
    layout = ModelLayout(**kw)
    shape, machine = Shape.of(arch, layout), Machine.of(blind, DEFAULT_PARAMS, layout)
    T, g = shape.tokens, machine.gemm_input_bytes
    flops = sum(2.0 * T * k * n for k, n, _ in linear_shapes(shape))
    nbytes = sum((T * k + k * n) * g + 2.0 * T * n for k, n, _ in linear_shapes(shape))
    assert gemm_s(blind, False) == pytest.approx(3.0 * (flops / machine.gemm_rate + nbytes / machine.hbm_Bps))
