"""recipes.mcore's mixture of experts without a GPU: the Megatron-Bridge MoE overrides dse sends, the payload's
refusals (Megatron-Core's own rules and what one GPU cannot run), the MoE FLOPs count and the MoE run plans."""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from dse.logs.parse import ParseContext, parse_log
from dse.recipes import contract
from dse.recipes.mcore.config import (
    SMALL_GQA,
    ConfigError,
    RunConfig,
    check,
    config_from_argv,
    format_iteration_line,
    format_memory_line,
    format_moe_line,
    format_timers,
    header_lines,
    model_flops_per_step,
)

ROOT = Path(__file__).resolve().parent.parent
MOE = RunConfig(model="small_moe", num_experts=16, moe_topk=2, moe_ffn_hidden_size=1408)


def test_small_moe_preset_and_the_grouped_gemm_default():
    """The preset is 16 experts of FFN 1408, top-2; grouped GEMMs are on with TE's spec and off with the local one."""
    cfg, _ = config_from_argv(["--model", "small_moe"])
    assert (cfg.num_experts, cfg.moe_topk, cfg.expert_ffn, cfg.hidden_size, cfg.num_layers) == (16, 2, 1408, 2048, 8)
    te = check(cfg, 1, te_available=True)
    assert (te.layer_spec, te.moe_grouped_gemm, te.etp, te.ep) == ("te", True, 1, 1)
    local = check(cfg, 1, te_available=False)
    assert (local.layer_spec, local.moe_grouped_gemm) == ("local", False)
    dense = check(config_from_argv([])[0], 1, te_available=True)
    assert (dense.num_experts, dense.moe_grouped_gemm) == (0, False)


def test_bridge_moe_overrides():
    """Megatron-Bridge's ``model.*`` MoE paths (what dse's mbridge spelling sends) reach the run's fields."""
    cfg, _ = config_from_argv(
        [
            "--model",
            "small_gqa",
            "model.num_moe_experts=8",
            "model.moe_router_topk=4",
            "model.moe_ffn_hidden_size=2816",
            "model.moe_shared_expert_intermediate_size=1408",
            "model.moe_router_score_function=sigmoid",
            "model.moe_router_load_balancing_type=seq_aux_loss",
            "model.moe_aux_loss_coeff=0.001",
            "model.moe_expert_capacity_factor=1.25",
            "model.moe_token_dispatcher_type=allgather",
            "model.moe_grouped_gemm=false",
            "model.moe_permute_fusion=true",
            "model.expert_model_parallel_size=2",
            "model.expert_tensor_parallel_size=1",
            "comm_overlap.overlap_moe_expert_parallel_comm=false",
            "model.kv_channels=64",
        ]
    )
    assert cfg.model == "small_gqa_custom"
    assert (cfg.num_experts, cfg.moe_topk, cfg.expert_ffn, cfg.moe_shared_expert_size) == (8, 4, 2816, 1408)
    assert (cfg.moe_router_score, cfg.moe_load_balancing, cfg.moe_aux_loss_coeff) == ("sigmoid", "seq_aux_loss", 1e-3)
    assert (cfg.moe_capacity_factor, cfg.moe_dispatcher, cfg.moe_grouped_gemm) == (1.25, "allgather", False)
    assert (cfg.moe_permute_fusion, cfg.ep, cfg.etp, cfg.moe_a2a_overlap, cfg.head_dim) == (True, 2, 1, False, 64)
    resolved = check(cfg, 2, te_available=True)
    assert (resolved.ep, resolved.etp, resolved.moe_grouped_gemm) == (2, 1, False)
    assert check(replace(cfg, moe_capacity_factor=None), 2, te_available=True).moe_capacity_factor is None


def test_token_drop_as_dse_spells_it_reaches_the_run_padded():
    """The ``moe_token_drop`` knob's Megatron-Bridge spelling (what dse sends this payload too) sets a capacity
    factor of 1.0 with padded experts; NeMo 2's sets the same fields under its prefix; off spells nothing."""
    from dse.facts import knobs

    spelled = knobs.overrides({"moe_token_drop": True}, "mbridge", moe=True)
    assert spelled == ["model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true"]
    assert knobs.overrides({"moe_token_drop": True}, "nemo2", moe=True) == [
        "model.config.moe_expert_capacity_factor=1.0",
        "model.config.moe_pad_expert_input_to_capacity=true",
    ]
    assert knobs.overrides({"moe_token_drop": False}, "mbridge", moe=True) == []
    assert knobs.overrides({"moe_token_drop": True}, "mbridge", moe=False) == []  # a dense model: no MoE knob
    cfg, _ = config_from_argv(["--model", "small_gqa", "model.num_moe_experts=8", *spelled])
    cfg = check(cfg, 1, te_available=True)
    assert (cfg.moe_capacity_factor, cfg.moe_pad_to_capacity) == (1.0, True)
    assert "capacity factor 1.0, padded True" in format_moe_line(cfg)


