"""TP overlap per payload: each payload ships its own userbuffer configs, and the controller allows
``tp_comm_overlap`` where NVIDIA's scripts for that payload load one for the layout (dse.facts.hardware.UB_LOOKUPS)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dse.errors import UserError
from dse.launch import build_plan
from dse.recipes.mbridge import argv as bridge_argv
from dse.recipes.mbridge import userbuffers as bridge_ub
from dse.recipes.nemo2 import userbuffers as nemo_ub
from dse.rules.constraints import tp_comm_overlap_supported, userbuffer_config
from dse.rules.trial import resolve
from tests.trials import space, system

GOLDEN = Path(__file__).parent / "golden" / "dryrun"
FP8_405B = "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192"
# Llama 3.1 405B FP8 on 128 GB300 at TP 2 with FSDP and offload, the layout of Megatron-Bridge 26.02-26.04's
# LLAMA31_405B_PRETRAIN_CONFIG_GB300_FP8_CS_V1 (scripts/performance/configs/llama/llama31_workload_base_configs.py)
LAYOUT_405B_TP2 = dict(
    tp=2, pp=1, cp=1, vp=1, mbs=1, gbs=64, precision="fp8", fsdp=True, cpu_offload_layers=10, tp_comm_overlap=True
)


def _trial(payload: str, recipe: str = "llama3_405b", gpu: str = "gb300", num_nodes: int = 32, **values):
    sp = space(recipe, system(gpu), num_nodes, values, backend={"kind": "sim", "payload": payload})
    return resolve(sp, {})


def test_bridge_allows_405b_tp2_on_gb300_and_spells_its_config():
    t = _trial("mbridge", **LAYOUT_405B_TP2)
    assert t.payload == "mbridge" and t.layout.tp_comm_overlap
    assert tp_comm_overlap_supported(t) is None
    assert userbuffer_config(t) == FP8_405B
    plan = build_plan(t, payload="mbridge")
    i = plan.argv.index("--tp-comm-overlap-cfg")
    assert plan.argv[i + 1] == FP8_405B
    assert "comm_overlap.tp_comm_overlap=true" in plan.argv
    # the payload's own parser takes it: the config is loaded by name from megatron.bridge.training.comm_overlap
    parsed = bridge_argv.parse(list(plan.argv[3:]))
    assert parsed.tp_comm_overlap_cfg == FP8_405B and parsed.needs_comm_overlap


def test_bridge_dry_run_lines_match_golden():
    """The payload's command line for 405B TP 2 on GB300 (one argument a line), as ``dse dry-run`` writes it."""
    plan = build_plan(_trial("mbridge", **LAYOUT_405B_TP2), payload="mbridge")
    text = "\n".join(plan.argv) + "\n"
    path = GOLDEN / "llama3_405b_gb300_tp2_mbridge.txt"
    if os.environ.get("DSE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_auto_overlap_follows_the_payload():
    """Left unset, tp_comm_overlap is on where the payload's scripts use a config: BF16 405B at TP 2 on GB300
    runs with one on Bridge (LLAMA31_405B_PRETRAIN_CONFIG_GB300_BF16_V1) and with none on NeMo 2."""
    values = {k: v for k, v in LAYOUT_405B_TP2.items() if k != "tp_comm_overlap"} | {"precision": "bf16"}
    assert _trial("mbridge", **values).layout.tp_comm_overlap is True
    assert _trial("nemo2", **values).layout.tp_comm_overlap is False
    assert _trial("mcore", **values).layout.tp_comm_overlap is False


@pytest.mark.parametrize(
    "payload, recipe, gpu, tp, precision",
    [
        ("mbridge", "llama3_405b", "gb300", 8, "fp8"),  # Bridge's scripts run 405B at TP 2 and 4 on Blackwell only
        ("mbridge", "llama3_70b", "gb300", 4, "bf16"),  # 70B: TP 2 on the B200 family
        ("mbridge", "llama3_405b", "h100", 4, "fp8"),  # on H100 Bridge runs 405B at TP 8 only
        ("nemo2", "llama3_405b", "gb300", 2, "bf16"),  # NeMo 2's scripts: 405B at TP 2 in FP8 only
        ("mcore", "llama3_70b", "h100", 4, "bf16"),  # recipes.mcore has no userbuffers at all
    ],
)
def test_overlap_refused_where_the_payload_ships_no_config(payload, recipe, gpu, tp, precision):
    t = _trial(payload, recipe, gpu, num_nodes=16, tp=tp, pp=1, cp=1, vp=1, precision=precision, tp_comm_overlap=True)
    why = tp_comm_overlap_supported(t)
    assert why is not None and why.knobs == ("tp_comm_overlap", "tp")
    assert f"the {payload} payload" in why.reason and f"tp {tp}" in why.reason and "\n" not in why.reason
    with pytest.raises(UserError, match="userbuffer config"):
        build_plan(t, payload=payload)


def test_nemo2_runs_405b_fp8_tp2_with_the_tp4_config():
    """NeMo's pretrain_llama31_405b.py loads the B200 FP8 config at TP 2 (model_configs_gb200.csv)."""
    t = _trial("nemo2", **LAYOUT_405B_TP2)
    assert tp_comm_overlap_supported(t) is None
    assert f'tp_comm_overlap_cfg="{FP8_405B}"' in build_plan(t, payload="nemo2").argv[4]


def test_the_plan_checks_the_payload_it_builds_for():
    """A trial resolved for NeMo 2 but planned for recipes.mcore is refused: mcore has no userbuffers."""
    t = _trial("nemo2", recipe="llama3_70b", gpu="h100", num_nodes=16, tp=4, tp_comm_overlap=True)
    assert tp_comm_overlap_supported(t) is None
    with pytest.raises(UserError, match="mcore payload has no Transformer Engine userbuffers"):
        build_plan(t, payload="mcore")


def test_every_table_names_a_config_the_payload_ships():
    """Bridge ships the same nineteen configs as NeMo (comm_overlap.py against tp_overlap_configs); every name
    in either table is one of NeMo's, which the NeMo test checks against the installed NeMo."""
    shipped = set(nemo_ub.UB_CONFIGS.values())
    assert set(nemo_ub.USED_AT.values()) <= shipped
    assert set(bridge_ub.UB_CONFIGS.values()) <= shipped
    for (family, precision, _hidden, _tp), name in bridge_ub.UB_CONFIGS.items():
        assert name.startswith(f"userbuffers_{precision}_{family}_")
