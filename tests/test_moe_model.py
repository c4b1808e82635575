"""The model's MoE and MLA terms: FLOPs as Megatron-Bridge counts them, expert states sharded over expert
parallelism, the token exchange's direction, uneven pipeline stages, the predict CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.perfmodel import DEFAULT_PARAMS, predict_layout
from dse.perfmodel.flops import model_flops_per_step, total_params
from dse.recipes.models import RECIPES

runner = CliRunner()


@pytest.mark.parametrize(
    "model,tflops,tokens",
    [
        # Megatron-Bridge docs/performance-summary.md, container 26.08, DGX-GB300 and DGX-GB200 rows: model TFLOP/s
        # over tokens/s is the FLOPs Bridge counts per token
        ("deepseek_v3", 1635, 6288),
        ("deepseek_v3", 1276, 4912),
        ("qwen3_235b_a22b", 1306, 8816),
        ("gpt_oss_120b", 1077, 33024),  # half its layers attend within a 128-token window
    ],
)
def test_flops_per_token_are_the_published_count(model, tflops, tokens):
    per_token = model_flops_per_step(RECIPES[model].arch, 1, 4096) / 4096
    assert per_token == pytest.approx(tflops / tokens * 1e12, rel=0.005)


def test_parameter_counts_are_the_model_cards():
    assert total_params(RECIPES["deepseek_v3"].arch) / 1e9 == pytest.approx(671, rel=0.002)  # without the MTP layer
    assert total_params(RECIPES["qwen3_30b_a3b"].arch) / 1e9 == pytest.approx(30.5, rel=0.01)
    assert total_params(RECIPES["mixtral_8x7b"].arch) / 1e9 == pytest.approx(46.7, rel=0.01)


def _predict(model: str, gpu: str, num_gpus: int, **over):
    r = RECIPES[model]
    lay = r.default_layout(gpu, "bf16")
    kw = {k: getattr(lay, k) for k in ("tp", "pp", "cp", "vp", "mbs", "gbs", "ep", "etp", "moe_dispatcher")}
    kw |= {k: getattr(lay, k) for k in ("moe_a2a_overlap", "moe_permute_fusion", "pp_first_layers", "pp_last_layers")}
    kw |= over
    return predict_layout(r.arch, gpu, num_gpus=num_gpus, seq_length=r.seq_length, **kw)


def test_expert_states_shard_over_expert_parallelism():
    ep8 = _predict("qwen3_30b_a3b", "h100", 8, ep=8)
    ep4 = _predict("qwen3_30b_a3b", "h100", 8, ep=4)
    ep1 = _predict("qwen3_30b_a3b", "h100", 8, ep=1)
    states = [p.breakdown["mem.states_gib"] for p in (ep1, ep4, ep8)]
    assert states[0] > states[1] > states[2]
    # 29 B expert parameters: 6 bytes each (bf16 weight, fp32 gradient) held per GPU and the 12 of Adam sharded
    # over the expert-data-parallel ranks (8 / ep); the rest of the model alike over 8
    experts = 48 * 128 * 3 * 2048 * 768
    assert states[1] - states[2] == pytest.approx(experts * ((6 + 12 / 2) / 4 - (6 + 12 / 1) / 8) / 2**30, rel=0.01)


def test_the_all_to_all_costs_more_off_the_nvlink_domain_and_overlap_hides_part():
    # Qwen3 235B over 256 H100: ep 8 stays in a node, ep 32 crosses four
    near = _predict("qwen3_235b_a22b", "h100", 256, ep=8, moe_a2a_overlap=False)
    far = _predict("qwen3_235b_a22b", "h100", 256, ep=32, moe_a2a_overlap=False)
    per_layer_near = near.breakdown["time.ep_exposed_s"] / near.breakdown["microbatches"]
    per_layer_far = far.breakdown["time.ep_exposed_s"] / far.breakdown["microbatches"]
    # ep 32 sends 7/8 of its copies through the NIC (50 GB/s) instead of NVLink at the all-to-all's efficiency
    assert per_layer_far > 1.5 * per_layer_near > 0
    hidden = _predict("qwen3_235b_a22b", "h100", 256, ep=32, moe_a2a_overlap=True)
    assert 0 < hidden.breakdown["time.ep_exposed_s"] < far.breakdown["time.ep_exposed_s"]
    flex = _predict("qwen3_235b_a22b", "h100", 256, ep=32, moe_dispatcher="flex")
    assert flex.breakdown["time.ep_exposed_s"] < far.breakdown["time.ep_exposed_s"]


def test_the_all_to_all_uses_one_network_plane_of_the_nic():
    # GPT-OSS 120B over 64 B300 (8 nodes): ep 64 sends 7/8 of its token copies through the NICs
    def exposed(**over) -> float:
        return _predict("gpt_oss_120b", "b300", 64, ep=64, moe_dispatcher="alltoall", **over).breakdown[
            "time.ep_exposed_s"
        ]

    # a ConnectX-8's 800 Gb/s is two 400 Gb/s planes: the all-to-all sees one, as on a 400 Gb/s NIC
    assert exposed() == pytest.approx(exposed(scaleout_gbps=400))
    assert exposed(params=DEFAULT_PARAMS.with_values(moe_a2a_nic_plane_gbps=800.0)) < 0.7 * exposed()
    # below one plane's rate the NIC's own line rate limits it
    assert exposed(scaleout_gbps=200) > 1.5 * exposed()


def test_the_overlap_hides_nothing_in_the_unpaired_warm_up_and_cool_down_passes():
    from dse.perfmodel.layout import ModelLayout, Shape
    from dse.perfmodel.moe import unpaired_share

    arch = RECIPES["qwen3_235b_a22b"].arch

    def share(pp: int, vp: int, gbs: int) -> float:
        layout = ModelLayout(num_gpus=256, pp=pp, vp=vp, ep=32, gbs=gbs, seq_length=4096)
        return unpaired_share(Shape.of(arch, layout))

    assert share(1, 1, 1024) == pytest.approx(1 / 4)  # the first forward and the last backward of 4 micro-batches
    assert share(8, 1, 4096) == pytest.approx(7 / 128)  # 1F1B's warm-up on the first stage
    assert share(8, 4, 4096) == pytest.approx((2 * 7 + 3 * 8) / (128 * 4))  # interleaved: in model chunks

    # per micro-batch, fewer micro-batches leave more of the overlapped exchanges exposed; without overlap, none
    def per_microbatch(overlap: bool, gbs: int) -> float:
        p = _predict("qwen3_235b_a22b", "h100", 256, ep=32, pp=8, vp=4, gbs=gbs, moe_a2a_overlap=overlap)
        return p.breakdown["time.ep_exposed_s"] / p.breakdown["microbatches"]

    assert per_microbatch(True, 512) > per_microbatch(True, 8192)
    assert per_microbatch(False, 512) == pytest.approx(per_microbatch(False, 8192))


def test_a_graph_of_the_router_and_preprocessing_replays_half_the_moe_layers_small_kernels():
    from dse.perfmodel.layout import ModelLayout
    from dse.perfmodel.moe import moe_overhead_graphed_share

    def share(graph: str, scope: str) -> float:
        return moe_overhead_graphed_share(ModelLayout(num_gpus=8, ep=8, cuda_graph=graph, cuda_graph_scope=scope))

    assert share("none", "attn,moe_router,moe_preprocess") == 0.0
    assert share("transformer_engine", "attn") == 0.0  # attention's graph holds none of the MoE block's kernels
    assert share("transformer_engine", "moe_router,moe_preprocess") == pytest.approx(0.5)
    assert share("transformer_engine", "moe_router") < share("transformer_engine", "moe_router,moe_preprocess")
    assert share("transformer_engine", "full") == 1.0

    # the graphed MoE layer is faster by half the MoE overhead, beyond what the graph saves on a dense layer's part
    def tokens(scope: str) -> float:
        over = dict(cuda_graph="transformer_engine", cuda_graph_scope=scope)
        return _predict("qwen3_30b_a3b", "b200", 8, ep=8, **over).tokens_per_s_per_gpu

    assert tokens("attn,moe_router,moe_preprocess") > tokens("attn")


def test_the_dispatchers_host_sync_makes_a_short_moe_forward_wait_for_its_host():
    from dse.facts.hardware import HARDWARE as GPUS
    from dse.perfmodel.layout import Machine, ModelLayout, Shape
    from dse.perfmodel.moe import moe_host_forward_s, moe_sync_wait

    arch = RECIPES["qwen3_30b_a3b"].arch  # 128 experts

    def host(gpu: str, graph: str = "none", scope: str = "full", ep: int = 8) -> float:
        layout = ModelLayout(num_gpus=8, ep=ep, cuda_graph=graph, cuda_graph_scope=scope)
        return moe_host_forward_s(Shape.of(arch, layout), layout, Machine.of(GPUS[gpu], DEFAULT_PARAMS, layout))

    P = DEFAULT_PARAMS
    assert host("b200") == pytest.approx(P.moe_host_fwd_s + 128 / 8 * P.moe_host_expert_fwd_s)
    assert host("b200", ep=4) - host("b200") == pytest.approx(16 * P.moe_host_expert_fwd_s)  # 32 experts, not 16
    assert host("gb200") > host("b200")  # a Grace host launches slower than an x86 one
    assert 0.0 < host("b200", "transformer_engine", "moe_router,moe_preprocess") < host("b200")
    assert host("b200", "transformer_engine", "full") == 0.0  # a whole-layer graph: static sizes, no sync

    layout = ModelLayout(num_gpus=8, ep=8)
    machine = Machine.of(GPUS["b200"], DEFAULT_PARAMS, layout)
    shape = Shape.of(arch, layout)
    assert moe_sync_wait(shape, layout, machine, 0.0) == pytest.approx(host("b200"))
    assert moe_sync_wait(shape, layout, machine, 10 * host("b200")) == 0.0  # a long forward hides the host

    # a small MoE model waits for its host at a small micro-batch, not at a large one
    def host_wait_per_token(mbs: int) -> float:
        p = _predict("qwen3_30b_a3b", "b200", 8, ep=8, mbs=mbs, gbs=512)
        return p.breakdown["time.host_wait_s"] / (512 * 4096 / 8)

    assert host_wait_per_token(1) > 0.0
    assert host_wait_per_token(1) > host_wait_per_token(8)


def test_a_moe_layers_backward_takes_at_least_its_hosts_launches():
    """No sync in the backward lets the host run ahead, but a backward pass still takes ``moe_host_bwd_ratio`` times
    the forward's host time: a small MoE model at one sequence a micro-batch waits for it, and waits longer when the
    backward launches more; a long backward hides it."""
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.layout import Machine, ModelLayout, Shape
    from dse.perfmodel.moe import moe_backward_host_wait, moe_host_forward_s

    layout = ModelLayout(num_gpus=8, ep=8)
    machine = Machine.of(HARDWARE["b200"], DEFAULT_PARAMS, layout)
    shape = Shape.of(RECIPES["qwen3_30b_a3b"].arch, layout)
    host_bwd = DEFAULT_PARAMS.moe_host_bwd_ratio * moe_host_forward_s(shape, layout, machine)
    assert moe_backward_host_wait(shape, layout, machine, 0.0) == pytest.approx(host_bwd)
    assert moe_backward_host_wait(shape, layout, machine, host_bwd / 4) == pytest.approx(0.75 * host_bwd)
    assert moe_backward_host_wait(shape, layout, machine, 2 * host_bwd) == 0.0

    def step(mbs: int, ratio: float) -> float:
        params = DEFAULT_PARAMS.with_values(moe_host_bwd_ratio=ratio)
        return _predict("qwen3_30b_a3b", "b200", 8, ep=8, mbs=mbs, gbs=512, params=params).step_time_s

    assert step(1, 3.0) > step(1, 2.0) > step(1, 1.0)  # the host sets the backward at micro-batch 1
    assert step(8, 3.0) == pytest.approx(step(8, 1.0))  # the GPU does at 8


def test_token_drop_waits_for_no_sync_and_balances_the_experts():
    """Under token drop (capacity factor 1.0, padded) the dispatcher copies nothing to the host: no forward sync and
    no backward wait behind it, only the host's launch rate bounds the layer (forward and backward together), and
    the experts take their capacity however the router spreads the tokens (no ``moe_imbalance``)."""
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.layout import Machine, ModelLayout, Shape
    from dse.perfmodel.moe import (
        imbalance,
        moe_backward_host_wait,
        moe_host_forward_s,
        moe_host_layer_wait,
        moe_sync_wait,
    )

    drop = ModelLayout(num_gpus=8, ep=8, moe_token_drop=True)
    machine = Machine.of(HARDWARE["b200"], DEFAULT_PARAMS.with_values(moe_imbalance=1.3), drop)
    shape = Shape.of(RECIPES["qwen3_30b_a3b"].arch, drop)
    host = moe_host_forward_s(shape, drop, machine)
    assert host > 0.0
    assert moe_sync_wait(shape, drop, machine, 0.0) == 0.0
    assert moe_backward_host_wait(shape, drop, machine, 0.0) == 0.0
    both = (1.0 + DEFAULT_PARAMS.moe_host_bwd_ratio) * host
    assert moe_host_layer_wait(shape, drop, machine, 0.0) == pytest.approx(both)
    assert moe_host_layer_wait(shape, drop, machine, both) == 0.0
    assert imbalance(drop, machine) == 1.0
    assert imbalance(ModelLayout(num_gpus=8, ep=8), machine) == 1.3

    def step(mbs: int, token_drop: bool, **over) -> float:
        kw = dict(ep=8, mbs=mbs, gbs=512, moe_dispatcher="alltoall", moe_token_drop=token_drop)
        return _predict("qwen3_30b_a3b", "h100", 8, **(kw | over)).step_time_s

    # at one sequence a micro-batch the dropless forward waits for its host behind the sync while the backward's
    # GPU time exceeds its launches; without the sync the host's spare backward time covers the forward's launches
    assert step(1, True) < 0.97 * step(1, False)
    # at eight the GPU bounds both
    assert step(8, True) == pytest.approx(step(8, False))
    # a busy router costs a dropless run, not a token-drop one
    busy = DEFAULT_PARAMS.with_values(moe_imbalance=1.5)
    assert step(8, False, params=busy) > step(8, False)
    assert step(8, True, params=busy) == pytest.approx(step(8, True))


def test_the_combined_schedule_waits_for_the_host_of_both_passes_under_the_overlap():
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.layout import Machine, ModelLayout, Shape
    from dse.perfmodel.moe import moe_host_forward_s, moe_host_layer_wait

    plain = ModelLayout(num_gpus=16, ep=8)
    overlap = ModelLayout(num_gpus=16, ep=8, moe_a2a_overlap=True)
    machine = Machine.of(HARDWARE["h100"], DEFAULT_PARAMS, overlap)
    shape = Shape.of(RECIPES["qwen3_30b_a3b"].arch, overlap)
    host = moe_host_forward_s(shape, overlap, machine)
    both = (1.0 + DEFAULT_PARAMS.moe_host_bwd_ratio) * host  # the forward's launches and the backward's
    assert moe_host_layer_wait(shape, plain, machine, 0.0) == 0.0  # autograd's backward keeps the host ahead
    assert moe_host_layer_wait(shape, overlap, machine, 0.0) == pytest.approx(both)
    assert moe_host_layer_wait(shape, overlap, machine, host) == pytest.approx(both - host)
    assert moe_host_layer_wait(shape, overlap, machine, both) == 0.0
    slower = replace(machine, params=DEFAULT_PARAMS.with_values(moe_host_bwd_ratio=3.0))
    assert moe_host_layer_wait(shape, overlap, slower, 0.0) == pytest.approx(4.0 * host)

    # a small model's layers at one sequence a micro-batch wait for the host only under the overlap
    def host_wait(over: bool) -> float:
        p = _predict("qwen3_30b_a3b", "h100", 16, ep=8, pp=2, vp=12, mbs=1, gbs=1024, moe_a2a_overlap=over)
        return p.breakdown["time.host_wait_s"]

    assert host_wait(True) > host_wait(False)


def test_bf16_grouped_gemms_on_blackwell_take_their_own_rows_at_half_rate():
    """``moe_gemm_bf16_blackwell_ratio`` scales the grouped GEMM's rows at half rate for bf16 on Blackwell only:
    raising it slows a bf16 MoE on B200 (more so at fewer rows per expert), and leaves MXFP8 on B200 and bf16 on
    H100 where they were."""

    def tps(gpu: str, ratio: float, **over) -> float:
        params = DEFAULT_PARAMS.with_values(moe_gemm_bf16_blackwell_ratio=ratio)
        r = RECIPES["qwen3_30b_a3b"]
        # a whole-layer CUDA graph: no host sync, so the small model's GPU time is the step's at mbs 1 too
        graph = dict(cuda_graph="transformer_engine", cuda_graph_scope="full")
        return predict_layout(
            r.arch, gpu, num_gpus=8, seq_length=r.seq_length, ep=8, gbs=512, params=params, **graph, **over
        ).tokens_per_s_per_gpu

    for mbs in (1, 4):
        assert tps("b200", 8.0, mbs=mbs) < tps("b200", 1.0, mbs=mbs)
    # fewer rows per expert at mbs 1: the same ratio costs a larger share of the step
    loss = {mbs: 1 - tps("b200", 8.0, mbs=mbs) / tps("b200", 1.0, mbs=mbs) for mbs in (1, 4)}
    assert loss[1] > loss[4] > 0
    mx = dict(precision="fp8", fp8_recipe="mxfp8", mbs=4)
    assert tps("b200", 8.0, **mx) == pytest.approx(tps("b200", 1.0, **mx), rel=1e-12)
    assert tps("h100", 8.0, mbs=1) == pytest.approx(tps("h100", 1.0, mbs=1), rel=1e-12)


def test_a_dense_model_has_no_expert_term():
    p = predict_layout(RECIPES["llama3_8b"].arch, "h100", num_gpus=8, cp=2)
    assert p.breakdown["time.ep_exposed_s"] == 0.0


def test_uneven_stages_move_layers_and_memory():
    even = _predict("deepseek_v3", "b200", 256, pp_first_layers=0, pp_last_layers=0)
    uneven = _predict("deepseek_v3", "b200", 256)  # NVIDIA's 4 layers on the first stage, 1 on the last
    assert uneven.peak_memory_gib != even.peak_memory_gib
    assert uneven.tokens_per_s_per_gpu != even.tokens_per_s_per_gpu


def test_predict_cli_reproduces_a_published_deepseek_v3_row():
    # Megatron-Bridge 26.04, DGX-GB200, MXFP8: 4193 tokens/s/GPU (bench/data/published_moe.tsv, a fitted row)
    res = runner.invoke(
        app,
        [
            "predict",
            "--model",
            "deepseek_v3",
            "--gpu",
            "gb200",
            "--num-gpus",
            "256",
            "--precision",
            "fp8",
            "--fp8-recipe",
            "mxfp8",
            "--gbs",
            "4096",
            # a Bridge row: HybridEP (the NeMo 2 payload's DeepEP does not run on GB200: moe_dispatcher_supported)
            "--payload",
            "mbridge",
            # the row's preset graphs attention, the router and the dispatcher's preprocessing
            "--cuda-graph",
            "transformer_engine",
            "--cuda-graph-scope",
            "attn,moe_router,moe_preprocess",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["tokens_per_s_per_gpu"] == pytest.approx(4193, rel=0.10)


def test_uneven_stages_must_split_the_rest_evenly():
    from dse.perfmodel.trials import make_trial
    from dse.rules.constraints import check

    r = RECIPES["deepseek_v3"]
    ok = make_trial(r, "b200", 256, pp=16, vp=1, ep=8, pp_first_layers=4, pp_last_layers=1, gbs=2048)
    assert check(ok) is None  # 56 layers over the 14 middle stages
    bad = make_trial(r, "b200", 256, pp=16, vp=1, ep=8, pp_first_layers=5, pp_last_layers=1, gbs=2048)
    broken = check(bad)
    assert broken is not None and "pp_first_layers" in broken.knobs and "55 layers" in broken.reason
    even = make_trial(r, "b200", 256, pp=16, vp=1, ep=8, pp_first_layers=0, pp_last_layers=0, gbs=2048)
    assert check(even) is not None and "does not divide the 61 layers" in check(even).reason


def test_recompute_modules_shrink_a_moe_layers_activations():
    from dse.perfmodel.layout import ModelLayout, Shape
    from dse.perfmodel.moe import moe_layer_activation_bytes

    arch = RECIPES["deepseek_v3"].arch
    layout = ModelLayout(num_gpus=256, pp=4, vp=4, ep=64, gbs=4096, seq_length=4096)
    shape = Shape.of(arch, layout)
    full = moe_layer_activation_bytes(shape, layout, False)
    sizes = {
        m: moe_layer_activation_bytes(shape, layout, False, modules=frozenset({m}))
        for m in ("mla_up_proj", "moe_act", "layernorm", "moe")
    }
    # MLA's Q, K and V: 4096 tokens x 128 heads x (192 + 192 + 128) x 2 bytes
    assert full - sizes["mla_up_proj"] == pytest.approx(4096 * 128 * 512 * 2)
    assert full - sizes["moe_act"] == pytest.approx(8 * 4096 * 2048 * 2)  # each routed copy's activation output
    assert full > sizes["layernorm"] > sizes["moe"]
    assert moe_layer_activation_bytes(shape, layout, False, "full") < sizes["moe"]


def test_unfused_attention_keeps_a_moe_layers_scores():
    """Under unfused attention a MoE layer keeps the s x s scores a dense layer keeps (2 bytes each under TE's fused
    softmax without dropout; 6 under Megatron's local attention, its fp32 softmax output and bf16 probabilities,
    with K and V repeated to every query head), not flash attention's log-sum-exp; selective
    recompute of core attention gives them up, and the other recompute modules do not. (The one-GPU runs of
    recipes.mcore's local spec, bench/moe_gpu_runs.py, are where this shows.)"""
    from dataclasses import replace

    from dse.perfmodel.layout import ModelLayout, Shape
    from dse.perfmodel.moe import moe_layer_activation_bytes

    arch = RECIPES["qwen3_30b_a3b"].arch
    flash = ModelLayout(num_gpus=8, ep=8, gbs=64, mbs=2, seq_length=4096)
    shape = Shape.of(arch, flash)
    a, s, b = arch.num_attention_heads, 4096, 2
    base = moe_layer_activation_bytes(shape, flash, False)
    lse = 4.0 * s * b * a
    repeated_kv = 2.0 * 2.0 * (a - arch.num_query_groups) * arch.kv_channels * s * b  # the local spec's K, V copies
    eager = arch.moe_topk * s * b * 3 * 2.0 * arch.expert_ffn  # and its experts' eager activation (its own test)
    for backend, per_score, kv, mlp in (("unfused", 2.0, 0.0, 0.0), ("local", 6.0, repeated_kv, eager)):
        layout = replace(flash, attention_backend=backend)
        assert layout.unfused_attention
        kept = moe_layer_activation_bytes(shape, layout, False)
        assert kept - base == pytest.approx(per_score * a * s * s * b - lse + kv + mlp)
        assert moe_layer_activation_bytes(shape, layout, False, "selective", frozenset({"core_attn"})) == (
            pytest.approx(base - lse + mlp)
        )
        assert moe_layer_activation_bytes(shape, layout, False, "selective", frozenset({"moe_act"})) > base


@pytest.mark.parametrize(
    "model,gpu,num_gpus,modules",
    [("deepseek_v3", "gb200", 256, "mla_up_proj"), ("gpt_oss_120b", "b200", 64, "layernorm,moe_act")],
)
def test_recompute_modules_trade_a_moe_models_memory_for_time(model, gpu, num_gpus, modules):
    kept = _predict(model, gpu, num_gpus)
    rec = _predict(model, gpu, num_gpus, recompute="selective", recompute_modules=modules)
    assert rec.breakdown["mem.activations_gib"] < kept.breakdown["mem.activations_gib"]
    assert rec.peak_memory_gib < kept.peak_memory_gib
    assert rec.step_time_s > kept.step_time_s
    # recomputing the whole MoE block saves more and costs more than its activation alone
    moe = _predict(model, gpu, num_gpus, recompute="selective", recompute_modules="moe")
    act = _predict(model, gpu, num_gpus, recompute="selective", recompute_modules="moe_act")
    assert moe.breakdown["mem.activations_gib"] < act.breakdown["mem.activations_gib"]
    assert moe.step_time_s > act.step_time_s > kept.step_time_s


def test_a_moe_graph_scope_removes_the_captured_launch_overhead():
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.layout import Machine, ModelLayout, Shape
    from dse.perfmodel.model import moe_layer_time
    from dse.perfmodel.stack import NVIDIA_RECIPES
    from dse.perfmodel.timing import DEFAULT_PARAMS

    arch = RECIPES["qwen3_30b_a3b"].arch
    times = {}
    for graph, scope in (("none", "full"), ("transformer_engine", "attn,moe_router,moe_preprocess")):
        layout = ModelLayout(num_gpus=8, ep=8, gbs=512, cuda_graph=graph, cuda_graph_scope=scope)
        machine = Machine.of(HARDWARE["h100"], DEFAULT_PARAMS, layout)
        times[graph] = moe_layer_time(Shape.of(arch, layout), layout, machine, NVIDIA_RECIPES).compute
    # attn (0.5) + moe_router (0.15) + moe_preprocess (0.1) of the 60 us layer overhead run back to back, and the
    # router's and the preprocessing's half of the MoE layer's own small kernels
    saved = 0.75 * 60e-6 + 0.5 * DEFAULT_PARAMS.moe_layer_overhead_s
    assert times["none"] - times["transformer_engine"] == pytest.approx(saved, rel=1e-6)


def test_first_dense_layers_keep_a_dense_layers_activations():
    """DeepSeek-V3's three dense layers keep no routed copies; ``mlp`` recomputes their MLP (and no MoE layer's), so
    the first stage's in-flight activations fall below every layer counted as a MoE layer, and further with
    ``mlp``; a model without first dense layers keeps them all."""
    from dataclasses import replace

    from dse.perfmodel.layout import ModelLayout, Shape, stages_of
    from dse.perfmodel.memory import first_dense_saving
    from dse.perfmodel.moe import moe_layer_activation_bytes

    arch = RECIPES["deepseek_v3"].arch
    layout = ModelLayout(num_gpus=256, pp=4, vp=4, ep=64, gbs=4096, seq_length=4096)
    shape = Shape.of(arch, layout)
    stages = stages_of(arch, 4, 4, 16, 13)
    moe_layer = moe_layer_activation_bytes(shape, layout, True)
    dense_layer = moe_layer_activation_bytes(shape, layout, True, dense=True)
    assert 0.0 < dense_layer < moe_layer
    kept = first_dense_saving(shape, layout, True, stages, moe_layer)
    assert kept > 0.0
    mlp = replace(layout, recompute="selective", recompute_modules="mlp")
    assert first_dense_saving(shape, mlp, True, stages, moe_layer) > kept
    assert first_dense_saving(shape, replace(layout, recompute="full"), True, stages, moe_layer) == 0.0
    no_dense = replace(arch, moe_first_dense_layers=0)
    assert first_dense_saving(Shape.of(no_dense, layout), layout, True, stages, moe_layer) == 0.0


def test_small_heads_run_attention_below_the_fitted_efficiency(monkeypatch):
    """GPT-OSS's 64-wide heads run the fused attention below the head-128 efficiency the dense models fit, which
    slows its step; heads of 128 and more (Llama's, DeepSeek's MLA 192) keep it."""
    from dataclasses import replace

    from dse.perfmodel import moe

    gpt_oss = RECIPES["gpt_oss_120b"].arch
    assert moe.attention_head_efficiency(gpt_oss) < 1.0
    assert moe.attention_head_efficiency(replace(gpt_oss, kv_channels=32)) < moe.attention_head_efficiency(gpt_oss)
    assert moe.attention_head_efficiency(RECIPES["deepseek_v3"].arch) == 1.0
    assert moe.attention_head_efficiency(replace(gpt_oss, kv_channels=128)) == 1.0
    slow = _predict("gpt_oss_120b", "b200", 64).step_time_s
    monkeypatch.setattr(moe, "attention_head_efficiency", lambda arch: 1.0)
    assert _predict("gpt_oss_120b", "b200", 64).step_time_s < slow


def test_the_moe_and_mla_field_lists_name_modelarch_fields_once():
    from dataclasses import fields

    from dse.recipes.models import MLA_FIELDS, MOE_FIELDS, ModelArch

    names = {f.name for f in fields(ModelArch)}
    listed = (*MOE_FIELDS, *MLA_FIELDS)
    assert set(listed) <= names and len(set(listed)) == len(listed)


def test_the_routers_imbalance_slows_expert_parallel_ranks_only():
    """moe_imbalance is the busiest expert-parallel rank's copies over the mean: it slows a layout with ep > 1 and
    leaves one without expert parallelism as it is (one rank holds every expert and every copy)."""
    uneven = DEFAULT_PARAMS.with_values(moe_imbalance=1.5)

    def step(ep: int, params) -> float:
        # micro-batch 4: the GPU's time, not the host's launches, sets the step (moe.moe_backward_host_wait)
        return _predict("qwen3_30b_a3b", "h100", 8, ep=ep, pp=1, vp=1, mbs=4, gbs=64, params=params).step_time_s

    assert step(8, uneven) > 1.05 * step(8, DEFAULT_PARAMS)
    assert step(1, uneven) == pytest.approx(step(1, DEFAULT_PARAMS))


def test_the_local_specs_eager_expert_activation_keeps_its_intermediates():
    """Megatron-Core's local layer spec (attention_backend=local) runs each expert's SwiGLU as eager ops and weights it
    by its routing probability afterwards: per routed copy the SiLU's output, ``x_linear + offset`` and the
    activation's output stay for the backward pass (3 x 2 bytes per expert-FFN element) beyond what the fused kernel
    keeps; recomputing ``moe_act`` gives them up. (Selective recompute of core attention here, so that the local
    spec's attention keeps what TE's unfused one does.)"""
    from dse.perfmodel.layout import ModelLayout, Shape
    from dse.perfmodel.moe import moe_layer_activation_bytes

    arch = RECIPES["qwen3_30b_a3b"].arch
    local, unfused = (
        ModelLayout(num_gpus=64, pp=4, ep=16, gbs=64, seq_length=4096, attention_backend=b, recompute="selective")
        for b in ("local", "unfused")
    )
    shape = Shape.of(arch, local)
    copies = 8 * 4096  # top-8 of a micro-batch's 4,096 tokens
    for mods, extra in ((frozenset({"core_attn"}), copies * 3 * 2 * 768), (frozenset({"core_attn", "moe_act"}), 0)):
        kept = [moe_layer_activation_bytes(shape, lay, False, "selective", mods) for lay in (local, unfused)]
        assert kept[0] - kept[1] == pytest.approx(extra), mods


@pytest.mark.parametrize(
    "model,gpu,container,runs_unfused",
    [
        ("deepseek_v3", "gb200", "25.04", True),  # MLA's 192-wide heads, Blackwell, Transformer Engine before 2.5
        ("deepseek_v3", "b200", "25.02", True),
        ("deepseek_v3", "gb200", "25.09", False),  # a container with the fused kernel for them
        ("deepseek_v3", "h100", "25.04", False),  # Hopper's cuDNN took them
        ("nemotron4_340b", "gb200", "25.04", False),  # 192-wide heads without MLA: FlashAttention
    ],
)
def test_auto_attention_runs_unfused_where_the_container_has_no_fused_mla_kernel(model, gpu, container, runs_unfused):
    """``attention_backend=auto`` prices what Transformer Engine picks: in a container family without a fused
    Blackwell kernel for MLA's heads it is the unfused backend, to the last figure; elsewhere it is not. An explicit
    backend is kept."""
    from dse.facts.containers import family_of

    arch = RECIPES[model].arch
    layout = dict(num_gpus=256, tp=2, pp=4, ep=8, gbs=512, container=family_of(container).name)
    if not arch.num_experts:
        layout.update(tp=8, pp=8, ep=1)
    auto = predict_layout(arch, gpu, **layout)
    unfused = predict_layout(arch, gpu, attention_backend="unfused", **layout)
    same = (auto.step_time_s, auto.peak_memory_gib) == (unfused.step_time_s, unfused.peak_memory_gib)
    assert same is runs_unfused
    flash = predict_layout(arch, gpu, attention_backend="flash", **layout)
    assert (flash.step_time_s == unfused.step_time_s) is False


def test_predict_says_where_auto_attention_is_priced_unfused():
    """``dse predict`` names the backend ``auto`` is priced as where it is not the fused kernel, and only there."""
    runner = CliRunner()
    args = ["predict", "--model", "deepseek_v3", "--gpu", "gb200", "--num-gpus", "256", "--json"]
    old = json.loads(runner.invoke(app, [*args, "--container", "25.04"]).output)
    assert "priced as unfused" in old["attention_note"] and old["attention_backend"] == "auto"
    new = json.loads(runner.invoke(app, [*args, "--container", "25.09"]).output)
    assert new["attention_note"] == ""
    assert old["step_time_s"] > new["step_time_s"]


def test_one_gemm_per_expert_is_host_time_and_recompute_launches_the_forward_again():
    """Without grouped GEMMs (SequentialMLP, a Python loop over the local experts) each expert's fc1 and fc2 are the
    host's launches, on top of the layer's other host time, not a gap in the GPU's; full recompute launches the whole
    forward again in the backward, selective recompute of the ``moe`` module half of it."""
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.layout import Machine, ModelLayout, Shape
    from dse.perfmodel.moe import expert_gemm_forward, moe_host_passes_s

    P = DEFAULT_PARAMS
    arch = RECIPES["qwen3_30b_a3b"].arch  # 128 experts, 16 a GPU at ep 8

    def parts(**over):
        layout = ModelLayout(num_gpus=8, ep=8, **over)
        machine = Machine.of(HARDWARE["h100"], P, layout)
        shape = Shape.of(arch, layout)
        return expert_gemm_forward(shape, layout, machine), moe_host_passes_s(shape, layout, machine)

    gpu_grouped, (fwd_grouped, bwd_grouped) = parts()
    gpu_loop, (fwd_loop, bwd_loop) = parts(moe_grouped_gemm=False)
    assert gpu_loop == pytest.approx(gpu_grouped)  # the loop's launches are not GPU time
    assert fwd_loop - fwd_grouped == pytest.approx(16 * (2 * P.moe_gemm_launch_s - P.moe_host_expert_fwd_s))
    assert bwd_loop == pytest.approx(P.moe_host_bwd_ratio * fwd_loop)
    _, (fwd_full, bwd_full) = parts(recompute="full")
    assert fwd_full == pytest.approx(fwd_grouped) and bwd_full == pytest.approx(bwd_grouped + fwd_grouped)
    _, (_, bwd_moe) = parts(recompute="selective", recompute_modules="moe")
    _, (_, bwd_act) = parts(recompute="selective", recompute_modules="moe_act")
    assert bwd_moe == pytest.approx(bwd_grouped + 0.5 * fwd_grouped) and bwd_act == pytest.approx(bwd_grouped)


def test_without_gradient_accumulation_fusion_every_expert_gradient_is_added_each_micro_batch():
    """recipes.mcore runs without gradient-accumulation fusion: each micro-batch writes every weight gradient, the
    routed experts' too, and adds it to the fp32 buffer; the extra experts' pass grows with the micro-batches."""
    from dataclasses import replace as _replace

    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.stack import STACKS

    def accumulation(experts: int, gbs: int) -> float:
        arch = _replace(RECIPES["qwen3_30b_a3b"].arch, num_layers=4, num_experts=experts)
        p = predict_layout(arch, "h100", stack=STACKS["mcore"], num_gpus=1, ep=1, mbs=1, gbs=gbs)
        return p.breakdown["time.grad_accumulation_s"]

    P, h100 = DEFAULT_PARAMS, HARDWARE["h100"]
    arch = RECIPES["qwen3_30b_a3b"].arch
    # three matrices (SwiGLU) and the router's column, in four layers
    per_expert = (3 * arch.hidden_size * arch.moe_ffn_hidden_size + arch.hidden_size) * 4
    bytes_per_param = 4.0 + 2.0 * 4.0  # write and read the bf16 gradient, read and write the fp32 buffer
    expected = 2 * 8 * per_expert * bytes_per_param / (h100.hbm_gbps * 1e9 * P.optimizer_bw_eff)
    assert accumulation(16, 2) - accumulation(8, 2) == pytest.approx(expected, rel=1e-6)
    assert accumulation(16, 4) - accumulation(8, 4) == pytest.approx(2 * expected, rel=1e-6)
    nvidia = predict_layout(RECIPES["qwen3_30b_a3b"].arch, "h100", num_gpus=8, ep=8, mbs=1, gbs=8)
    assert nvidia.breakdown["time.grad_accumulation_s"] == 0.0  # NVIDIA's recipes fuse it into the wgrad GEMM