@pytest.mark.parametrize(
    "changes, world, te, message",
    [
        ({"ep": 3}, 3, True, "num_experts=16 is not divisible by ep=3"),
        ({"ep": 2, "etp": 2}, 2, True, "world size 2 is not divisible by etp*ep*pp=4"),
        ({"moe_topk": 17}, 1, True, "moe_topk=17 must be between 1 and num_experts"),
        ({"moe_topk": 1}, 1, True, "moe_router_pre_softmax"),
        ({"moe_grouped_gemm": True}, 1, False, "TEGroupedMLP) need Transformer Engine"),
        ({"moe_permute_fusion": True}, 1, False, "moe_permute_fusion=true needs Transformer Engine"),
        ({"moe_dispatcher": "flex"}, 1, True, "DeepEP / HybridEP"),
        ({"moe_dispatcher": "nccl"}, 1, True, "moe_dispatcher='nccl'; one of alltoall, allgather, flex"),
        ({"moe_a2a_overlap": True}, 1, True, "moe_a2a_overlap=true needs ep > 1"),
        ({"moe_a2a_overlap": True, "ep": 2}, 2, True, "not wired into this payload"),
        ({"ep": 2, "tp": 2, "sp": False}, 4, True, "ep > 1 with tp > 1 needs sequence parallelism"),
        ({"etp": 3}, 3, True, "moe_ffn_hidden_size=1408 is not divisible by etp=3"),
        ({"moe_first_dense_layers": 8}, 1, True, "moe_first_dense_layers=8 must be between 0 and num_layers-1"),
        ({"moe_router_score": "relu"}, 1, True, "moe_router_score='relu'"),
        ({"moe_load_balancing": "magic"}, 1, True, "moe_load_balancing='magic'"),
        ({"moe_capacity_factor": 0.0}, 1, True, "moe_capacity_factor=0.0 must be > 0"),
        ({"moe_pad_to_capacity": True}, 1, True, "moe_pad_to_capacity=true needs a capacity factor"),
        ({"num_experts": 0, "ep": 2}, 2, True, "expert parallelism needs num_experts > 0"),
    ],
)
def test_moe_refusals_name_the_setting(changes, world, te, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check(replace(MOE, **changes), world, te_available=te)


def test_moe_flops_count_the_routed_experts():
    """Megatron-LM's MoE count: the MLP term for top-k routed experts (+ shared), dense layers with the dense FFN."""
    b, s = 8, 2048
    moe = replace(MOE, gbs=b, seq_length=s)
    dense_like = replace(SMALL_GQA_RUN, ffn_hidden_size=2 * 1408, gbs=b, seq_length=s)
    # top-2 experts of FFN 1408 cost what one dense FFN of 2816 costs
    assert model_flops_per_step(moe) == pytest.approx(model_flops_per_step(dense_like), rel=1e-12)
    h, e, L = 2048, 3, 8
    shared = replace(moe, moe_shared_expert_size=1408, moe_first_dense_layers=2)
    # 6 MoE layers gain a shared expert of 1408; 2 layers become dense (FFN 5632 instead of 2 x 1408)
    extra = 6.0 * b * s * e * h * (6 * 1408 + 2 * (5632 - 2 * 1408))
    assert model_flops_per_step(shared) - model_flops_per_step(moe) == pytest.approx(extra, rel=1e-12)
    assert L == moe.num_layers
    # a head size other than h / a (Qwen3's kv_channels 128 with 32 heads of a 2048 hidden) counts its projections
    wide = replace(SMALL_GQA_RUN, num_attention_heads=32, num_query_groups=4, kv_channels=128, gbs=b, seq_length=s)
    d, a, g, hh = 128, 32, 4, 2048
    attention = L * (2 * hh * a * d + 2 * hh * g * d + a * d * s)
    mlp = L * 3 * hh * 5632
    assert model_flops_per_step(wide) == pytest.approx(6.0 * b * s * (mlp + attention + hh * 32000), rel=1e-12)
    with pytest.raises(ConfigError, match="unknown FLOPs convention"):
        model_flops_per_step(moe, convention="nope")


SMALL_GQA_RUN = RunConfig(model=SMALL_GQA.name)


def test_dense_flops_still_come_from_the_contract():
    cfg = replace(SMALL_GQA_RUN, gbs=8, seq_length=2048)
    expected = contract.model_flops_per_step(
        num_layers=8,
        hidden_size=2048,
        num_attention_heads=16,
        num_query_groups=4,
        ffn_hidden_size=5632,
        vocab_size=32000,
        gated_mlp=True,
        gbs=8,
        seq_length=2048,
    )
    assert model_flops_per_step(cfg) == expected


@pytest.mark.parametrize("plan", ["moe_gpu_plan.tsv", "moe_gpu_plan2.tsv"])
def test_moe_plan_lines_are_valid_command_lines(plan):
    """Each run of the MoE plans parses and passes the checks for one GPU with Transformer Engine."""
    lines = [ln for ln in (ROOT / "bench" / plan).read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(lines) >= 8
    for line in lines:
        name, args = line.split("\t")
        cfg = check(config_from_argv(args.split())[0], 1, te_available=True)
        assert cfg.tp == cfg.pp == cfg.ep == 1, name
        assert cfg.is_moe or name.startswith("dense"), name


@pytest.mark.parametrize("recipe", ["mixtral_8x7b", "qwen3_30b_a3b", "qwen3_235b_a22b"])
def test_dse_mbridge_moe_overrides_round_trip(recipe):
    """What dse spells for an MoE recipe (dse.facts.knobs, mbridge) is understood, with the architecture's MoE fields."""
    from dse.facts import knobs
    from dse.recipes.models import RECIPES

    values = {name: k.default for name, k in knobs.CATALOGUE.items()}
    values.update(ep=2, etp=1, mbs=1, gbs=16, moe_grouped_gemm=False, moe_dispatcher="allgather", max_steps=30)
    values.update(moe_permute_fusion=True)
    cfg, _ = config_from_argv(["--factory", f"{recipe}_recipe", "-y", *knobs.overrides(values, "mbridge", moe=True)])
    arch = RECIPES[recipe].arch
    assert (cfg.num_experts, cfg.moe_topk, cfg.expert_ffn, cfg.head_dim) == (
        arch.num_experts,
        arch.moe_topk,
        arch.expert_ffn,
        arch.head_dim,
    )
    resolved = check(cfg, 8, te_available=True)
    assert (resolved.ep, resolved.etp, resolved.moe_dispatcher) == (2, 1, "allgather")
    assert (resolved.moe_grouped_gemm, resolved.moe_permute_fusion) == (False, True)
    values.update(moe_dispatcher="flex")  # spelled with its backend and shared-expert overlap; refused with why
    cfg, _ = config_from_argv(["--factory", f"{recipe}_recipe", "-y", *knobs.overrides(values, "mbridge", moe=True)])
    with pytest.raises(ConfigError, match="DeepEP / HybridEP"):
        check(cfg, 8, te_available=True)


def test_mtp_and_sliding_windows_are_refused_and_an_uneven_stage_needs_pipeline_stages():
    # DeepSeek-V3 itself has an MTP layer the payload does not build; its slice (deepseek_v3_8l) has none
    with pytest.raises(ConfigError, match="multi-token prediction is not wired"):
        config_from_argv(["--factory", "deepseek_v3_recipe"])
    with pytest.raises(ConfigError, match="sliding-window attention is not wired"):
        config_from_argv(["--factory", "gpt_oss_120b_recipe"])
    cfg, _ = config_from_argv(["--model", "small_moe", "model.num_layers_in_first_pipeline_stage=3"])
    # uneven pipeline splits are wired (Megatron's num_layers_in_first/last_pipeline_stage), but only between stages
    with pytest.raises(ConfigError, match="num_layers_in_first/last_pipeline_stage needs pp > 1"):
        check(cfg, 1, te_available=True)


# ----------------------------------------------------------- reading a run back (bench/moe_gpu_runs.py)
def _bench(name: str = "moe_gpu_runs"):
    """A bench script of ``bench/`` as a module (they import their neighbours by name)."""
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _write_log(
    path: Path, cfg: RunConfig, steps: list[float], max_alloc_mib: float, start=None, timers: bool = False
) -> None:
    """A log as train.py prints it, made with the payload's own line formatters (header, iterations, memory);
    the figures are made up for the test, not measured. ``start``: a datetime, iteration ``i`` stamped ``10·i``
    seconds after it (else now). ``timers``: Megatron-LM's level-1 timers after each iteration line, the optimizer
    10 ms of each step."""
    from datetime import timedelta

    flops = model_flops_per_step(cfg)
    lines = header_lines(cfg, 1, 1, "NVIDIA H100 80GB HBM3")
    for i, ms in enumerate(steps, start=1):
        lines.append(
            format_iteration_line(
                iteration=i,
                train_iters=len(steps),
                consumed_samples=i * cfg.gbs,
                elapsed_ms=ms,
                tflops_per_gpu=flops / (ms * 1e-3 * 1e12),
                learning_rate=3e-4,
                global_batch_size=cfg.gbs,
                losses={"lm loss": 10.0 - 0.1 * i},
                loss_scale=1.0,
                grad_norm=1.0,
                now=start + timedelta(seconds=10 * i) if start else None,
            )
        )
        if timers:
            lines.append(format_timers({"forward-backward": ms - 10.0, "optimizer": 10.0}))
        if i in (1, 2, len(steps)):
            mib = 1024.0 * 1024.0
            lines.append(format_memory_line(0, i, int(4000 * mib), int(max_alloc_mib * mib), int(9000 * mib), 9000))
    path.write_text("\n".join(lines) + "\n")


def test_bench_reads_the_moe_header_and_the_figures(tmp_path):
    """The bench's reading of a log: the MoE settings from the header, the median step after the warm-up steps,
    the peak allocated memory, Megatron-LM's level-1 timers where printed (as the step, the median after the
    warm-up); the TSV it writes holds them, and a dense run reads as zero experts."""
    bench = _bench()
    moe = check(replace(MOE, gbs=8, mbs=2, moe_grouped_gemm=False), 1, te_available=True)
    steps = [900.0, 400.0, 130.0, 120.0, 110.0, 125.0, 118.0, 122.0, 121.0, 119.0, 117.0, 123.0]
    _write_log(tmp_path / "moe16_seq_mbs2.log", moe, steps, 20480.0, timers=True)
    _write_log(tmp_path / "dense.log", check(replace(SMALL_GQA_RUN, mbs=2), 1, te_available=True), steps, 10240.0)
    rows = {r["name"]: r for r in bench.write_tsv(tmp_path, tmp_path / "runs.tsv")}
    row = rows["moe16_seq_mbs2"]
    assert row["step_time_ms"] == pytest.approx(statistics.median(steps[2:]))
    assert row["peak_allocated_gib"] == pytest.approx(20.0)
    assert (row["num_experts"], row["moe_topk"], row["moe_ffn_hidden_size"], row["moe_grouped_gemm"]) == (
        16,
        2,
        1408,
        False,
    )
    assert (row["layer_spec"], row["attention_backend"], row["gpu"], row["mbs"]) == (
        "te",
        "local",
        "NVIDIA H100 80GB HBM3",
        2,
    )
    assert row["tflops_per_gpu"] == pytest.approx(model_flops_per_step(moe) / (row["step_time_ms"] * 1e9), rel=1e-3)
    assert (row["fwd_bwd_ms"], row["optimizer_ms"]) == (pytest.approx(statistics.median(steps[2:]) - 10.0), 10.0)
    assert rows["dense"]["num_experts"] == 0 and rows["dense"]["moe_dispatcher"] == ""
    assert rows["dense"]["fwd_bwd_ms"] == rows["dense"]["optimizer_ms"] == ""  # a run without the timers
    back = {r["name"]: r for r in bench.base.read_tsv(tmp_path / "runs.tsv")}
    assert back["moe16_seq_mbs2"]["moe_grouped_gemm"] == "False" and back["moe16_seq_mbs2"]["kv_channels"] == "128"
    assert bench.gpu_key(row["gpu"]) == "h100" and bench.gpu_key("NVIDIA H200") == "h200"


def test_bench_predicts_every_plan_run():
    """--predict-plan resolves each plan line with the payload's checks and gets the model's figures for it."""
    bench = _bench()
    rows = bench.plan_rows(ROOT / "bench" / "moe_gpu_plan.tsv", "NVIDIA H200")
    by_name = {r["name"]: r for r in rows}
    assert by_name["moe8_gg_mbs2"]["num_experts"] == "8" and by_name["moe16_seq_mbs1"]["moe_grouped_gemm"] == "False"
    out = bench.predict_plan(ROOT / "bench" / "moe_gpu_plan.tsv", "NVIDIA H200")
    assert [o["name"] for o in out] == [r["name"] for r in rows]
    assert all(o["step_time_ms"] > 0 and o["peak_memory_gib"] > 0 for o in out)
    # the row's experts and grouped-GEMM setting reach the model: memory grows with the experts (weights and
    # optimizer states), and grouped GEMMs on and off are priced apart
    pred = {o["name"]: o for o in out}
    mem = [pred[n]["peak_memory_gib"] for n in ("moe8_gg_mbs2", "moe16_gg_mbs2", "moe32_gg_mbs2")]
    assert mem[0] < mem[1] < mem[2]
    assert pred["moe16_gg_mbs2"]["step_time_ms"] != pred["moe16_seq_mbs2"]["step_time_ms"]
    # Megatron-Bridge's estimate is given for the MoE runs and grows with the experts too
    ref = [pred[n]["bridge_memory_gib"] for n in ("moe8_gg_mbs2", "moe16_gg_mbs2", "moe32_gg_mbs2")]
    assert ref[0] < ref[1] < ref[2]


# the plans for a machine without Transformer Engine (megatron-core alone)
_NO_TE_PLANS = [
    "moe_gpu_plan_local.tsv",
    "moe_gpu_plan_local2.tsv",
    "moe_gpu_plan_h100.tsv",
    "moe_gpu_plan_timers.tsv",
    "moe_gpu_plan_i30.tsv",
    "moe_gpu_plan_expandable.tsv",
]


@pytest.mark.parametrize("plan", ["moe_gpu_plan.tsv", "moe_gpu_plan2.tsv", *_NO_TE_PLANS])
def test_every_plan_line_passes_the_payload_checks(plan):
    """Each shipped plan's lines parse and pass recipes.mcore's checks for one GPU, under unique names; a plan
    without Transformer Engine asks for none of it (local spec, no grouped GEMMs), and its dense twin gets no
    Bridge estimate (a MoE-only reference)."""
    bench = _bench()
    rows = bench.plan_rows(ROOT / "bench" / plan, "NVIDIA H200")
    names = [r["name"] for r in rows]
    assert len(rows) >= 2 and len(set(names)) == len(names)
    if plan in _NO_TE_PLANS:
        assert {r["layer_spec"] for r in rows} == {"local"}
        assert {r["moe_grouped_gemm"] for r in rows} == {"False"}
        dense = [r for r in rows if r["num_experts"] == "0"]
        assert all(bench.bridge_gib(r) is None for r in dense)
        assert all(bench.bridge_gib(r) > 0 for r in rows if r["num_experts"] != "0")


def test_recorded_moe_runs_reparse():
    """bench/data/moe_gpu_runs.tsv is what the bench reads from the recorded one-GPU logs (real H200 and H100 runs), each
    log's name says its settings, and every run's settings came from the header the payload printed."""
    bench = _bench()
    with open(bench.TSV, newline="") as fh:
        recorded = {r["name"]: r for r in csv.DictReader(fh, delimiter="\t")}
    logs = sorted(bench.LOGS.glob("*.log"))
    assert logs and {p.stem for p in logs} == set(recorded)
    for log in logs:
        row = bench.measure(log)
        rec = recorded[log.stem]
        assert float(rec["step_time_ms"]) == row["step_time_ms"]
        assert float(rec["peak_allocated_gib"]) == row["peak_allocated_gib"]
        assert int(rec["num_experts"]) == row["num_experts"] and "NVIDIA" in row["gpu"]
        assert (row["num_experts"] > 0) == log.stem.startswith("moe")
        if log.stem.startswith("moe"):
            assert log.stem.split("_")[0] == f"moe{row['num_experts']}" and f"mbs{row['mbs']}" in log.stem
            assert ("top4" in log.stem) == (row["moe_topk"] == 4)
            assert ("allgather" in log.stem) == (row["moe_dispatcher"] == "allgather")
            assert ("tokendrop" in log.stem) == row["moe_token_drop"]


def test_token_drop_runs_are_read_and_set_against_their_dropless_twins(tmp_path, monkeypatch):
    """A run whose header says a capacity factor of 1.0, padded, is a token-drop run (dse's ``moe_token_drop``); it is
    compared with the dropless run that differs in nothing else (dropless / token drop, over the measured steps and
    the last three); a run of another micro-batch has no twin, and a capacity dse does not price is refused."""
    bench = _bench()
    base = check(replace(MOE, gbs=8, mbs=2), 1, te_available=True)
    drop = replace(base, moe_capacity_factor=1.0, moe_pad_to_capacity=True)
    _write_log(tmp_path / "moe16_mbs2.log", base, [900.0] * 9 + [600.0] * 3, 20480.0)  # steps falling at the end
    _write_log(tmp_path / "moe16_mbs2_tokendrop.log", drop, [500.0] * 12, 20480.0)
    _write_log(tmp_path / "moe16_mbs4_tokendrop.log", replace(drop, mbs=4), [400.0] * 12, 20480.0)
    rows = bench.write_tsv(tmp_path, tmp_path / "runs.tsv")
    assert [r["moe_token_drop"] for r in rows] == [False, True, True]
    out = [{"name": r["name"], "step_time_ms": r["step_time_ms"], "pred_step_time_ms": 100.0} for r in rows]
    monkeypatch.setattr(bench, "LOGS", tmp_path)
    ((name, measured, predicted),) = bench.token_drop_pairs(rows, out)
    assert name == "moe16_mbs2_tokendrop" and predicted == 1.0
    assert measured == pytest.approx(rows[0]["step_time_ms"] / 500.0) and measured > 1.2
    _write_log(tmp_path / "cf2.log", replace(base, moe_capacity_factor=2.0), [500.0] * 12, 20480.0)
    with pytest.raises(ValueError, match="capacity factor 2.0"):
        bench.measure(tmp_path / "cf2.log")


def test_repeats_set_each_run_against_the_other_runs_of_its_configuration(tmp_path):
    """Runs of one configuration on the same GPU are repeats, whatever their length; each is predicted by the mean
    of the others (the floor under any model of that configuration), beside the model on the same runs; a run of
    another micro-batch is no repeat, and without any repeat there is no figure."""
    bench = _bench()
    base = check(replace(MOE, gbs=8, mbs=2), 1, te_available=True)
    _write_log(tmp_path / "a.log", base, [800.0] * 12, 20480.0)
    _write_log(tmp_path / "b.log", base, [600.0] * 30, 20480.0)
    _write_log(tmp_path / "c.log", replace(base, mbs=4), [400.0] * 12, 20480.0)
    rows = bench.write_tsv(tmp_path, tmp_path / "runs.tsv")
    out = [
        {"name": r["name"], "gpu": r["gpu"], "step_time_ms": r["step_time_ms"], "pred_step_time_ms": 700.0}
        for r in rows
    ]
    runs, oracle, model = bench.repeats(rows, out)
    assert runs == 2
    assert oracle == pytest.approx(100 * (abs(600 / 800 - 1) + abs(800 / 600 - 1)) / 2)
    assert model == pytest.approx(100 * (abs(700 / 800 - 1) + abs(700 / 600 - 1)) / 2)
    assert bench.repeats(rows[2:], out[2:]) is None


def test_per_expert_slope_reads_runs_that_differ_only_in_experts(tmp_path):
    """The per-expert figure is the slope of the step time over the experts, per MoE layer and micro-batch, among
    runs alike in everything else; a run of another micro-batch size is not mixed in."""
    bench = _bench()
    layers = MOE.num_layers
    for experts, mbs in ((8, 2), (16, 2), (32, 2), (16, 4)):
        cfg = check(replace(MOE, gbs=8, mbs=mbs, num_experts=experts), 1, te_available=True)
        step = 100.0 + 0.5 * experts * (8 // mbs) * layers  # 0.5 ms per expert, layer and micro-batch
        _write_log(tmp_path / f"moe{experts}_mbs{mbs}.log", cfg, [step] * 12, 20480.0)
    rows = bench.write_tsv(tmp_path, tmp_path / "runs.tsv")
    out = [{"step_time_ms": r["step_time_ms"], "pred_step_time_ms": r["step_time_ms"] / 2} for r in rows]
    (slope,) = bench.per_expert_ms(rows, out)
    assert slope[1] == 3 and "mbs=2" in slope[0]
    assert slope[2] == pytest.approx(0.5) and slope[3] == pytest.approx(0.25)


def test_host_split_reads_the_micro_batch_slope_and_full_recomputes_extra_forward(tmp_path):
    """Steps made up as a host-bound run's: 12 ms of host per MoE layer and micro-batch, forward and backward, and
    3 ms more per layer and micro-batch under full recompute; the bench reads back 12 and 3 (a backward three times
    the forward)."""
    bench = _bench()
    layers = MOE.num_layers
    for mbs, recompute in ((1, "none"), (2, "none"), (4, "none"), (2, "full")):
        cfg = check(replace(MOE, gbs=8, mbs=mbs, recompute=recompute), 1, te_available=True)
        step = 50.0 + (8 // mbs) * layers * (12.0 + (3.0 if recompute == "full" else 0.0))
        _write_log(tmp_path / f"mbs{mbs}_{recompute}.log", cfg, [step] * 12, 20480.0)
    rows = bench.write_tsv(tmp_path, tmp_path / "runs.tsv")
    ((spec, both, fwd),) = bench.host_split(rows)
    assert spec == "te" and both == pytest.approx(12.0) and fwd == pytest.approx(3.0)


def test_gpu_busy_reads_the_samples_inside_the_iterations(tmp_path):
    """The GPU's busy share is the mean of the nvidia-smi samples between iteration 2 and the last (the warm-up
    iteration and the set-up before it left out); a run without samples has none."""
    from datetime import datetime, timedelta

    bench = _bench()
    cfg = check(replace(MOE, gbs=8, mbs=2), 1, te_available=True)
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    log = tmp_path / "run.log"
    _write_log(log, cfg, [500.0] * 4, 20480.0, start=t0)
    assert bench.gpu_busy(log) is None
    samples = ["timestamp, utilization.gpu [%], memory.used [MiB]"]
    for s in range(0, 50, 2):  # 90% busy during the warm-up (before 12:00:20), 30% from there to 12:00:40, then 0
        busy = 90 if s < 20 else 30 if s <= 40 else 0
        samples.append(f"{(t0 + timedelta(seconds=s)).strftime('%Y/%m/%d %H:%M:%S')}.000, {busy} %, 20000 MiB")
    log.with_suffix(".smi.csv").write_text("\n".join(samples) + "\n")
    assert bench.gpu_busy(log) == pytest.approx(0.30)


@pytest.mark.parametrize("log", sorted((ROOT / "tests/fixtures/logs/real_moe").glob("*.log")), ids=lambda p: p.stem)
def test_real_moe_logs_parse_as_completed_runs(log):
    """dse's log parser reads each real one-GPU MoE run as a completed run, with the bench's step time (the same
    median after the warm-up steps) and a positive TFLOP/s."""
    bench = _bench()
    row = bench.measure(log)
    ctx = ParseContext(gbs=int(row["gbs"]), seq_length=int(row["seq_length"]), num_gpus=1)
    m = parse_log(log, exit_code=0, context=ctx)
    assert m.status == "ok" and m.steps == row["steps"] in (12, 30)  # the plans' --train-iters
    assert m.step_time_s * 1e3 == pytest.approx(row["step_time_ms"], rel=1e-3)
    assert m.tflops_per_gpu > 0


# ----------------------------------------------------------- grouped GEMMs on the GPU (bench/grouped_gemm_gpu.py)


def test_grouped_gemm_bench_recovers_the_rows_per_expert_at_half_rate(tmp_path):
    """Timings made up from m / (m + m_half) against a dense GEMM at 600 TFLOP/s read back as that m_half, for the
    grouped GEMM, the loop and TE's grouped linear (its forward + backward at three times the FLOPs) each; a
    refused grouped GEMM (NaN) is left out, not read as zero."""
    bench = _bench("grouped_gemm_gpu")
    rows = []
    for m in bench.ROWS_PER_EXPERT:
        gflop = 2.0 * 16 * m * 2048 * 1536 / 1e9
        dense = gflop / 600.0  # ms at 600 TFLOP/s
        grouped = dense / (m / (m + 300.0))
        loop = dense / (m / (m + 2000.0))
        te, te_fb = dense / (m / (m + 500.0)), 3 * dense / (m / (m + 800.0))
        rows.append(
            dict(
                zip(
                    bench.COLUMNS,
                    (
                        "NVIDIA H200",
                        "bf16",
                        "toy",
                        2048,
                        768,
                        16,
                        "fc1",
                        m,
                        dense,
                        grouped if m > 16 else float("nan"),
                        loop,
                        te,
                        te_fb,
                        gflop,
                    ),
                    strict=True,
                )
            )
        )
    # FP8 rows: TE's layers only, against TE's FP8 dense layer at twice the rate, fitted under their own keys
    rows += [
        {
            **r,
            "precision": "fp8",
            "dense_ms": r["dense_ms"] / 2,
            "grouped_ms": float("nan"),
            "loop_ms": float("nan"),
            "te_ms": r["dense_ms"] / 2 / (r["m"] / (r["m"] + 900.0)),
            "te_fwd_bwd_ms": float("nan"),
        }
        for r in rows
    ]
    bench._write(tmp_path / "t.csv", rows)
    fits = bench.report(bench.load(tmp_path / "t.csv"))
    assert fits[("toy", "fc1", "te_fp8")] == pytest.approx(900.0, rel=0.02)
    assert ("toy", "fc1", "grouped_fp8") not in fits
    assert fits[("toy", "fc1", "grouped")] == pytest.approx(300.0, rel=0.02)
    assert fits[("toy", "fc1", "loop")] == pytest.approx(2000.0, rel=0.02)
    assert fits[("toy", "fc1", "te")] == pytest.approx(500.0, rel=0.02)
    assert fits[("toy", "fc1", "te_fwd_bwd")] == pytest.approx(800.0, rel=0.02)
    # the launch floor is read at the fewest rows per expert, per expert: 16 experts
    fwd, fwd_bwd = bench.host_floor(bench.load(tmp_path / "t.csv"))
    m0 = min(bench.ROWS_PER_EXPERT)
    least = next(r for r in rows if r["m"] == m0)
    assert fwd == pytest.approx(least["te_ms"] / 16 / 1e3)
    assert fwd_bwd == pytest.approx(least["te_fwd_bwd_ms"] / 16 / 1e3)
    assert fwd_bwd > fwd
    assert bench.main(["--data", str(tmp_path / "missing.csv")]) == 2


def test_grouped_gemm_bench_reads_a_csv_from_before_the_te_and_precision_columns(tmp_path):
    """The first recorded CSV had neither TE's columns nor a precision: it reads as bf16 with TE unmeasured (NaN),
    and the launch floor, which needs TE's timings, is None rather than a number made of nothing."""
    bench = _bench("grouped_gemm_gpu")
    old = tmp_path / "old.csv"
    old.write_text(
        "device,shape,hidden,expert_ffn,experts,gemm,m,dense_ms,grouped_ms,loop_ms,gflop\n"
        "NVIDIA H200,toy,2048,768,16,fc1,16,0.02,0.04,0.36,1.6\n"
    )
    (row,) = bench.load(old)
    assert row["precision"] == "bf16"
    assert math.isnan(row["te_ms"]) and math.isnan(row["te_fwd_bwd_ms"])
    assert bench.host_floor([row]) is None


def test_deepseek_v3_slice_maps_to_the_payloads_mla_and_moe_fields():
    """The dse recipe deepseek_v3_8l runs as DeepSeek-V3's layers: MLA ranks and head sizes, 256 experts top-8 with
    sigmoid scores, the aux-loss-free expert bias, a shared expert, the first 3 layers dense."""
    from dse.recipes.models import RECIPES

    arch = RECIPES["deepseek_v3_8l"].arch
    cfg, _ = config_from_argv(["--factory", "deepseek_v3_8l_recipe", "--ep", "32", "--pp", "4", "--gbs", "128"])
    cfg = check(cfg, 128, te_available=False)
    assert cfg.is_mla and cfg.num_layers == 8 and arch.mtp_layers == 0
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim) == (
        arch.q_lora_rank,
        arch.kv_lora_rank,
        arch.qk_nope_head_dim,
        arch.qk_rope_head_dim,
        arch.v_head_dim,
    )
    assert (cfg.num_experts, cfg.moe_topk, cfg.moe_router_score, cfg.moe_expert_bias) == (256, 8, "sigmoid", True)
    assert (cfg.moe_shared_expert_size, cfg.moe_first_dense_layers) == (2048, 3)
    # the FLOPs are the contract's MoE-and-MLA formula of the same architecture
    assert model_flops_per_step(cfg) == contract.moe_model_flops_per_step(arch, gbs=128, seq_length=cfg.seq_length)
    lines = header_lines(cfg, 128, 32, "cpu")
    assert any("multi-latent attention, q lora rank 1536, kv lora rank 512" in line for line in lines)
    assert any("router expert bias on" in line for line in lines)
    # a softmax router keeps no expert bias unless asked, and asking for one with softmax scores is refused
    assert check(replace(MOE), 1, te_available=True).moe_expert_bias is False
    with pytest.raises(ConfigError, match="moe_expert_bias=true needs moe_router_score=sigmoid"):
        check(replace(MOE, moe_expert_bias=True), 1, te_available=True)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"qk_rope_head_dim": 0}, "qk_rope_head_dim=0 must be >= 1 with multi-latent attention"),
        ({"q_lora_rank": 0}, "q_lora_rank=0 must be >= 1"),
        ({"recompute": "selective", "recompute_modules": "mla_up_proj,moe"}, "this model's layers have"),
    ],
)
def test_mla_refusals_name_the_setting(changes, message):
    mla = replace(MOE, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32)
    with pytest.raises(ConfigError, match=message):
        check(replace(mla, **changes), 1, te_available=True)
    ok = check(replace(mla, recompute="selective", recompute_modules="mla_up_proj,core_attn"), 1, te_available=True)
    assert ok.recompute_modules == "mla_up_proj,core_attn"
    with pytest.raises(ConfigError, match="a dense layer|this model's layers have core_attn, layernorm, mlp$"):
        check(replace(MOE, recompute="selective", recompute_modules="mla_up_proj"), 1, te_available=True)


