"""The ``mcore`` payload flavour (megatron-core, Megatron-Bridge spelling) and the record of a real local-backend
study on one H200 (``bench/data/h200_local_study/``: ``dse run --backend local`` with nemo-run's LocalExecutor
and torchrun launching ``recipes.mcore``)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from dse.backends.local import render_local_script
from dse.errors import UserError
from dse.facts import knobs
from dse.launch import build_plan
from dse.logs.parse import ParseContext, parse_log
from dse.perfmodel import model_flops_per_step
from dse.recipes.mcore.config import ConfigError, check, config_from_argv, stage_layers
from dse.recipes.models import RECIPES
from dse.rules.space import load_space
from dse.rules.trial import resolve
from tests.trials import trial

ROOT = Path(__file__).resolve().parent.parent
SPACE = ROOT / "conf/spaces/llama3_8b_4l_h200_local_space.toml"
STUDY = ROOT / "bench/data/h200_local_study"


def _mcore_args(plan) -> list[str]:
    assert plan.argv[:3] == ("python", "-m", "recipes.mcore")
    return list(plan.argv[3:])


def test_llama3_8b_4l_is_the_8b_width_with_four_layers():
    r, base = RECIPES["llama3_8b_4l"], RECIPES["llama3_8b"]
    assert (r.scaled_from, r.arch.num_layers, r.mbridge_recipe) == ("llama3_8b", 4, base.mbridge_recipe)
    assert r.arch == base.arch.__class__(**{**base.arch.__dict__, "name": "llama3_8b_4l", "num_layers": 4})
    lay = r.default_layout("h200", "bf16")
    assert (lay.tp, lay.pp, lay.cp) == (1, 1, 1)  # one GPU holds it: no model parallelism by default


def test_mcore_argv_is_the_bridge_spelling_for_the_mcore_module():
    t = trial("llama3_70b_16l", tp=2, pp=2, cp=1, vp=1, sp=False, mbs=1, gbs=32, seq_length=4096)
    mcore, bridge = build_plan(t, payload="mcore"), build_plan(t, payload="mbridge")
    assert mcore.argv[3:] == bridge.argv[3:]  # the same recipe name and overrides, another module
    assert mcore.argv[:5] == ("python", "-m", "recipes.mcore", "--recipe", "llama3_70b_pretrain_config")
    assert mcore.argv[-1] == "model.num_layers=16"  # the scaled reproducer's layer count, appended
    # and the payload reads them back as the trial meant
    cfg, _ = config_from_argv(_mcore_args(mcore))
    assert (cfg.model, cfg.num_layers, cfg.hidden_size) == ("llama3_70b_16l", 16, 8192)
    assert (cfg.tp, cfg.pp, cfg.mbs, cfg.gbs, cfg.seq_length, cfg.sp) == (2, 2, 1, 32, 4096, False)


def test_mcore_runs_recipes_bridge_lacks_and_skips_userbuffers():
    plan = build_plan(trial("nemotron4_15b", num_nodes=8, tp=4, pp=1, cp=1, vp=1), payload="mcore")
    assert plan.argv[3:5] == ("--recipe", "nemotron4_15b")
    cfg, _ = config_from_argv(_mcore_args(plan))
    assert (cfg.model, cfg.hidden_size, cfg.gated) == ("nemotron4_15b", 6144, False)
    # a tuned userbuffer config exists for this point on Bridge; the mcore payload has no userbuffers
    t = trial("llama3_70b_16l", tp=4, pp=1, cp=1, vp=1, tp_comm_overlap=True, precision="bf16")
    assert "--tp-comm-overlap-cfg" in build_plan(t, payload="mbridge").argv
    with pytest.raises(UserError, match="mcore payload has no Transformer Engine userbuffers"):
        build_plan(t, payload="mcore")  # the controller refuses it for this payload, before any launch
    args = knobs.payload_args("mcore", t.recipe, dict(t.values), gpu="h100", gpus_per_node=8)
    assert "--tp-comm-overlap-cfg" not in args
    with pytest.raises(ConfigError, match="userbuffers"):  # and the payload refuses it by itself, with the reason
        check(config_from_argv(list(args))[0], 8)


def test_uneven_pipeline_split_is_read_and_built():
    """126 layers + embedding and loss over pp=8 x vp=8 chunks: Megatron's split, stages of 15, 16 ... 16, 15."""
    t = trial("llama3_405b", num_nodes=128, tp=8, pp=8, cp=1, vp=8)  # 126 layers + 2 over 64 chunks
    args = knobs.payload_args("mcore", t.recipe, {"pp": 8, "vp": 8}, gpu="h100", gpus_per_node=8)
    assert "model.account_for_embedding_in_pipeline_split=true" in args
    cfg, _ = config_from_argv([*args, "train.global_batch_size=512"])
    assert cfg.account_for_embedding_in_pipeline_split and cfg.account_for_loss_in_pipeline_split
    assert stage_layers(check(cfg, 512, te_available=False)) == [15] + [16] * 6 + [15]
    with pytest.raises(ConfigError, match="not divisible by pp\\*vp=64"):
        check(replace(cfg, num_layers=125), 512, te_available=False)


