"""Each validity rule fires on a point that breaks it, and only that rule's reason is given."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from dse.facts import knobs
from dse.recipes.models import RECIPES
from dse.rules import constraints
from dse.rules.space import load_system
from dse.rules.trial import TrialConfig


def make(recipe="llama3_70b", gpu="h100", **kw) -> TrialConfig:
    values = {n: k.default for n, k in knobs.CATALOGUE.items()}
    values.update(tp=4, pp=4, cp=1, vp=1, mbs=1, gbs=128, seq_length=8192, num_nodes=8, precision="bf16")
    system_kw = kw.pop("system", {})
    space_kw = {k: kw.pop(k) for k in ("varied", "first_listed", "payload", "env") if k in kw}
    values.update(kw)
    system = load_system(gpu).model_copy(update=system_kw)
    return TrialConfig(recipe=RECIPES[recipe], system=system, values=MappingProxyType(values), **space_kw)


def test_baseline_is_valid():
    assert constraints.check(make()) is None


_G = {"cuda_graph": "none", "cuda_graph_scope": "full"}  # a space's first listed graph values
_EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

# rule -> (breaking point, a nearby valid point)
CASES = {
    "world_divisible": (dict(tp=4, pp=4, num_nodes=3), dict(tp=4, pp=4, num_nodes=4)),
    "heads_divisible": (
        dict(recipe="nemotron4_15b", tp=16, pp=1, num_nodes=2, system={"nvlink_domain": 16}, gbs=32),
        dict(recipe="nemotron4_15b", tp=8, pp=1, num_nodes=2, gbs=32),
    ),
    "layers_divisible": (dict(pp=4, vp=3), dict(pp=4, vp=5)),  # 80 and 82 layers: neither divides by 12
    "vp_needs_pp": (dict(pp=1, vp=2, tp=8), dict(pp=2, vp=2, tp=8)),
    "gbs_divisible": (dict(gbs=102), dict(gbs=104)),
    "interleaved_microbatches": (
        dict(tp=4, pp=4, vp=5, gbs=6, num_nodes=2),
        dict(tp=4, pp=4, vp=5, gbs=8, num_nodes=2),
    ),
    "seq_divisible": (dict(cp=2, tp=2, pp=2, seq_length=8190), dict(cp=2, tp=2, pp=2, seq_length=8192)),
    "sp_needs_tp": (dict(tp=1, pp=4, sp=True), dict(tp=1, pp=4, sp=False)),
    # Mixtral 8x7B (8 experts, expert FFN 14336) on 64 H100 at tp 4, pp 4: 16 GPUs in a pipeline stage
    "dense_takes_no_moe_knobs": (dict(ep=2), dict(ep=1)),
    "ep_divides_experts": (dict(recipe="mixtral_8x7b", ep=16), dict(recipe="mixtral_8x7b", ep=8)),
    "expert_data_parallel": (dict(recipe="mixtral_8x7b", ep=8, etp=4), dict(recipe="mixtral_8x7b", ep=4, etp=4)),
    "etp_divides_expert_ffn": (
        dict(recipe="mixtral_8x7b", etp=3, num_nodes=6, gbs=129),
        dict(recipe="mixtral_8x7b", etp=2, num_nodes=6, gbs=129),
    ),
    "moe_needs_sp": (dict(recipe="mixtral_8x7b", sp=False), dict(recipe="mixtral_8x7b", sp=True)),
    "moe_dispatcher_supported": (
        dict(recipe="mixtral_8x7b", moe_dispatcher="flex"),
        dict(recipe="mixtral_8x7b", moe_dispatcher="flex", ep=8),
    ),
    "moe_a2a_overlap_supported": (
        dict(recipe="mixtral_8x7b", moe_a2a_overlap=True, ep=8),
        dict(recipe="mixtral_8x7b", moe_a2a_overlap=True, ep=8, vp=2),
    ),
    "moe_grouped_gemm_supported": (
        dict(recipe="mixtral_8x7b", moe_grouped_gemm=False, recompute="selective", recompute_modules="moe_act"),
        dict(recipe="mixtral_8x7b", moe_grouped_gemm=True, recompute="selective", recompute_modules="moe_act"),
    ),
    "moe_token_drop_supported": (
        dict(recipe="mixtral_8x7b", moe_token_drop=True, moe_dispatcher="allgather", ep=8),
        dict(recipe="mixtral_8x7b", moe_token_drop=True, moe_dispatcher="alltoall", ep=8),
    ),
    "uneven_stages": (
        dict(recipe="mixtral_8x7b", pp_first_layers=7, pp_last_layers=6),
        dict(recipe="mixtral_8x7b", pp_first_layers=6, pp_last_layers=6),
    ),
    "fp8_needs_hopper": (dict(gpu="a100", precision="fp8"), dict(gpu="a100", precision="bf16")),
    "nvfp4_needs_blackwell": (
        dict(gpu="h100", precision="nvfp4", payload="mbridge"),
        dict(gpu="b200", precision="nvfp4", payload="mbridge"),
    ),
    "nvfp4_payload": (
        dict(gpu="gb300", precision="nvfp4", payload="nemo2"),
        dict(gpu="gb300", precision="nvfp4", payload="mbridge"),
    ),
    # 8200 tokens per micro-batch: not a multiple of NVFP4's 32
    "nvfp4_dims_aligned": (
        dict(gpu="b300", precision="nvfp4", payload="mbridge", seq_length=8200),
        dict(gpu="b300", precision="nvfp4", payload="mbridge", seq_length=8192),
    ),
    "nvfp4_no_tp_comm_overlap": (
        dict(gpu="gb300", precision="nvfp4", payload="mbridge", tp=2, tp_comm_overlap=True),
        dict(gpu="gb300", precision="nvfp4", payload="mbridge", tp=2, tp_comm_overlap=False),
    ),
    "tp_within_nvlink": (
        dict(recipe="nemotron3_8b", tp=16, pp=1, num_nodes=2, gbs=32, seq_length=4096),
        dict(recipe="nemotron3_8b", tp=8, pp=1, num_nodes=2, gbs=32, seq_length=4096),
    ),
    "recompute_layers_in_stage": (
        dict(recompute="full", recompute_num_layers=21, pp=4),
        dict(recompute="full", recompute_num_layers=20, pp=4),
    ),
    "fsdp_no_pp": (dict(fsdp=True, pp=2, tp=4), dict(fsdp=True, pp=1, tp=4)),
    "tp_comm_overlap_needs_tp": (dict(tp_comm_overlap=True, tp=1, pp=4), dict(tp_comm_overlap=True, tp=4, pp=4)),
    "cpu_offload_supported": (dict(cpu_offload_layers=40, pp=4), dict(cpu_offload_layers=40, pp=1, tp=8, gbs=64)),
    # Llama 3 70B (hidden 8192) has an H100 userbuffer config at tp=4, none at tp=2
    "cp_needs_te_attention": (
        dict(cp=2, tp=4, pp=4, num_nodes=8, attention_backend="unfused"),
        dict(cp=2, tp=4, pp=4, num_nodes=8, attention_backend="flash"),
    ),
    "tp_comm_overlap_supported": (dict(tp_comm_overlap=True, tp=2, pp=4), dict(tp_comm_overlap=True, tp=4, pp=4)),
    "recompute_modules_need_selective": (
        dict(recompute="none", recompute_modules="mlp"),
        dict(recompute="selective", recompute_modules="mlp"),
    ),
    # Llama 3 70B is dense: MoE modules recompute nothing there
    "recompute_modules_fit_model": (
        dict(recompute="selective", recompute_modules="moe_act"),
        dict(recompute="selective", recompute_modules="layernorm,mlp"),
    ),
    # tp 8 x pp 8 on 64 GPUs: dp = 1, no data-parallel buffers to register
    "nccl_ub_supported": (dict(nccl_ub=True, tp=8, pp=8), dict(nccl_ub=True, tp=4, pp=4)),
    # a space varying precision and fp8_recipe: a bf16 point is kept once, with the first recipe listed
    "fp8_recipe_needs_fp8": (
        dict(
            precision="bf16",
            fp8_recipe="tensorwise",
            varied=("precision", "fp8_recipe"),
            first_listed={"precision": "bf16", "fp8_recipe": "delayed"},
        ),
        dict(
            precision="bf16",
            fp8_recipe="delayed",
            varied=("precision", "fp8_recipe"),
            first_listed={"precision": "bf16", "fp8_recipe": "delayed"},
        ),
    ),
    # CUDA graphs (Megatron-Core's TransformerConfig checks, and what each payload can spell)
    "cuda_graph_scope_needs_graph": (
        dict(cuda_graph="none", cuda_graph_scope="attn", varied=("cuda_graph", "cuda_graph_scope"), first_listed=_G),
        dict(cuda_graph="none", cuda_graph_scope="full", varied=("cuda_graph", "cuda_graph_scope"), first_listed=_G),
    ),
    "cuda_graph_scope_impl": (
        dict(cuda_graph="transformer_engine", cuda_graph_scope="full_iteration", payload="mbridge"),
        dict(cuda_graph="local", cuda_graph_scope="full_iteration", payload="mbridge"),
    ),
    "cuda_graph_scope_fits_arch": (
        dict(cuda_graph="transformer_engine", cuda_graph_scope="moe_router", payload="mbridge"),
        dict(cuda_graph="transformer_engine", cuda_graph_scope="attn", payload="mbridge"),
    ),
    "cuda_graph_no_offload": (
        dict(cuda_graph="local", cpu_offload_layers=40, pp=1, tp=8, gbs=64),
        dict(cuda_graph="none", cpu_offload_layers=40, pp=1, tp=8, gbs=64),
    ),
    "cuda_graph_recompute": (
        dict(cuda_graph="local", recompute="full"),
        dict(cuda_graph="local", cuda_graph_scope="full_iteration", recompute="full", payload="mbridge"),
    ),
    "cuda_graph_fsdp_hooks": (
        dict(cuda_graph="local", fsdp=True, pp=1, tp=8, gbs=64, payload="mbridge"),
        dict(cuda_graph="local", cuda_graph_scope="full_iteration", fsdp=True, pp=1, tp=8, gbs=64, payload="mbridge"),
    ),
    "cuda_graph_te_allocator": (
        dict(cuda_graph="transformer_engine", cuda_graph_scope="attn", payload="mbridge", env=_EXPANDABLE),
        dict(
            cuda_graph="transformer_engine",
            cuda_graph_scope="attn",
            payload="mbridge",
            env={**_EXPANDABLE, "NCCL_GRAPH_REGISTER": "0"},
        ),
    ),
    "cuda_graph_payload": (
        dict(cuda_graph="transformer_engine", cuda_graph_scope="attn"),
        dict(cuda_graph="transformer_engine", cuda_graph_scope="attn", payload="mbridge"),
    ),
}


def test_a_space_varying_precision_and_fp8_recipe_runs_each_bf16_point_once(tmp_path):
    from dse.rules.counting import count_valid
    from dse.rules.space import load_space

    space = load_space(Path(__file__).parents[1] / "conf/spaces/llama3_8b_4l_h200_te_space.toml")
    assert space.size == 32
    # 2 mbs x 2 recompute x 2 attention x (bf16 once + fp8 with each of the two recipes)
    assert count_valid(space).valid == 24
    # an fp8 point keeps every recipe; a recipe the space does not vary is never a reason to reject
    assert (
        constraints.check(
            make(
                precision="fp8",
                fp8_recipe="tensorwise",
                varied=("precision", "fp8_recipe"),
                first_listed={"precision": "bf16", "fp8_recipe": "delayed"},
            )
        )
        is None
    )
    assert (
        constraints.check(
            make(precision="bf16", fp8_recipe="tensorwise", varied=("precision",), first_listed={"precision": "bf16"})
        )
        is None
    )


def test_every_rule_has_a_case():
    assert set(CASES) == set(constraints.all_rules())


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires_and_clears(rule):
    bad, good = CASES[rule]
    rejected = constraints.check_all(make(**bad))
    assert [r.rule for r in rejected] == [rule], rejected
    assert rejected[0].reason and "\n" not in rejected[0].reason
    # the knobs the reason is about, by their catalogue names (dse predict points at them)
    assert rejected[0].knobs and set(rejected[0].knobs) <= set(knobs.CATALOGUE), rejected[0]
    assert rule not in [r.rule for r in constraints.check_all(make(**good))]


def test_layers_count_embedding_and_loss_when_that_makes_the_split_even():
    # Llama 3.1 405B: 126 layers; NVIDIA's layout pp=8, vp=8 splits 128 = 126 + embedding + loss.
    t = make(recipe="llama3_405b", tp=8, pp=8, vp=8, cp=2, num_nodes=128, gbs=512)
    assert t.pipeline_layers == 128 and constraints.check(t) is None
    assert make(recipe="llama3_405b", tp=8, pp=7, num_nodes=112, gbs=512).pipeline_layers == 126


def test_mxfp8_needs_blackwell():
    assert constraints.check(make(precision="fp8", fp8_recipe="mxfp8")).rule == "fp8_needs_hopper"
    assert constraints.check(make(gpu="b200", precision="fp8", fp8_recipe="mxfp8")) is None


def test_gb200_tp_may_span_trays_within_the_nvl72_domain():
    t = make(gpu="gb200", recipe="llama3_405b", tp=8, pp=8, num_nodes=32, gbs=128)  # 4 GPUs per tray
    assert constraints.check(t) is None


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(cpu_offload_layers=80, pp=1, tp=8, gbs=64), "less than the model's 80 layers"),
        (dict(cpu_offload_layers=79, pp=1, tp=8, gbs=64, recompute="selective"), "needs recompute=none"),
        (dict(cpu_offload_layers=79, pp=2, tp=8), "needs pp=1"),
    ],
)
def test_cpu_offload_follows_megatron_core(kw, words):
    """Megatron-Core's TransformerConfig refuses offloading all layers, with pp > 1, and with recompute."""
    assert [(r.rule, words in r.reason) for r in constraints.check_all(make(**kw))] == [("cpu_offload_supported", True)]
    assert constraints.check(make(**dict(kw, cpu_offload_layers=0))) is None


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(cuda_graph="local", payload="mcore"), "recipes.mcore does not capture"),
        (dict(cuda_graph="local", cuda_graph_scope="full_iteration"), "enable_cuda_graph only"),
        (dict(cuda_graph="local", fsdp=True, pp=1, tp=8, gbs=64), "Megatron FSDP"),
        (dict(cuda_graph="local", cuda_graph_scope="mamba", payload="mbridge"), "hybrid Mamba model"),
    ],
)
def test_cuda_graph_rules_name_what_cannot_run(kw, words):
    """Megatron-Core's and the payloads' limits on graphs, each refused with its own reason."""
    rejected = constraints.check(make(**kw))
    assert rejected is not None and words in rejected.reason, rejected