def test_dses_own_command_line_for_the_deepseek_v3_slice_runs_without_mtp_and_the_full_model_is_refused():
    """dse launches a scaled recipe as its base's factory with overrides; the slice drops its base's MTP layer
    (model.mtp_num_layers=null), which the payload reads before refusing a model with MTP: `dse probe` and
    `dse run` of a deepseek_v3_8l space reach the payload's slice, the full deepseek_v3 is still refused."""
    from dse.facts import knobs
    from dse.recipes.models import RECIPES

    values = dict(tp=1, pp=4, vp=1, cp=1, ep=32, etp=1, mbs=1, gbs=128, seq_length=4096, recompute="selective")
    values.update(precision="bf16", moe_grouped_gemm=False, num_nodes=16)
    argv = knobs.payload_args("mcore", RECIPES["deepseek_v3_8l"], values, gpu="h100", gpus_per_node=8)
    assert "model.mtp_num_layers=null" in argv
    cfg, _ = config_from_argv(list(argv))
    assert (cfg.model, cfg.num_layers, cfg.num_experts, cfg.is_mla) == ("deepseek_v3_8l", 8, 256, True)
    # the MoE reproducer keeps its base's MTP layer: nothing said, and the payload refuses it as the full model
    two_node = knobs.payload_args(
        "mcore", RECIPES["deepseek_v3_2node"], dict(values, ep=8), gpu="h100", gpus_per_node=8
    )
    assert not any(a.startswith("model.mtp_num_layers") for a in two_node)
    with pytest.raises(ConfigError, match="multi-token prediction is not wired"):
        config_from_argv(list(two_node))
    with pytest.raises(ConfigError, match="multi-token prediction is not wired"):
        config_from_argv([*argv, "model.mtp_num_layers=1"])
    bridge = knobs.payload_args("mbridge", RECIPES["deepseek_v3_8l"], values, gpu="h100", gpus_per_node=8)
    assert "model.mtp_num_layers=null" in bridge


