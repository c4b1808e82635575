"""What the model knows about each payload's code (dse.perfmodel.stack): the table matches recipes/mcore's source,
the trial carries its space's payload, and the three facts move the prediction as their byte counts say."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dse.facts.knobs import CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES
from dse.perfmodel import predict
from dse.perfmodel.memory import GIB, layer_activation_bytes
from dse.perfmodel.stack import NVIDIA_RECIPES, STACKS, fp8_weight_cache_bytes, payload_stack
from dse.perfmodel.timing import DEFAULT_PARAMS
from dse.recipes.contract import PAYLOADS
from dse.rules.space import load_space
from dse.rules.trial import resolve

ROOT = Path(__file__).resolve().parent.parent
TRAIN = (ROOT / "recipes/mcore/train.py").read_text()
SPACE = ROOT / "conf/spaces/llama3_8b_4l_h200_te_space.toml"


def test_every_payload_has_a_stack():
    assert set(STACKS) == set(PAYLOADS)
    assert payload_stack("no-such-payload") == NVIDIA_RECIPES == payload_stack(None)


def test_megatron_core_alone_runs_torchs_adamw_at_its_measured_bytes(tmp_path):
    """recipes.mcore with neither Transformer Engine nor Apex steps with torch's AdamW (Megatron-Core's fallback):
    the ``mcore:torch-adamw`` stack prices its optimizer at the measured bytes per parameter and changes nothing
    else; the bench reads which ran from the log (Megatron-Core's warning or the payload's header)."""
    import importlib
    import sys
    from dataclasses import replace

    from dse.perfmodel.model import predict_layout
    from dse.perfmodel.stack import PAYLOAD_VARIANTS, TORCH_ADAMW_BYTES
    from dse.recipes.models import RECIPES

    torch_adamw = payload_stack("mcore:torch-adamw")
    assert torch_adamw == PAYLOAD_VARIANTS["mcore:torch-adamw"]
    assert replace(torch_adamw, optimizer_bytes=STACKS["mcore"].optimizer_bytes) == STACKS["mcore"]
    arch = RECIPES["llama3_8b"].arch
    kw = dict(num_gpus=1, mbs=1, gbs=8, seq_length=2048)
    fused = predict_layout(arch, "h100", stack=STACKS["mcore"], **kw).breakdown
    unfused = predict_layout(arch, "h100", stack=torch_adamw, **kw).breakdown
    ratio = TORCH_ADAMW_BYTES / STACKS["mcore"].optimizer_bytes
    assert unfused["time.optimizer_s"] == pytest.approx(ratio * fused["time.optimizer_s"])
    assert {k: v for k, v in unfused.items() if k != "time.optimizer_s"} == {
        k: v for k, v in fused.items() if k != "time.optimizer_s"
    }
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        bench = importlib.import_module("h200_real_runs")
    finally:
        sys.path.remove(str(ROOT / "bench"))
    logs = {
        "warning": "UserWarning: Transformer Engine and Apex are not installed. Falling back to Torch optimizers.",
        "header": "> recipes.mcore: optimizer torch.optim.adamw.AdamW",
        "fused": "> recipes.mcore: optimizer transformer_engine.pytorch.optimizers.fused_adam.FusedAdam",
    }
    for name, line in logs.items():
        (tmp_path / f"{name}.log").write_text(line + "\n")
    payloads = {n: bench.measure(tmp_path / f"{n}.log")["payload"] for n in logs}
    assert payloads == {"warning": "mcore:torch-adamw", "header": "mcore:torch-adamw", "fused": "mcore"}


def test_the_mcore_entry_is_what_recipes_mcore_runs():
    """recipes/mcore/train.py keeps fp32 gradient buffers, never sets fp8_param_gather, and leaves Megatron's loss
    fusion off (so the native fp32 cross entropy runs): change the payload and this test says to change the table."""
    s = STACKS["mcore"]
    assert ("grad_reduce_in_fp32=True" in TRAIN) == s.fp8_grad_reduce_in_fp32
    assert ("fp8_param_gather" in TRAIN) == s.fp8_param_gather
    assert ("cross_entropy_loss_fusion" in TRAIN) == (s.cross_entropy == "te")


def test_the_trial_carries_its_spaces_payload():
    space = load_space(SPACE)
    assert space.backend.payload == "mcore"
    point = next(iter(space.points()))
    assert resolve(space, point).payload == "mcore"
    other = space.model_copy(update={"backend": space.backend.model_copy(update={"payload": "mbridge"})})
    assert resolve(other, point).payload == "mbridge"


def _pair(**values):
    space = load_space(SPACE)
    t = resolve(
        space,
        {
            "mbs": 1,
            "recompute": "full",
            "precision": "bf16",
            "fp8_recipe": "delayed",
            "attention_backend": "fused",
            **values,
        },
    )
    return predict(t), predict(replace(t, payload="mbridge")), t


def test_fp8_without_param_gather_keeps_a_weight_cache_and_fp32_gradients():
    mcore, bridge, t = _pair(precision="fp8")
    a = t.arch
    lin = (
        a.num_layers
        * a.hidden_size
        * (
            (a.num_attention_heads + 2 * a.num_query_groups) * a.hidden_size // a.num_attention_heads
            + a.hidden_size
            + 3 * a.ffn_hidden_size
        )
    )
    assert mcore.breakdown["mem.fp8_weight_cache_gib"] == pytest.approx(2 * lin / GIB)
    assert bridge.breakdown["mem.fp8_weight_cache_gib"] == 0.0
    # bf16 gradients (2 bytes) for Bridge's FP8 recipes, fp32 (4) for recipes.mcore
    params = mcore.breakdown["mem.states_gib"] * GIB / (2 + 4 + 12)
    assert bridge.breakdown["mem.states_gib"] == pytest.approx(params * (2 + 2 + 12) / GIB)
    assert fp8_weight_cache_bytes(False, STACKS["mcore"]) == 0.0


def test_the_native_loss_keeps_six_bytes_per_logit():
    mcore, bridge, t = _pair()
    assert mcore.breakdown["mem.logits_gib"] / bridge.breakdown["mem.logits_gib"] == pytest.approx(
        DEFAULT_PARAMS.logits_bytes_native / DEFAULT_PARAMS.logits_bytes
    )
    assert DEFAULT_PARAMS.logits_bytes_native == 6.0
    tuned = predict(t, params=DEFAULT_PARAMS.with_values(logits_bytes_native=4.0))
    assert tuned.breakdown["mem.logits_gib"] == pytest.approx(mcore.breakdown["mem.logits_gib"] * 4 / 6)


def test_a_fused_softmax_keeps_two_bytes_per_score_without_dropout():
    kw = dict(s=2048, b=1, h=4096, a=32, g=8, ffn=14336, gated=True)
    korthikanti = layer_activation_bytes(**kw, dropout=False)
    fused = layer_activation_bytes(**kw, dropout=False, fused_softmax=True)
    assert korthikanti - fused == pytest.approx(3 * 32 * 2048 * 2048)
    # with dropout the mask and the dropout output come back: Korthikanti's 5 bytes
    assert layer_activation_bytes(**kw, dropout=True, fused_softmax=True) == layer_activation_bytes(**kw, dropout=True)


def test_unfused_gradient_accumulation_costs_a_pass_over_the_parameters_per_microbatch():
    """recipes.mcore sets gradient_accumulation_fusion=False: each micro-batch's bf16 weight gradients are added to
    the fp32 buffer afterwards (2 + 2 + 4 + 4 bytes per parameter at the Adam pass's share of HBM bandwidth)."""
    from dse.facts.hardware import HARDWARE

    assert ("gradient_accumulation_fusion=False" in TRAIN) == (not STACKS["mcore"].grad_accumulation_fusion)
    mcore, bridge, t = _pair()
    assert bridge.breakdown["time.grad_accumulation_s"] == 0.0
    params = mcore.breakdown["mem.states_gib"] * GIB / (2 + 4 + 12)  # bf16: fp32 gradients on both payloads
    m = t.layout.gbs // t.layout.mbs
    want = m * params * 12 / (HARDWARE["h200"].hbm_gbps * 1e9 * DEFAULT_PARAMS.optimizer_bw_eff)
    assert mcore.breakdown["time.grad_accumulation_s"] == pytest.approx(want)
    loss = mcore.breakdown["time.logits_s"] - bridge.breakdown["time.logits_s"]  # the native loss's extra traffic
    assert mcore.step_time_s - bridge.step_time_s == pytest.approx(want + loss)


def test_dse_predict_takes_the_payload():
    import json

    from typer.testing import CliRunner

    from dse.cli import app

    runner = CliRunner()
    base = [
        "predict",
        "--model",
        "llama3_8b_4l",
        "--gpu",
        "h200",
        "--gpus-per-node",
        "1",
        "--num-gpus",
        "1",
        "--mbs",
        "1",
        "--gbs",
        "8",
        "--seq-length",
        "2048",
        "--json",
    ]
    out = {}
    for payload in ("nemo2", "mcore"):
        r = runner.invoke(app, base + ["--payload", payload])
        assert r.exit_code == 0, r.output
        out[payload] = json.loads(r.output)
        assert out[payload]["payload"] == payload
    assert out["mcore"]["breakdown"]["mem.logits_gib"] == pytest.approx(3 * out["nemo2"]["breakdown"]["mem.logits_gib"])
    assert out["mcore"]["step_time_s"] > out["nemo2"]["step_time_s"]  # unfused gradient accumulation
    r = runner.invoke(app, base + ["--payload", "megatron"])
    assert r.exit_code == 2 and "--payload" in r.output and "mcore" in r.output
    assert "Traceback" not in r.output


def test_the_native_loss_streams_its_fp32_copy():
    """Megatron's native cross entropy makes 52 bytes of HBM traffic per logit, the fused one 16: the logits term
    grows by 36 bytes per logit (at the element-wise kernels' fitted scale) per micro-batch."""
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.stack import cross_entropy_bytes

    assert (cross_entropy_bytes(STACKS["mcore"]), cross_entropy_bytes(NVIDIA_RECIPES)) == (52.0, 16.0)
    mcore, bridge, t = _pair()
    logits = t.layout.mbs * t.layout.seq_length * t.arch.vocab_size
    m = t.layout.gbs // t.layout.mbs
    want = m * logits * 36 * DEFAULT_PARAMS.elementwise_scale / (HARDWARE["h200"].hbm_gbps * 1e9)
    assert mcore.breakdown["time.logits_s"] - bridge.breakdown["time.logits_s"] == pytest.approx(want)


def test_the_mcore_entry_runs_its_own_activation():
    """recipes/mcore/train.py picks F.silu or F.gelu from the gated flag alone, so a Nemotron arch there runs no
    eager squared ReLU; NVIDIA's Nemotron providers do."""
    assert "activation_func=F.silu if cfg.gated else F.gelu" in TRAIN
    assert STACKS["mcore"].arch_activation is False and NVIDIA_RECIPES.arch_activation is True


def test_eager_squared_relu_costs_its_bytes_on_nvidia_stacks_only():
    """Nemotron's eager squared ReLU (ModelArch.activation) adds SQUARED_RELU_EXTRA_BYTES per element of the MLP
    intermediate per token to every layer's element-wise traffic, forward + backward, on NeMo 2 / Bridge; the
    same arch on recipes.mcore's stack, or with a fused activation, pays nothing."""
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.model import SQUARED_RELU_EXTRA_BYTES, predict_layout
    from dse.recipes.models import RECIPES

    arch = RECIPES["nemotron4_15b"].arch
    assert arch.activation == "squared_relu"
    fused = replace(arch, activation="fused")
    kw = dict(num_gpus=2, tp=2, pp=1, mbs=1, gbs=16, seq_length=4096, precision="bf16")  # no DP to overlap
    eager, plain = (predict_layout(a, "h100", **kw) for a in (arch, fused))
    m, T = 16, 4096  # micro-batches, tokens per micro-batch
    extra = (
        m
        * arch.num_layers
        * T
        * SQUARED_RELU_EXTRA_BYTES
        * arch.ffn_hidden_size
        / 2
        * DEFAULT_PARAMS.elementwise_scale
        / (HARDWARE["h100"].hbm_gbps * 1e9)
    )
    assert eager.step_time_s - plain.step_time_s == pytest.approx(extra, rel=1e-6)
    assert eager.peak_memory_gib == plain.peak_memory_gib
    mc = STACKS["mcore"]
    assert (
        predict_layout(arch, "h100", stack=mc, **kw).step_time_s
        == predict_layout(fused, "h100", stack=mc, **kw).step_time_s
    )


def test_the_mcore_entry_runs_no_dropout():
    assert "hidden_dropout=0.0" in TRAIN and "attention_dropout=0.0" in TRAIN
    assert STACKS["mcore"].arch_dropout is False and NVIDIA_RECIPES.arch_dropout is True


def test_dropout_costs_its_bytes_on_nvidia_stacks_only():
    """ModelArch.dropout adds HIDDEN_DROPOUT_BYTES per hidden element per token (the bias-dropout-add masks); with
    unfused attention also the score bytes of unfused_score_bytes(True) beyond (False), forward and backward; the
    masks are held for the backward (memory grows). recipes.mcore's stack runs without dropout whatever the arch."""
    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.model import HIDDEN_DROPOUT_BYTES, predict_layout, unfused_score_bytes
    from dse.recipes.models import RECIPES

    arch = RECIPES["llama3_8b"].arch
    assert arch.dropout == 0.0
    wet = replace(arch, dropout=0.1)
    kw = dict(num_gpus=1, tp=1, pp=1, mbs=1, gbs=8, seq_length=4096, precision="bf16")  # no DP to overlap
    m, T, hbm = 8, 4096, HARDWARE["h100"].hbm_gbps * 1e9
    masks = m * arch.num_layers * T * HIDDEN_DROPOUT_BYTES * arch.hidden_size * DEFAULT_PARAMS.elementwise_scale / hbm
    dry, drop = (predict_layout(a, "h100", **kw) for a in (arch, wet))
    assert drop.step_time_s - dry.step_time_s == pytest.approx(masks, rel=1e-6)
    assert drop.peak_memory_gib > dry.peak_memory_gib
    ukw = dict(kw, attention_backend="unfused")
    dry_u, drop_u = (predict_layout(a, "h100", **ukw) for a in (arch, wet))
    scores = m * arch.num_layers * arch.num_attention_heads * T * T  # score elements per step
    extra_b = sum(unfused_score_bytes(True)) - sum(unfused_score_bytes(False))
    assert drop_u.step_time_s - dry_u.step_time_s == pytest.approx(masks + scores * extra_b / hbm, rel=1e-6)
    mc = STACKS["mcore"]
    assert (
        predict_layout(wet, "h100", stack=mc, **ukw).step_time_s
        == predict_layout(arch, "h100", stack=mc, **ukw).step_time_s
    )


def test_published_stacks_price_the_loss_their_containers_ran():
    """A published row's trial names its container's loss (PUBLISHED_STACKS, the tables' cross_entropy column):
    Megatron-Core's fused native loss costs 36 bytes per logit against TE's 16, and keeps the fp32 softmax (6
    bytes per logit at the last stage's peak, as the unfused native one does)."""
    import csv

    from dse.facts.hardware import HARDWARE
    from dse.perfmodel.stack import PUBLISHED_STACKS, cross_entropy_bytes
    from dse.perfmodel.trials import make_trial
    from dse.recipes.models import RECIPES

    assert {n: cross_entropy_bytes(s) for n, s in PUBLISHED_STACKS.items() if n.count(":") == 1} == {
        "published:te": 16.0,
        "published:native_fused": 36.0,
        "published:native": 52.0,
    }
    assert payload_stack("published:native_fused").cross_entropy == "native_fused"
    assert payload_stack("published:nonsense") == NVIDIA_RECIPES
    rec = RECIPES["llama3_8b"]
    kw = dict(tp=1, pp=1, mbs=1, gbs=8, seq_length=8192, precision="bf16")
    te, fused = (predict(make_trial(rec, "h100", 8, payload=f"published:{ce}", **kw)) for ce in ("te", "native_fused"))
    logits = 8192 * rec.arch.vocab_size
    want = 1 * logits * 20 * DEFAULT_PARAMS.elementwise_scale / (HARDWARE["h100"].hbm_gbps * 1e9)  # m = 1 (dp 8)
    assert fused.breakdown["time.logits_s"] - te.breakdown["time.logits_s"] == pytest.approx(want)
    assert fused.breakdown["mem.logits_gib"] == pytest.approx(3 * te.breakdown["mem.logits_gib"])
    for table in ("published_perf_calibration.tsv", "published_perf_heldout.tsv"):
        with open(ROOT / "bench" / "data" / table, newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        assert {f"published:{r['cross_entropy']}" for r in rows} <= set(PUBLISHED_STACKS), table
        assert {r["cuda_graphs"] for r in rows} <= {"0", "1", ""}, table
        # the graph knobs' columns: catalogue values, and the same rows graphed as the older 1/0 column says
        assert {r["cuda_graph"] for r in rows} <= {*CUDA_GRAPH_IMPLS, ""}, table
        assert {r["cuda_graph_scope"] for r in rows} <= {*CUDA_GRAPH_SCOPES, ""}, table
        assert all((r["cuda_graph"] not in ("none", "")) == (r["cuda_graphs"] == "1") for r in rows), table
        # filled wherever the model's host term applies (Grace), except where no preset says
        assert [r["id"] for r in rows if r["gpu"] in ("gb200", "gb300") and r["cuda_graph"] == ""] in (
            [],
            ["nemo2507_gb200_llama3_70b_alt"],
        ), table


def test_the_bf16_grads_stacks_reduce_bf16_gradients_in_two_bytes():
    """Megatron-Bridge's performance scripts reduce gradients in bf16 in bf16 runs (``published:<loss>:bf16-grads``):
    the bf16 states lose 2 bytes per parameter against the same loss's stack with fp32 gradients, FP8's are
    the same in both (bf16 already), and the data-parallel reduction moves half the bytes."""
    from dse.perfmodel.layout import grad_bytes
    from dse.perfmodel.stack import PUBLISHED_STACKS, published_stack_name
    from dse.perfmodel.trials import make_trial
    from dse.recipes.models import RECIPES

    for ce in ("te", "native_fused", "native"):
        fp32, bf16 = (PUBLISHED_STACKS[published_stack_name(ce, g)] for g in (False, True))
        assert (grad_bytes("bf16", fp32), grad_bytes("bf16", bf16)) == (4.0, 2.0)
        assert grad_bytes("fp8", fp32) == grad_bytes("fp8", bf16) == 2.0
        assert fp32.cross_entropy == bf16.cross_entropy == ce
    assert grad_bytes("bf16", NVIDIA_RECIPES) == 4.0  # what dse's own scripts run
    rec = RECIPES["llama3_8b"]
    kw = dict(tp=1, pp=1, mbs=1, gbs=64, seq_length=8192)
    for precision, saved in (("bf16", 2.0), ("fp8", 0.0)):
        fp32, bf16 = (
            predict(make_trial(rec, "h100", 16, payload=published_stack_name("te", g), precision=precision, **kw))
            for g in (False, True)
        )
        params = fp32.breakdown["mem.states_gib"] * GIB / (2 + 4 + 12 / 16) if precision == "bf16" else None
        if params is not None:  # bf16 weights, fp32 gradients, Adam sharded over dp 16
            assert fp32.breakdown["mem.states_gib"] - bf16.breakdown["mem.states_gib"] == pytest.approx(
                saved * params / GIB, rel=0.02
            )
            assert bf16.breakdown["time.dp_exposed_s"] < fp32.breakdown["time.dp_exposed_s"]
        else:
            assert bf16.breakdown["mem.states_gib"] == pytest.approx(fp32.breakdown["mem.states_gib"])


def test_a_grace_host_bounds_short_layers_unless_the_step_is_graphed():
    """On a Grace host (GB200, GB300) a layer takes at least the host's time to launch it
    (Params.host_layer_s_grace), unless CUDA graphs capture it (the cuda_graph knob); x86 hosts (B200) and
    layers longer than the host's time are untouched, and the wait shows in the breakdown."""
    from dse.perfmodel.model import predict_layout
    from dse.recipes.models import RECIPES

    arch = RECIPES["llama3_70b"].arch
    short = dict(
        num_gpus=64, tp=2, pp=4, cp=2, vp=5, mbs=1, gbs=128, seq_length=8192, precision="fp8", tp_comm_overlap=True
    )  # ~6 ms per layer and micro-batch on the GPU
    # a host slower than the layer (12 ms per layer forward + backward; the fitted time is whatever the published
    # rows give, so the mechanism is tested at a stated one)
    slow = DEFAULT_PARAMS.with_values(host_layer_s_grace=0.012, container_host_bridge26=1.0)
    off = DEFAULT_PARAMS.with_values(host_layer_s_grace=0.0)
    for gpu in ("gb200", "gb300"):
        bound = predict_layout(arch, gpu, params=slow, **short)
        free = predict_layout(arch, gpu, params=off, **short)
        graphed = predict_layout(arch, gpu, params=slow, cuda_graph="local", cuda_graph_scope="full_iteration", **short)
        assert bound.step_time_s > 1.3 * free.step_time_s, gpu
        # no host wait, and the captured layers' launch overhead (layer_overhead_s) gone too
        assert graphed.breakdown["time.host_wait_s"] == 0.0
        assert (
            graphed.step_time_s == pytest.approx(free.step_time_s, rel=0.02) and graphed.step_time_s < free.step_time_s
        )
        assert bound.breakdown["time.host_wait_s"] > 0.0 and free.breakdown["time.host_wait_s"] == 0.0
        # the wait is what the host's time adds over the GPU's, layer by layer
        layers = 16  # 80 layers over pp 4: the busiest stage's, as layer_compute_s counts
        m = 128 / (1 * 64 / (2 * 4 * 2))
        assert bound.breakdown["time.host_wait_s"] < m * layers * slow.host_layer_s_grace
    assert (
        predict_layout(arch, "b200", **short).step_time_s
        == predict_layout(arch, "b200", params=off, **short).step_time_s
    )
    # long layers (mbs 2, no CP, tp 1, FSDP) are never host-bound
    long_ = dict(
        num_gpus=64, tp=1, pp=1, mbs=2, gbs=256, seq_length=8192, precision="fp8", fsdp=True, cpu_offload_layers=40
    )
    assert predict_layout(arch, "gb200", **long_).breakdown["time.host_wait_s"] == 0.0


def test_a_graphed_layout_is_faster_by_the_host_term_and_uses_more_memory():
    """CUDA graphs on a Grace host: the whole layer graphed waits for no host and drops the launch overhead;
    graphing half a layer (attn) waits for the other half's launches; graphs cost memory (static buffers of
    per-layer graphs, the graph pool), and nothing changes on an x86 host's time."""
    from dse.perfmodel.model import predict_layout
    from dse.recipes.models import RECIPES

    arch = RECIPES["nemotron4_340b"].arch
    lay = dict(num_gpus=128, tp=8, pp=4, vp=12, mbs=1, gbs=32, seq_length=4096, precision="fp8", tp_comm_overlap=True)
    # a host slower than these layers (12 ms per layer; the fitted time is whatever the published rows give)
    lay["params"] = DEFAULT_PARAMS.with_values(host_layer_s_grace=0.012)
    none = predict_layout(arch, "gb200", **lay)
    full = predict_layout(arch, "gb200", cuda_graph="local", **lay)
    attn = predict_layout(arch, "gb200", cuda_graph="transformer_engine", cuda_graph_scope="attn", **lay)
    it = predict_layout(arch, "gb200", cuda_graph="local", cuda_graph_scope="full_iteration", **lay)
    assert none.breakdown["time.host_wait_s"] > 0.0 and full.breakdown["time.host_wait_s"] == 0.0
    saved = none.step_time_s - full.step_time_s
    overhead = none.breakdown["time.host_wait_s"] + none.breakdown["time.layer_compute_s"]
    overhead -= full.breakdown["time.layer_compute_s"]
    # what the step saves is the host's wait and the launch overhead, in every micro-batch slot and the bubble
    # (the DP and pipeline transfers it overlaps with move a little with the slot)
    bubble = none.breakdown["time.bubble_s"] - full.breakdown["time.bubble_s"]
    assert saved == pytest.approx(overhead + bubble, rel=0.01)
    assert none.step_time_s > attn.step_time_s > full.step_time_s
    assert it.step_time_s == pytest.approx(full.step_time_s)
    # memory: static buffers for per-layer graphs, the pool for both
    assert none.breakdown["mem.cuda_graphs_gib"] == 0.0
    assert full.peak_memory_gib > it.peak_memory_gib > none.peak_memory_gib
    assert full.breakdown["mem.cuda_graphs_gib"] > it.breakdown["mem.cuda_graphs_gib"] > 0.0
    # x86 (B200): no host term to remove, only the launch overhead of the captured layers
    b_none, b_full = (predict_layout(arch, "b200", cuda_graph=g, **lay) for g in ("none", "local"))
    assert b_none.breakdown["time.host_wait_s"] == b_full.breakdown["time.host_wait_s"] == 0.0
    assert b_full.step_time_s < b_none.step_time_s < 1.01 * b_full.step_time_s


def test_master_weight_remainders_shrink_the_optimizer_shard_by_two_bytes_per_parameter():
    """NeMo 1's distributed_fused_adam keeps the fp32 master weight as a 16-bit remainder beside the bf16 weight: the
    optimizer shard holds 2 + 4 + 4 bytes per parameter instead of 4 + 4 + 4, over the data-parallel ranks."""
    from dse.perfmodel.stack import PUBLISHED_STACKS, published_stack_name
    from dse.perfmodel.trials import make_trial
    from dse.recipes.models import RECIPES

    name = published_stack_name("native_fused", bf16_grads=True, param_remainders=True)
    assert PUBLISHED_STACKS[name].master_param_bytes == 2.0
    assert PUBLISHED_STACKS[published_stack_name("native_fused", bf16_grads=True)].master_param_bytes == 4.0
    rec = RECIPES["llama3_70b"]
    kw = dict(tp=4, pp=4, vp=5, cp=2, mbs=1, gbs=128, seq_length=8192, precision="bf16")
    full, rem = (
        predict(make_trial(rec, "h100", 64, payload=published_stack_name("native_fused", True, r), **kw))
        for r in (False, True)
    )
    saved = full.breakdown["mem.states_gib"] - rem.breakdown["mem.states_gib"]
    # bf16 weight and gradient, the optimizer sharded over data x context parallelism (2 x 2)
    params_per_gpu = full.breakdown["mem.states_gib"] * 2**30 / (2 + 2 + 12 / 4)
    assert saved == pytest.approx(2.0 / 4 * params_per_gpu / 2**30, rel=0.01)
    assert rem.tokens_per_s_per_gpu == pytest.approx(full.tokens_per_s_per_gpu)


def test_blackwell_bf16_gemms_hold_the_share_of_their_matmul_ceiling_that_fp8_does():
    """Blackwell's bf16 GEMMs run at the fitted FP8 efficiency times the ratio of the measured bf16 and FP8 matmul
    ceilings (Params.bf16_over_fp8_eff_blackwell); Hopper's at the measured bf16 ceiling (gemm_eff_bf16). A bf16 run
    on GB200 is therefore slower than the bf16 peak ratio over H100 says, and a bf16 run's step time on Blackwell
    moves with the ratio while Hopper's does not."""
    from dse.perfmodel.layout import bf16_gemm_efficiency
    from dse.perfmodel.model import predict_layout
    from dse.recipes.models import RECIPES

    P = DEFAULT_PARAMS
    assert bf16_gemm_efficiency(P, "blackwell") == pytest.approx(
        P.gemm_eff_fp8_blackwell * P.bf16_over_fp8_eff_blackwell
    )
    assert bf16_gemm_efficiency(P, "hopper") == P.gemm_eff_bf16
    arch = RECIPES["llama3_70b"].arch
    lay = dict(num_gpus=64, tp=4, pp=4, vp=5, mbs=1, gbs=128, seq_length=8192, precision="bf16")
    faster = P.with_values(bf16_over_fp8_eff_blackwell=2 * P.bf16_over_fp8_eff_blackwell)
    assert (
        predict_layout(arch, "b200", params=faster, **lay).step_time_s < predict_layout(arch, "b200", **lay).step_time_s
    )
    assert (
        predict_layout(arch, "h100", params=faster, **lay).step_time_s
        == predict_layout(arch, "h100", **lay).step_time_s
    )
