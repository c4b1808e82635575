"""Megatron-Core's MoE rules beyond the one breaking point per rule of test_constraints.py: which payload's flex
kernels run where, each requirement of the all-to-all overlap, uneven pipeline stages and their spelling."""

from __future__ import annotations

import pytest

from dse.facts import knobs
from dse.recipes.models import RECIPES
from dse.rules import constraints
from tests.test_constraints import make


def rules(**kw) -> list[str]:
    return [r.rule for r in constraints.check_all(make(**kw))]


def test_a_dense_space_varying_a_moe_knob_keeps_each_point_once():
    varied = dict(varied=("moe_dispatcher",), first_listed={"moe_dispatcher": "alltoall"})
    assert rules(moe_dispatcher="alltoall", **varied) == []
    assert rules(moe_dispatcher="allgather", **varied) == ["dense_takes_no_moe_knobs"]
    # the same knob on a MoE model is a real choice
    assert rules(recipe="mixtral_8x7b", moe_dispatcher="allgather", **varied) == []
    assert rules(etp=2) == ["dense_takes_no_moe_knobs"]


@pytest.mark.parametrize(
    ("gpu", "payload", "ok"),
    [
        ("h100", "nemo2", True),  # DeepEP on Hopper, as NVIDIA's NeMo 2 DeepSeek-V3 script runs it
        ("b200", "nemo2", True),
        ("gb200", "nemo2", False),  # DeepEP: not on Grace-Blackwell (Bridge's validate_flex_dispatcher_backend)
        ("gb200", "mbridge", True),  # HybridEP: NVIDIA's GB200 presets
        ("gb300", "mcore", True),
        ("gb300", "sim", False),  # the simulated payload is spelled as NeMo 2
        ("gb200", "published:te", True),  # NVIDIA's published flex rows are Megatron-Bridge's
    ],
)
def test_the_flex_kernels_run_on_the_gpus_their_backend_supports(gpu, payload, ok):
    from dataclasses import replace

    t = make(recipe="qwen3_30b_a3b", gpu=gpu, tp=1, pp=1, ep=8, num_nodes=2, moe_dispatcher="flex")
    got = constraints.check_all(replace(t, payload=payload))
    assert ([r.rule for r in got] == []) is ok, got
    if not ok:
        assert f"on {gpu}" in got[0].reason and "deepep" in got[0].reason


def test_allgather_cannot_carry_deepseeks_overlapped_shared_experts():
    kw = dict(recipe="deepseek_v3", tp=2, pp=16, ep=64, num_nodes=128, gbs=8192, pp_first_layers=4, pp_last_layers=1)
    assert rules(**kw) == []
    assert rules(moe_dispatcher="allgather", **kw) == ["moe_dispatcher_supported"]
    assert rules(recipe="mixtral_8x7b", moe_dispatcher="allgather") == []  # no shared experts


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (dict(ep=1), "ep > 1"),
        (dict(moe_dispatcher="allgather"), "alltoall or flex"),
        (dict(vp=1), "vp > 1"),
        (dict(recompute="full"), "full recompute"),
        (dict(recompute="selective", recompute_modules="moe"), "recompute_modules"),
    ],
)
def test_each_requirement_of_the_all_to_all_overlap(change, says):
    good = dict(recipe="mixtral_8x7b", moe_a2a_overlap=True, ep=8, vp=2)
    assert rules(**good) == []
    got = constraints.check_all(make(**{**good, **change}))
    assert [r.rule for r in got] == ["moe_a2a_overlap_supported"] and says in got[0].reason
    assert "moe_a2a_overlap" in got[0].knobs


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        (dict(pp=1, tp=8, pp_first_layers=4), "needs pp > 1"),
        (dict(pp=2, tp=8, pp_first_layers=20, pp_last_layers=20), "leave 0"),
        (dict(pp=2, tp=8, pp_first_layers=20, pp_last_layers=10), "leave 2 of the 32 layers for 0 middle"),
        (dict(pp=4, pp_first_layers=4, pp_last_layers=4, vp=5), "24 layers left"),
    ],
)
def test_uneven_stages_as_megatron_checks_them(kw, says):
    got = constraints.check_all(make(recipe="mixtral_8x7b", **kw))
    assert [r.rule for r in got] == ["uneven_stages"] and says in got[0].reason, got


def test_uneven_stages_replace_the_even_split_rule():
    # 61 layers split by no pp: DeepSeek-V3 runs on uneven stages only
    kw = dict(recipe="deepseek_v3", tp=2, pp=8, ep=64, num_nodes=128, gbs=8192)
    assert rules(**kw) == ["layers_divisible"]
    assert rules(pp_first_layers=7, pp_last_layers=6, **kw) == []  # vp 1: 7 + 6 x 8 + 6
    # with interleaving the first and last stages need not divide by vp (dse spells a layout)
    assert rules(pp_first_layers=7, pp_last_layers=6, vp=4, **kw) == []
    assert make(pp_first_layers=7, pp_last_layers=6, **kw).pipeline_layers == 61