def test_h200_local_space_is_six_valid_mcore_points():
    space = load_space(SPACE)
    assert (space.backend.kind, space.backend.payload, space.system.gpus_per_node) == ("local", "mcore", 1)
    pts = list(space.points())
    assert len(pts) == 6
    for p in pts:
        t = resolve(space, p)
        plan = build_plan(t, payload="mcore")
        cfg = check(config_from_argv(_mcore_args(plan))[0], t.num_gpus)  # the payload accepts every point
        assert (cfg.model, cfg.mbs, cfg.recompute, cfg.attention_backend) == (
            "llama3_8b_4l",
            p["mbs"],
            p["recompute"],
            "local",
        )
        script = render_local_script(plan, Path("/tmp/run"))
        assert "torchrun --nnodes 1 --nproc-per-node 1" in script and "-m recipes.mcore" in script


# ------------------------------------------------------------- the real study (bench/data/h200_local_study)
def _rows() -> list[dict[str, str]]:
    with open(STUDY / "leaderboard.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_study_record_is_complete():
    meta = json.loads((STUDY / "dse.json").read_text())
    assert (meta["backend"], meta["agent"], meta["recipe"], meta["gpu"]) == ("local", "grid", "llama3_8b_4l", "h200")
    rows = _rows()
    assert sorted(int(r["trial"]) for r in rows) == list(range(6))
    assert {(int(r["mbs"]), r["recompute"]) for r in rows} == {
        (m, rc) for m in (1, 2) for rc in ("none", "selective", "full")
    }


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"trial{r['trial']}")
def test_leaderboard_matches_the_parsed_log(row):
    """Each recorded trial re-parses to the leaderboard's figures: the local backend's log, torchrun's
    ``[default0]:`` prefixes and nemo-run's final state (SUCCEEDED) included."""
    space = load_space(SPACE)
    t = resolve(space, {"mbs": int(row["mbs"]), "recompute": row["recompute"]})
    run_dir = STUDY / "trials" / f"{int(row['trial']):05d}"
    script = (run_dir / "launch.sh").read_text()
    # the script that ran is the one dse renders for this point today (run directory aside)
    expected = render_local_script(build_plan(t, payload="mcore"), Path(row["run_dir"]))
    assert script == expected
    ctx = ParseContext(
        gbs=t.layout.gbs,
        seq_length=t.layout.seq_length,
        num_gpus=t.num_gpus,
        model_flops_per_step=model_flops_per_step(t.arch, t.layout.gbs, t.layout.seq_length, "causal"),
    )
    m = parse_log(str(run_dir / "log.txt"), exit_code=0, scheduler_state="SUCCEEDED", context=ctx)
    assert row["status"] == m.status == "ok"
    assert (m.steps, m.last_iteration, m.log_format) == (20, 20, "megatron")
    for key in ("step_time_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_memory_gib"):
        assert math.isclose(float(row[key]), getattr(m, key), rel_tol=1e-9), key
    assert float(row["reward"]) == pytest.approx(m.tflops_per_gpu)


def test_study_trends_are_the_physical_ones():
    """Recompute costs time at equal mbs (none < selective < full), and a larger micro-batch is faster."""
    by = {(int(r["mbs"]), r["recompute"]): float(r["step_time_s"]) for r in _rows()}
    for mbs in (1, 2):
        assert by[(mbs, "none")] < by[(mbs, "selective")] < by[(mbs, "full")]
    for rc in ("none", "selective", "full"):
        assert by[(2, rc)] < by[(1, rc)]
