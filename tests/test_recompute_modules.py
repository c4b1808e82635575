"""Fine-grained recompute (``recompute_modules``) and NCCL user-buffer registration (``nccl_ub``): their
spellings per payload, their rules and the direction of their model terms."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dse.errors import UserError
from dse.facts import knobs
from dse.launch import build_plan
from dse.perfmodel.model import predict_layout
from dse.recipes.models import RECIPES
from dse.rules import constraints
from dse.rules.trial import resolve
from tests.trials import space, system

runner = CliRunner()
ARCH = RECIPES["llama3_70b"].arch
H100_70B = dict(num_gpus=64, tp=4, pp=4, vp=5, gbs=128, seq_length=8192, precision="fp8")


def _trial(payload: str = "nemo2", recipe: str = "llama3_70b", gpu: str = "h100", num_nodes: int = 8, **values):
    sp = space(recipe, system(gpu), num_nodes, values, backend={"kind": "sim", "payload": payload})
    return resolve(sp, {})


# ---- recompute_modules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, canonical",
    [("mlp,core_attn", "core_attn,mlp"), (["layernorm", "mlp", "mlp"], "layernorm,mlp"), (" mlp ", "mlp")],
)
def test_a_set_of_modules_has_one_spelling(given, canonical):
    assert knobs.get("recompute_modules").coerce(given) == canonical


@pytest.mark.parametrize(
    "bad, says", [("mlp,atn", "'atn' is not a module"), ("", "no module given"), (3, "not a list")]
)
def test_a_bad_module_list_is_a_one_line_error_naming_the_allowed_ones(bad, says):
    with pytest.raises(UserError, match=says) as e:
        knobs.get("recompute_modules").coerce(bad, file="s.toml", field="settings.recompute_modules")
    assert "core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_space_lists_combinations_and_the_trial_holds_the_canonical_one():
    t = _trial(recompute="selective", recompute_modules="mlp,layernorm")
    assert t.layout.recompute_modules == "layernorm,mlp"
    assert constraints.check(t) is None


def test_a_space_file_holds_each_set_in_one_spelling_and_refuses_the_same_set_twice():
    sp = space("llama3_70b", system("h100"), 8, {"recompute": "selective"}, {"recompute_modules": ["mlp,core_attn"]})
    assert sp.knobs["recompute_modules"] == ["core_attn,mlp"]
    fixed = space("llama3_70b", system("h100"), 8, {"recompute_modules": ["mlp", "layernorm"]})
    assert fixed.settings["recompute_modules"] == "layernorm,mlp"
    with pytest.raises(UserError, match="duplicate values"):
        space("llama3_70b", system("h100"), 8, {}, {"recompute_modules": ["mlp,core_attn", "core_attn,mlp"]})


def test_spelled_as_the_perf_scripts_spell_them():
    values = dict(recompute="selective", recompute_modules="layernorm,mlp")
    assert knobs.overrides(values, "mbridge") == [
        "model.recompute_granularity=selective",
        "model.recompute_method=null",
        "model.recompute_num_layers=null",
        "model.recompute_modules=[layernorm,mlp]",
    ]
    nemo = knobs.overrides(values, "nemo2")
    assert nemo[0] == "model.config.recompute_granularity=selective"
    assert nemo[-1] == "model.config.recompute_modules=['layernorm','mlp']"
    # Megatron-Core's own default (core_attn) needs no override, so existing launches are unchanged
    assert not any("recompute_modules" in o for o in knobs.overrides(dict(recompute="selective"), "mbridge"))


def test_the_mcore_payload_reads_the_modules_and_checks_them():
    from dse.recipes.mcore.config import ConfigError, check, config_from_argv

    t = _trial("mcore", recipe="llama3_8b", num_nodes=1, tp=1, pp=1, cp=1, vp=1, gbs=8, recompute="selective")
    values = dict(t.values, recompute_modules="layernorm,mlp")
    args = list(knobs.payload_args("mcore", t.recipe, values, gpu="h100", gpus_per_node=8))
    assert "model.recompute_modules=[layernorm,mlp]" in args
    cfg = check(config_from_argv(args)[0], 8)
    assert (cfg.recompute, cfg.recompute_modules) == ("selective", "layernorm,mlp")
    with pytest.raises(ConfigError, match="needs recompute=selective"):
        check(config_from_argv([*args, "model.recompute_granularity=null"])[0], 8)
    with pytest.raises(ConfigError, match="this model's layers have core_attn, layernorm, mlp$"):
        check(config_from_argv([*args, "model.recompute_modules=[moe_act]"])[0], 8)
    # multi-latent attention's up-projections are a module of an MLA model's layers only
    with pytest.raises(ConfigError, match="this model's layers have"):
        check(config_from_argv([*args, "model.recompute_modules=[mla_up_proj]"])[0], 8)


def test_modules_need_selective_recompute_and_a_moe_model_for_moe_modules():
    why = constraints.check(_trial(recompute="full", recompute_modules="mlp"))
    assert why is not None and why.rule == "recompute_modules_need_selective" and "selective" in why.reason
    why = constraints.check(_trial(recompute="selective", recompute_modules="core_attn,moe_act"))
    assert why is not None and why.rule == "recompute_modules_fit_model" and "dense" in why.reason
    delayed = _trial(recompute="selective", recompute_modules="layernorm", precision="fp8", fp8_recipe="delayed")
    assert constraints.check(delayed).rule == "recompute_modules_fit_model"


def test_recomputing_the_mlp_saves_memory_and_costs_time():
    base = predict_layout(ARCH, "h100", recompute="selective", **H100_70B)
    mlp = predict_layout(ARCH, "h100", recompute="selective", recompute_modules="core_attn,mlp", **H100_70B)
    ln = predict_layout(ARCH, "h100", recompute="selective", recompute_modules="core_attn,layernorm", **H100_70B)
    assert mlp.peak_memory_gib < base.peak_memory_gib - 10  # the MLP's saved inputs: most of a layer's
    assert mlp.step_time_s > base.step_time_s
    assert mlp.breakdown.time.recompute_s > base.breakdown.time.recompute_s
    # Transformer Engine fuses a dense layer's norms into the next linear, and MoE modules have no MoE layer to
    # recompute: both priced as zero on a dense model
    moe = predict_layout(ARCH, "h100", recompute="selective", recompute_modules="core_attn,moe_act", **H100_70B)
    for same in (ln, moe):
        assert (same.step_time_s, same.peak_memory_gib) == (base.step_time_s, base.peak_memory_gib)


def test_dse_predict_takes_the_modules_and_refuses_a_bad_one():
    args = ["predict", "--model", "llama3_70b", "--gpu", "h100", "--num-gpus", "64", "--tp", "4", "--pp", "4"]
    res = runner.invoke(app_(), [*args, "--recompute", "selective", "--recompute-modules", "mlp", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["peak_memory_gib"] > 0
    bad = runner.invoke(app_(), [*args, "--recompute", "selective", "--recompute-modules", "mpl"])
    assert bad.exit_code == 2 and "did you mean 'mlp'" in bad.output and "Traceback" not in bad.output


def app_():
    from dse.cli import app

    return app


# ---- nccl_ub ---------------------------------------------------------------------------------------------------


def test_nccl_ub_spelled_with_what_the_perf_scripts_set_beside_it():
    assert knobs.overrides({"nccl_ub": False}, "mbridge") == []
    assert knobs.overrides({"nccl_ub": True}, "mbridge") == ["ddp.nccl_ub=true", "ddp.average_in_collective=false"]
    fsdp = knobs.overrides({"nccl_ub": True, "fsdp": True}, "mbridge")
    assert {"ddp.fsdp_manual_registration=true", "ddp.fsdp_double_buffer=true", "ddp.nccl_ub=true"} <= set(fsdp)
    assert knobs.overrides({"nccl_ub": True, "fsdp": True}, "nemo2") == [
        "trainer.strategy.ddp.nccl_ub=true",
        "trainer.strategy.ddp.fsdp_double_buffer=true",
    ]
    plan = build_plan(
        _trial("mbridge", gpu="gb200", num_nodes=16, tp=1, pp=1, vp=1, fsdp=True, nccl_ub=True), payload="mbridge"
    )
    assert plan.env["NCCL_NVLS_ENABLE"] == "1" and plan.env["NCCL_CTA_POLICY"] == "1"


def test_nccl_ub_rules():
    assert constraints.check(_trial("mbridge", nccl_ub=True)) is None
    assert constraints.check(_trial("mcore", nccl_ub=True, tp_comm_overlap=False)).rule == "nccl_ub_supported"
    alloc = _trial("mbridge", nccl_ub=True, **{"env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    why = constraints.check(alloc)
    assert why.rule == "nccl_ub_supported" and "expandable_segments" in why.reason


def test_nccl_ub_speeds_dp_collectives_inside_an_nvlink_domain_and_holds_memory():
    """70B with FSDP on 64 GB200 (one NVL72 domain): the FSDP traffic runs on NVLink SHARP; on 64 H100 the data-
    parallel ring crosses the NICs and gains nothing. Both hold the registration's memory."""
    gb = dict(num_gpus=64, tp=1, pp=1, gbs=128, seq_length=8192, fsdp=True, cpu_offload_layers=20)
    off, on = (predict_layout(ARCH, "gb200", nccl_ub=u, **gb) for u in (False, True))
    assert on.breakdown.time.dp_exposed_s < off.breakdown.time.dp_exposed_s
    assert on.step_time_s < off.step_time_s
    assert on.peak_memory_gib > off.peak_memory_gib
    h_off, h_on = (predict_layout(ARCH, "h100", nccl_ub=u, **H100_70B) for u in (False, True))
    assert h_on.breakdown.time.dp_exposed_s == h_off.breakdown.time.dp_exposed_s