def test_the_host_cpu_is_printed_and_each_machine_is_read_apart(tmp_path):
    """The payload names its host's CPU in the header (the first ``model name`` of /proc/cpuinfo and the CPUs it may
    use); the bench reads it into the ``host`` column and takes two runs on one GPU model but different hosts as two
    machines; a log from before the line has no host and is the GPU alone."""
    from recipes.mcore.train import host_cpu

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\nprocessor\t: 1\n")
    cpu = host_cpu(str(info))
    assert cpu.startswith("Intel(R) Xeon(R) Platinum 8480C, ") and cpu.endswith(" CPUs")
    assert host_cpu(str(tmp_path / "absent")).endswith(" CPUs")  # no cpuinfo: the platform's name, never a crash
    bench = _bench()
    cfg = check(replace(MOE, gbs=8, mbs=2), 1, te_available=True)
    assert any(ln == f"> recipes.mcore: host {cpu}" for ln in header_lines(cfg, 1, 1, "NVIDIA H100 80GB HBM3", cpu))
    assert not any("host" in ln for ln in header_lines(cfg, 1, 1, "NVIDIA H100 80GB HBM3"))
    for name, host in (("a", cpu), ("b", "AMD EPYC 9654, 16 CPUs"), ("c", "")):
        lines = header_lines(cfg, 1, 1, "NVIDIA H100 80GB HBM3", host)
        (tmp_path / f"{name}.log").write_text("\n".join(lines) + "\n")
        assert bench.measure(tmp_path / f"{name}.log")["host"] == host
    machines = {bench.machine(bench.measure(tmp_path / f"{n}.log")) for n in "abc"}
    assert machines == {
        f"NVIDIA H100 80GB HBM3, {cpu}",
        "NVIDIA H100 80GB HBM3, AMD EPYC 9654, 16 CPUs",
        "NVIDIA H100 80GB HBM3",
    }