@pytest.mark.parametrize(
    ("pp", "vp", "first", "last", "nvidia"),
    [
        # Megatron-Bridge scripts/performance/configs/deepseek/deepseek_workload_base_configs.py (H100 V1, GB300
        # FP8-MX V1) and recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout (4, 4)
        (8, 4, 7, 6, "Et|" + "tt|" * 30 + "mL"),
        (2, 8, 32, 29, "Etttt|" + "tttt|" * 14 + "tmL"),
        (4, 4, 16, 13, "Etttt|" + "tttt|" * 14 + "tmL"),
    ],
)
def test_the_layout_of_an_uneven_interleaved_split_is_nvidias(pp, vp, first, last, nvidia):
    assert knobs.pipeline_layout(61, pp, vp, first, last, mtp_layers=1) == nvidia


def _split(recipe: str, flavour: str, **values) -> list[str]:
    arch = RECIPES[recipe].arch
    return knobs.pipeline_split_overrides(
        arch.num_layers, values, flavour, mtp_layers=arch.mtp_layers, explicit=arch.is_moe
    )


def test_the_split_is_spelled_for_both_payloads():
    # no interleaving: Megatron's first / last stage sizes
    assert _split("deepseek_v3", "nemo2", pp=16, vp=1, pp_first_layers=4, pp_last_layers=1) == [
        "trainer.strategy.account_for_embedding_in_pipeline_split=false",
        "trainer.strategy.account_for_loss_in_pipeline_split=false",
        "trainer.strategy.num_layers_in_first_pipeline_stage=4",
        "trainer.strategy.num_layers_in_last_pipeline_stage=1",
        "trainer.strategy.pipeline_model_parallel_layout=null",
    ]
    # interleaved: the layout
    got = _split("deepseek_v3", "mbridge", pp=8, vp=4, pp_first_layers=7, pp_last_layers=6)
    assert got[2:] == [
        "model.num_layers_in_first_pipeline_stage=null",
        "model.num_layers_in_last_pipeline_stage=null",
        "model.pipeline_model_parallel_layout=Et|" + "tt|" * 30 + "mL",
    ]
    # an even split of a MoE recipe clears the recipe's own (NeMo's DeepSeek-V3 sets first 3 and last 2)
    assert _split("mixtral_8x7b", "nemo2", pp=4, vp=1)[2:] == [
        "trainer.strategy.num_layers_in_first_pipeline_stage=null",
        "trainer.strategy.num_layers_in_last_pipeline_stage=null",
        "trainer.strategy.pipeline_model_parallel_layout=null",
    ]
    # a dense recipe's scripts stay as they were
    assert len(_split("llama3_70b", "nemo2", pp=4, vp=5)) == 2


def test_the_megatron_core_payload_gets_stage_sizes_and_no_layout():
    # recipes.mcore builds the model from recipes.models: there is no recipe layout to clear, and it takes none
    got = _split("deepseek_v3", "mcore", pp=8, vp=4, pp_first_layers=7, pp_last_layers=6)
    assert got[2:] == ["model.num_layers_in_first_pipeline_stage=7", "model.num_layers_in_last_pipeline_stage=6"]
    assert _split("mixtral_8x7b", "mcore", pp=4, vp=1)[2:] == [
        "model.num_layers_in_first_pipeline_stage=null",
        "model.num_layers_in_last_pipeline_stage=null",
    ]
    scaled = knobs.scaled_overrides(RECIPES["deepseek_v3_2node"], "mcore")
    assert scaled == ["model.num_layers=8", "model.num_moe_experts=64"]


def _published_rows() -> list[dict[str, str]]:
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "data" / "published_moe.tsv"
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.mark.parametrize("row", _published_rows(), ids=lambda r: r["id"])
def test_no_moe_rule_refuses_a_layout_nvidia_ran(row):
    """NVIDIA's published MoE layouts (Megatron-Bridge rows, the mbridge payload) pass every MoE rule."""
    from dse.perfmodel.trials import make_trial

    ints = ("tp", "pp", "cp", "vp", "mbs", "gbs", "seq_length", "ep", "etp", "pp_first_layers", "pp_last_layers")
    values = {k: int(row[k]) for k in ints}
    values.update(precision=row["precision"], moe_dispatcher=row["moe_dispatcher"])
    values["moe_a2a_overlap"] = row["moe_a2a_overlap"] == "1"
    if row["fp8_recipe"]:
        values["fp8_recipe"] = row["fp8_recipe"]
    t = make_trial(RECIPES[row["model"]], row["gpu"], int(row["num_gpus"]), payload="mbridge", **values)
    moe_rules = {
        "dense_takes_no_moe_knobs",
        "ep_divides_experts",
        "expert_data_parallel",
        "etp_divides_expert_ffn",
        "moe_needs_sp",
        "moe_dispatcher_supported",
        "moe_a2a_overlap_supported",
        "moe_grouped_gemm_supported",
        "uneven_stages",
        "layers_divisible",
    }
    assert [r for r in constraints.check_all(t) if r.rule in moe_rules] == []