def test_nvidias_graphed_presets_are_valid():
    """The layouts NVIDIA graphs pass: Bridge's Llama 3 8B GB200 preset (local, full_iteration) on the mbridge
    payload, NeMo 2's per-layer graphs (enable_cuda_graph) with pipeline parallelism, and TE's MLP graphs."""
    bridge = dict(gpu="gb200", recipe="llama3_8b", tp=1, pp=1, mbs=2, num_nodes=2, precision="fp8", payload="mbridge")
    assert constraints.check(make(cuda_graph="local", cuda_graph_scope="full_iteration", **bridge)) is None
    assert constraints.check(make(cuda_graph="transformer_engine", cuda_graph_scope="mlp", **bridge)) is None
    assert constraints.check(make(cuda_graph="local", tp=4, pp=4)) is None


def _moe_trial(**over) -> TrialConfig:
    from dataclasses import replace

    base = RECIPES["llama3_8b"]
    moe = replace(base, arch=replace(base.arch, num_experts=8))
    values = {n: k.default for n, k in knobs.CATALOGUE.items()}
    values.update(tp=1, pp=1, num_nodes=1, gbs=128, **over)
    return TrialConfig(recipe=moe, system=load_system("h100"), values=MappingProxyType(values), payload="mbridge")


@pytest.mark.parametrize(
    ("scope", "token_drop", "words"),
    [
        ("moe", False, "drop-and-pad"),
        ("moe", True, None),
        ("full", False, "the whole layer, its MoE block included"),
        ("full", True, None),
        ("mlp", False, "experts in every layer"),
        ("mlp", True, "experts in every layer"),
        ("moe_router,moe_preprocess", False, None),
    ],
)
def test_moe_graph_scopes_follow_megatron_core(scope, token_drop, words):
    """On an MoE model (every layer with experts): the router may be graphed, the whole MoE block or the whole
    layer only with drop-and-pad (``moe_token_drop``), and a dense MLP scope names nothing that exists."""
    t = _moe_trial(cuda_graph="transformer_engine", cuda_graph_scope=scope, moe_token_drop=token_drop)
    why = constraints.cuda_graph_scope_fits_arch(t)
    assert (why is None) if words is None else (why is not None and words in why.reason), why


@pytest.mark.parametrize("dispatcher", ["allgather", "flex"])
def test_token_drop_runs_on_the_alltoall_dispatcher_only(dispatcher):
    why = constraints.moe_token_drop_supported(_moe_trial(moe_token_drop=True, moe_dispatcher=dispatcher))
    assert why is not None and why.knobs == ("moe_token_drop", "moe_dispatcher") and dispatcher in why.reason
    assert constraints.moe_token_drop_supported(_moe_trial(moe_token_drop=True, moe_dispatcher="alltoall")) is None
    assert constraints.moe_token_drop_supported(_moe_trial(moe_token_drop=False, moe_dispatcher=dispatcher)) is None
