"""One resolution path: defaults that depend on the layout settle the same way for run, predict and dry-run."""

from __future__ import annotations

from dse.perfmodel.trials import make_trial
from dse.recipes.models import RECIPES
from tests.trials import system, trial


def test_tp_comm_overlap_unset_is_on_where_nvidia_recipes_turn_it_on():
    # Llama 3 70B, tp 4, bf16 on H100: NeMo ships userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192
    assert trial("llama3_70b", num_nodes=8, tp=4, pp=4, cp=2, vp=5).layout.tp_comm_overlap is True
    # tp 1: nothing to overlap; tp > 1 without sequence parallelism: userbuffers need it
    assert trial("llama3_70b", num_nodes=8, tp=1, pp=4, cp=2, vp=5).layout.tp_comm_overlap is False
    assert trial("llama3_70b", num_nodes=8, tp=4, pp=4, cp=2, vp=5, sp=False).layout.tp_comm_overlap is False
    # no tuned config for this (GPU, width, tp): off, so the point is launchable
    assert trial("llama3_70b", num_nodes=8, tp=2, pp=4, cp=2, vp=5).layout.tp_comm_overlap is False


def test_an_explicit_tp_comm_overlap_wins():
    t = trial("llama3_70b", num_nodes=8, tp=4, pp=4, cp=2, vp=5, tp_comm_overlap=False)
    assert t.layout.tp_comm_overlap is False


def test_make_trial_resolves_like_a_space():
    r = RECIPES["llama3_70b"]
    direct = make_trial(r, "h100", 64, tp=4, pp=4, cp=2, vp=5, seq_length=8192)
    spaced = trial("llama3_70b", sys=system("h100"), num_nodes=8, tp=4, pp=4, cp=2, vp=5, seq_length=8192)
    assert direct.layout.tp_comm_overlap == spaced.layout.tp_comm_overlap is True
