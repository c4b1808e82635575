"""``overlap_param_gather`` (Megatron-Core's DDP setting), the knob added to show the catalogue owning a knob: its
spelling per payload, what the payloads accept, and the direction and size of its model term."""

from __future__ import annotations

import pytest

from dse.facts import knobs
from dse.perfmodel.model import predict_layout
from dse.recipes.mcore.config import ConfigError, check, config_from_argv, parse_overrides
from dse.recipes.models import RECIPES
from dse.recipes.sim import __main__ as sim

ARCH = RECIPES["llama3_70b"].arch
H100_70B = dict(num_gpus=64, tp=4, pp=4, vp=5, gbs=128, seq_length=8192, precision="fp8")


def test_the_recipes_default_spells_nothing_and_off_spells_the_ddp_field():
    assert knobs.CATALOGUE["overlap_param_gather"].default is True  # NeMo 2's and Bridge's recipes set it
    for flavour in ("nemo2", "mbridge"):
        assert knobs.overrides({"overlap_param_gather": True}, flavour) == []
    assert knobs.overrides({"overlap_param_gather": False}, "nemo2") == [
        "trainer.strategy.ddp.overlap_param_gather=false"
    ]
    assert knobs.overrides({"overlap_param_gather": False}, "mbridge") == ["ddp.overlap_param_gather=false"]


def test_the_sim_and_mcore_payloads_take_it_and_mcore_refuses_what_its_loop_cannot_do():
    sim.apply_overrides(sim.base_config(), ["trainer.strategy.ddp.overlap_param_gather=false"])
    assert parse_overrides(["ddp.overlap_param_gather=false"]) == {"overlap_param_gather": False}
    check(config_from_argv(["ddp.overlap_param_gather=false"])[0], 1)
    with pytest.raises(ConfigError, match="overlap_param_gather=true"):
        check(config_from_argv(["ddp.overlap_param_gather=true"])[0], 1)


def test_without_it_the_weight_all_gather_is_exposed_whole():
    """70B on 64 H100 (data-parallel 4): off exposes the all-gather of the bf16 weights after the step, on hides it
    behind compute as far as the fitted overlap allows; one data-parallel rank has nothing to gather."""
    on, off = (predict_layout(ARCH, "h100", overlap_param_gather=o, **H100_70B) for o in (True, False))
    assert off.breakdown.time.dp_exposed_s > on.breakdown.time.dp_exposed_s
    assert off.step_time_s > on.step_time_s and off.peak_memory_gib == on.peak_memory_gib
    # at most the whole gather, which is all a step with a long overlap window (many micro-batches) exposes
    added = off.breakdown.time.dp_exposed_s - on.breakdown.time.dp_exposed_s
    alone = predict_layout(ARCH, "h100", overlap_param_gather=False, **{**H100_70B, "gbs": 16384})
    assert 0 < added <= alone.breakdown.time.dp_exposed_s
    one = dict(H100_70B, num_gpus=16)
    assert predict_layout(ARCH, "h100", overlap_param_gather=False, **one).step_time_s == pytest.approx(
        predict_layout(ARCH, "h100", **one).step_time_s
    )
