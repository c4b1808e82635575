"""The Megatron-core payload (recipes.mcore) without a GPU: its command line, the overrides dse sends, its
FLOPs count and log lines, and the real H200 logs it produced read back by dse's parser and bench."""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from dse.facts import knobs
from dse.logs.parse import ParseContext, parse_log
from dse.recipes.mcore.__main__ import main
from dse.recipes.mcore.config import (
    SMALL_GQA,
    ConfigError,
    LossAverager,
    RunConfig,
    check,
    config_from_argv,
    format_iteration_line,
    format_memory_line,
    format_timers,
    model_flops_per_step,
    parse_overrides,
)
from dse.recipes.models import RECIPES

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "fixtures" / "logs" / "real_h200"
REAL_LOGS = sorted(p for p in REAL.glob("*.log") if not p.name.startswith("smoke"))


# ------------------------------------------------------------------------------------- no torch needed
def test_help_and_check_only_run_without_torch():
    """--help and --check-only work where torch is absent, and importing the payload imports no torch."""
    code = (
        "import sys; import recipes.mcore.__main__, recipes.mcore.train; "
        "assert 'torch' not in sys.modules and 'megatron' not in sys.modules; print('clean')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "clean"
    out = subprocess.run(
        [sys.executable, "-m", "recipes.mcore", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "path=value" in out.stdout and "--recompute" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "recipes.mcore", "--check-only", "train.micro_batch_size=2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["config"]["mbs"] == 2


def test_dse_mbridge_overrides_round_trip():
    """Every override dse.facts.knobs spells for the mbridge flavour is understood, with the value dse meant."""
    values = {name: k.default for name, k in knobs.CATALOGUE.items()}
    values.update(tp=1, pp=1, mbs=2, gbs=16, seq_length=4096, recompute="full", recompute_num_layers=0, max_steps=30)
    argv = ["--factory", "llama3_8b_recipe", "-y", *knobs.overrides(values, "mbridge")]
    cfg, _ = config_from_argv(argv)
    assert (cfg.model, cfg.hidden_size, cfg.num_layers) == ("llama3_8b", 4096, 32)
    assert (cfg.tp, cfg.pp, cfg.vp, cfg.cp, cfg.mbs, cfg.gbs, cfg.seq_length) == (1, 1, 1, 1, 2, 16, 4096)
    assert (cfg.recompute, cfg.train_iters, cfg.precision) == ("full", 30, "bf16")
    assert cfg.fp8_recipe in (None, values["fp8_recipe"])  # a first-cut dse spells it as mixed_precision= too
    resolved = check(cfg, world_size=8)
    # dse's recompute_num_layers=0 means every layer: Megatron's uniform method, one layer per unit
    assert (resolved.recompute_method, resolved.recompute_num_layers, resolved.sp) == ("uniform", 1, False)
    assert resolved.overlap_grad_reduce is True  # dp = 8 > 1
    assert (cfg.cpu_offloading, cfg.cpu_offloading_num_layers) == (False, 0)  # dse spells offloading off
    values["cpu_offload_layers"] = 4  # on: Bridge's spelling is understood, and refused with the reason
    cfg, _ = config_from_argv(["--factory", "llama3_8b_recipe", "-y", *knobs.overrides(values, "mbridge")])
    assert (cfg.cpu_offloading, cfg.cpu_offloading_num_layers) == (True, 4)
    with pytest.raises(ConfigError, match="Transformer Engine's offload context"):
        check(cfg, world_size=8)


def test_megatron_bridge_spellings():
    """Bridge's recipe names and mixed-precision recipe names; its FSDP companions are accepted, FSDP refused."""
    cfg, _ = config_from_argv(
        [
            "--recipe",
            "llama3_70b_pretrain_config",
            "mixed_precision=bf16_mixed",
            "scheduler.lr_decay_iters=40",
            "scheduler.lr_warmup_iters=10",
            "model.recompute_method=null",
        ]
    )
    assert (cfg.model, cfg.precision, cfg.lr_decay_iters, cfg.lr_warmup_iters) == ("llama3_70b", "bf16", 40, 10)
    cfg, _ = config_from_argv(["mixed_precision=bf16_with_fp8_current_scaling_mixed"])
    with pytest.raises(ConfigError, match="FP8 needs Transformer Engine"):
        check(cfg, 1)
    cfg, _ = config_from_argv(
        [
            "ddp.use_megatron_fsdp=true",
            "ddp.data_parallel_sharding_strategy=optim_grads_params",
            "ddp.average_in_collective=false",
            "model.init_model_with_meta_device=true",
            "optimizer.use_precision_aware_optimizer=false",
        ]
    )
    with pytest.raises(ConfigError, match="fsdp=true"):
        check(cfg, 1)


def test_none_spellings_and_flags_precedence():
    cfg, _ = config_from_argv(
        [
            "--mbs",
            "4",
            "--recompute",
            "full",
            "train.micro_batch_size=2",
            "model.recompute_granularity=null",
            "model.virtual_pipeline_model_parallel_size=null",
        ]
    )
    assert (cfg.mbs, cfg.recompute, cfg.vp) == (2, "none", 1)  # overrides win over flags
    cfg, _ = config_from_argv(["--model", "llama3_8b", "--num-layers", "4", "--no-swiglu"])
    assert (cfg.model, cfg.num_layers, cfg.gated) == ("llama3_8b_custom", 4, False)
    cfg, _ = config_from_argv(["--model", "llama3_8b", "--num-layers", "4"])
    assert cfg.model == "llama3_8b_4l"
    assert config_from_argv([])[0].model == SMALL_GQA.name


@pytest.mark.parametrize(
    "item, message",
    [
        ("train.micro_batch_sise=2", "unknown override 'train.micro_batch_sise'"),
        ("micro_batch_size=2", "did you mean train.micro_batch_size"),
        ("train.micro_batch_size", "is not an override"),
        ("train.micro_batch_size=two", "'two' is not an integer"),
        ("model.sequence_parallel=maybe", "is not a boolean"),
        ("optimizer.lr=nan", "not a finite number"),
        ("train.micro_batch_size=null", "mbs cannot be null"),
    ],
)
def test_bad_overrides_name_the_problem(item, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_overrides([item])


@pytest.mark.parametrize(
    "changes, world, message",
    [
        ({"sp": True, "tp": 2}, 2, "sp=true"),
        ({"cp": 2}, 2, "context parallelism"),
        ({"precision": "fp8"}, 1, "FP8 needs Transformer Engine"),
        ({"fsdp": True}, 1, "fsdp=true"),
        ({"cpu_offloading": True, "cpu_offloading_num_layers": 2}, 1, "cpu_offloading=true"),
        ({"gbs": 6, "mbs": 4}, 1, "gbs=6 is not divisible by mbs*dp=4*1"),
        ({"tp": 3}, 3, "num_query_groups=4 is not divisible by tp=3"),
        ({"pp": 2}, 3, "world size 3 is not divisible by tp*pp*cp=2"),
        ({"num_layers": 6, "pp": 4}, 4, "num_layers=6 is not divisible by pp*vp=4"),
        ({"vp": 2}, 1, "vp=2 needs pp > 1"),
        ({"recompute": "full", "recompute_num_layers": 9}, 1, "between 1 and the layers per pipeline stage (8)"),
        ({"recompute_method": "block"}, 1, "apply to recompute=full only"),
        ({"timing_log_level": 2}, 1, "timing_log_level=2 must be 0 or 1"),
    ],
)
def test_check_rejects_what_the_local_spec_cannot_run(changes, world, message):
    cfg = RunConfig(**changes)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check(cfg, world)


def test_main_exit_status_and_one_line_error(capsys):
    assert main(["model.context_parallel_size=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("recipes.mcore: error: cp=2")
    assert main(["--check-only", "--gbs", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["flops_convention"] == "causal"
    assert out["model_flops_per_step"] == model_flops_per_step(RunConfig(gbs=16))


def test_flops_match_the_reference_formula_and_dse():
    """Causal and noncausal model FLOPs equal dse.perfmodel's count of the same architecture, and the
    causal one equals Megatron-LM's num_floating_point_operations for a dense GQA model."""
    from dse.perfmodel import model_flops_per_step as dse_flops

    for name in ("llama3_8b", "nemotron4_15b"):
        arch = RECIPES[name].arch
        cfg = RunConfig(
            model=name,
            num_layers=arch.num_layers,
            hidden_size=arch.hidden_size,
            num_attention_heads=arch.num_attention_heads,
            num_query_groups=arch.num_query_groups,
            ffn_hidden_size=arch.ffn_hidden_size,
            vocab_size=arch.vocab_size,
            gated=arch.gated_mlp,
            gbs=32,
            seq_length=8192,
        )
        for conv in ("causal", "noncausal"):
            assert model_flops_per_step(cfg, conv) == pytest.approx(dse_flops(arch, 32, 8192, conv), rel=1e-12)
    # Megatron-LM's expression (3 x forward): attention 4bsh(h + h g/a + s/2), MLP 4bs h F (x3/2 gated),
    # logits 2bshV -- written independently here.
    c = RunConfig(gbs=4, seq_length=1024)
    b, s, h, a, g, F, V, L = (
        4,
        1024,
        c.hidden_size,
        c.num_attention_heads,
        c.num_query_groups,
        c.ffn_hidden_size,
        c.vocab_size,
        c.num_layers,
    )
    fwd = L * (4 * b * s * h * (h + h * g / a + s / 2) + 4 * b * s * h * F * 1.5) + 2 * b * s * h * V
    assert model_flops_per_step(c) == pytest.approx(3 * fwd, rel=1e-12)
    assert model_flops_per_step(c, "noncausal") > model_flops_per_step(c)


def test_iteration_line_is_megatron_lm_format():
    line = format_iteration_line(
        iteration=5,
        train_iters=20,
        consumed_samples=40,
        elapsed_ms=243.96,
        tflops_per_gpu=185.27,
        learning_rate=2.819134e-4,
        global_batch_size=8,
        losses={"lm loss": 10.18123},
        loss_scale=1.0,
        grad_norm=11.9594,
        now=datetime(2026, 12, 3, 7, 10, 7),
    )
    assert line == (
        " [2026-12-03 07:10:07] iteration        5/      20 | consumed samples:           40 | "
        "elapsed time per iteration (ms): 244.0 | throughput per GPU (TFLOP/s/GPU): 185.3 | "
        "learning rate: 2.819134E-04 | global batch size:     8 | lm loss: 1.018123E+01 | loss scale: 1.0 | "
        "grad norm: 11.959 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    bare = format_iteration_line(
        iteration=1,
        train_iters=2,
        consumed_samples=1,
        elapsed_ms=1.0,
        tflops_per_gpu=None,
        learning_rate=0.0,
        global_batch_size=1,
        losses={},
        loss_scale=1.0,
        grad_norm=None,
    )
    assert "throughput" not in bare and "grad norm" not in bare
    mem = format_memory_line(0, 2, 3 * 2**20, 5 * 2**20 + 2**19, 8 * 2**20, 9 * 2**20)
    assert mem == (
        "[Rank 0] (after 2 iterations) memory (MB) | allocated: 3.0 | max allocated: 5.5 | "
        "reserved: 8.0 | max reserved: 9.0"
    )


def test_the_loops_header_grad_hooks_and_iteration_line_print_what_megatron_lm_does(capsys, monkeypatch):
    """The loop's parts that run without a GPU: the header (a fake rank adds its probe line), the gradient-sync
    hooks (one callable for one model chunk, a list for several, none without overlap_grad_reduce) and the
    iteration line with the level-1 timers' block after it when they are on."""
    from types import SimpleNamespace

    from dse.recipes.mcore import train as t
    from dse.recipes.mcore.config import header_lines, probe_line

    monkeypatch.setattr(t, "host_cpu", lambda: "Xeon, 16 CPUs")
    cfg = check(config_from_argv(["--gbs", "8", "--mbs", "2"])[0], 1)
    t._print_header(cfg, 0, 1, 1, "NVIDIA H100 80GB HBM3", None)
    out = capsys.readouterr().out.splitlines()
    assert out == [*header_lines(cfg, 1, 1, "NVIDIA H100 80GB HBM3", "Xeon, 16 CPUs"), "building GPT model ..."]
    t._print_header(cfg, 5, 64, 8, "NVIDIA H100 80GB HBM3", 2)
    assert probe_line(cfg, 5, 64, 2) in capsys.readouterr().out.splitlines()

    one, two = (SimpleNamespace(no_sync=f"ns{i}", start_grad_sync=f"gs{i}") for i in range(2))
    config = SimpleNamespace()
    t._hook_grad_sync(replace(cfg, overlap_grad_reduce=False), config, [one])
    assert vars(config) == {}
    t._hook_grad_sync(replace(cfg, overlap_grad_reduce=True), config, [one])
    assert (config.no_sync_func, config.grad_sync_func) == ("ns0", "gs0")
    t._hook_grad_sync(replace(cfg, overlap_grad_reduce=True), config, [one, two])
    assert (config.no_sync_func, config.grad_sync_func) == (["ns0", "ns1"], ["gs0", "gs1"])

    class Scale:
        def item(self) -> float:
            return 4096.0

    torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None))
    for timed in (False, True):
        averager = LossAverager()
        averager.add({"lm loss": 10.5})
        phases = t._Phases(timed, torch)
        phases.start(), phases.stop("forward-backward"), phases.stop("optimizer")
        optimizer = SimpleNamespace(param_groups=[{"lr": 3e-4}], get_loss_scale=Scale)
        held = SimpleNamespace(optimizer=optimizer, averager=averager, grad_norm=1.5, skipped=0, phases=phases)
        t._log_iteration(cfg, 4, 2, 0.25, 1, 1e14, held)
        lines = capsys.readouterr().out.splitlines()
        fields = lines[0].split(" | ")
        assert (
            fields[0].endswith(f"iteration        4/{cfg.train_iters:8d}")
            and "consumed samples:           32" in fields
        )
        assert (
            "elapsed time per iteration (ms): 250.0" in fields and "throughput per GPU (TFLOP/s/GPU): 400.0" in fields
        )
        assert "learning rate: 3.000000E-04" in fields and "lm loss: 1.050000E+01" in fields
        assert "loss scale: 4096.0" in fields and "grad norm: 1.500" in fields
        assert (len(lines) > 1) == timed and all("time across ranks" in ln for ln in lines[1:2])


def test_timers_are_megatron_lm_format_and_opt_in():
    """--timing-log-level 1 prints Megatron-LM's level-1 timers block (Timers.log, min and max across ranks) per
    iteration, each phase bracketed by CUDA syncs; at the default 0 no sync is added to the step."""
    from types import SimpleNamespace

    from dse.recipes.mcore.train import _Phases, optimizer_class

    assert format_timers({"forward-backward": 1528.314, "optimizer": 12.849}) == (
        "(min, max) time across ranks (ms):\n"
        "    forward-backward ...............................: (1528.31, 1528.31)\n"
        "    optimizer ......................................: (12.85, 12.85)"
    )
    assert config_from_argv([])[0].timing_log_level == 0
    assert config_from_argv(["--timing-log-level", "1"])[0].timing_log_level == 1
    syncs = []
    torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: syncs.append(1)))
    off = _Phases(False, torch)
    off.start(), off.stop("forward-backward"), off.stop("optimizer")
    assert not syncs and off.pop(1) == {}
    on = _Phases(True, torch)
    for _ in range(2):
        on.start(), on.stop("forward-backward"), on.stop("optimizer")
    assert len(syncs) == 6
    per_iter = on.pop(2)
    assert list(per_iter) == ["forward-backward", "optimizer"] and all(v >= 0.0 for v in per_iter.values())
    assert on.pop(1) == {}  # a new interval starts empty

    # the class under Megatron's wrappers: a chained optimizer's first, a mixed-precision optimizer's inner one
    class FusedAdam:
        pass

    name = f"{__name__}.test_timers_are_megatron_lm_format_and_opt_in.<locals>.FusedAdam"
    chained = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=FusedAdam())])
    assert optimizer_class(chained) == name == optimizer_class(SimpleNamespace(optimizer=FusedAdam()))
    assert optimizer_class(FusedAdam()) == name


def test_loss_averager_averages_over_the_interval():
    avg = LossAverager()
    avg.add({"lm loss": 2.0})
    avg.add({"lm loss": 4.0})
    assert avg.pop() == {"lm loss": 3.0}
    assert avg.pop() == {}


# ------------------------------------------------------------------------------------- the real logs
def _logged(path: Path) -> tuple[list[float], list[float]]:
    times, tflops = [], []
    for line in path.read_text().splitlines():
        if m := re.search(
            r"elapsed time per iteration \(ms\): ([\d.]+) \| throughput per GPU \(TFLOP/s/GPU\): "
            r"([\d.]+)",
            line,
        ):
            times.append(float(m.group(1)))
            tflops.append(float(m.group(2)))
    return times, tflops


def test_real_logs_are_present_and_complete():
    assert len(REAL_LOGS) >= 10
    for p in REAL_LOGS:
        times, tflops = _logged(p)
        assert len(times) == 20, p.name  # every run logged all 20 iterations
        assert "[after training is done]" in p.read_text(), p.name


@pytest.mark.parametrize("log", REAL_LOGS, ids=lambda p: p.stem)
def test_real_h200_logs_parse(log):
    times, tflops = _logged(log)
    drop = max(2, math.ceil(len(times) / 10))
    m = parse_log(log, exit_code=0, context=ParseContext(gbs=8, seq_length=2048, num_gpus=1))
    assert m.status == "ok"
    assert m.step_time_s == pytest.approx(statistics.median(times[drop:]) / 1000, rel=1e-3)
    assert m.tflops_per_gpu == pytest.approx(statistics.median(tflops[drop:]), rel=1e-3)
    assert m.steps == 20


def test_bench_reads_the_tsv_and_matches_the_logs():
    """bench/h200_real_runs.py: its TSV rows agree with the logs they came from, and it prints every row."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import h200_real_runs as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    rows = bench.read_tsv()
    assert {r["log"] for r in rows} == {p.name for p in REAL_LOGS}
    for row in rows:
        times, tflops = _logged(REAL / row["log"])
        drop = bench.warmup_steps(len(times))
        assert float(row["step_time_ms"]) == pytest.approx(statistics.median(times[drop:]), rel=1e-6)
        assert float(row["tflops_per_gpu"]) == pytest.approx(statistics.median(tflops[drop:]), rel=1e-6)
        assert float(row["peak_allocated_gib"]) > 1.0
    printed = bench.report(rows)
    assert [p["name"] for p in printed] == [r["name"] for r in rows]


def test_h200_plan_lines_are_valid_command_lines():
    """Each run of bench/h200_plan.tsv parses and passes the checks for one GPU (what the device call runs)."""
    lines = [ln for ln in (ROOT / "bench" / "h200_plan.tsv").read_text().splitlines() if ln and not ln.startswith("#")]
    names = set()
    for line in lines:
        name, args = line.split("\t")
        cfg = check(config_from_argv(args.split())[0], 1)
        assert cfg.tp == cfg.pp == 1 and cfg.precision == "bf16", name
        names.add(name)
    assert {p.stem for p in REAL.glob("*.log")} <= names


@pytest.mark.parametrize("backend", ["local", "unfused", "auto"])
def test_local_spec_accepts_its_own_attention(backend):
    cfg, _ = config_from_argv([f"model.attention_backend={backend}"])
    assert check(cfg, 1).attention_backend == backend


@pytest.mark.parametrize("backend", ["flash", "fused"])
def test_transformer_engine_attention_is_refused(backend):
    cfg, _ = config_from_argv([f"model.attention_backend={backend}"])
    with pytest.raises(ConfigError, match="come from Transformer Engine"):
        check(cfg, 1)
