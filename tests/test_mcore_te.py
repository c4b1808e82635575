"""recipes.mcore with Transformer Engine's layer spec: argument handling, refusals, and the recorded H200 runs."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from dse.recipes.mcore.__main__ import main
from dse.recipes.mcore.config import ConfigError, check, config_from_argv

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ["--model", "llama3_8b", "--num-layers", "4"]


def checked(argv, te=True, cap=None, world=1):
    cfg, _ = config_from_argv(argv)
    return check(cfg, world, te_available=te, gpu_capability=cap)


def test_auto_spec_follows_te_availability():
    assert checked([], te=True).layer_spec == "te"
    assert checked([], te=False).layer_spec == "local"
    assert checked(["--layer-spec", "local"], te=True).layer_spec == "local"


def test_te_spec_refused_without_te():
    with pytest.raises(ConfigError, match="layer_spec=te: Transformer Engine"):
        checked(["--layer-spec", "te"], te=False)


@pytest.mark.parametrize(
    "argv,recipe",
    [
        (["--fp8", "delayed"], "delayed"),
        (["--fp8", "tensorwise"], "tensorwise"),
        (["mixed_precision=bf16_with_fp8_current_scaling_mixed"], "tensorwise"),
        (["mixed_precision=bf16_with_fp8_delayed_scaling_mixed"], "delayed"),
        (["mixed_precision=fp8", "mixed_precision=tensorwise"], "tensorwise"),
    ],
)
def test_fp8_recipes_on_te(argv, recipe):
    cfg = checked(LLAMA + argv, cap=(9, 0))
    assert (cfg.precision, cfg.fp8_recipe, cfg.layer_spec) == ("fp8", recipe, "te")


def test_fp8_default_recipe_is_delayed_and_bf16_drops_the_recipe():
    cfg, _ = config_from_argv(["mixed_precision=bf16_with_fp8_delayed_scaling_mixed"])
    assert check(cfg, 1, te_available=True).fp8_recipe == "delayed"
    assert checked(["mixed_precision=bf16", "mixed_precision=tensorwise"]).fp8_recipe is None


@pytest.mark.parametrize("recipe", ["mxfp8", "blockwise"])
def test_blackwell_recipes_refused_on_hopper(recipe):
    with pytest.raises(ConfigError, match=f"fp8_recipe={recipe}: needs a Blackwell GPU.*9.0"):
        checked(["--fp8", recipe], cap=(9, 0))
    assert checked(["--fp8", recipe], cap=(10, 0)).fp8_recipe == recipe


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--fp8", "delayed"], "FP8 needs Transformer Engine's layer spec"),
        (["--attention-backend", "flash"], "flash and fused attention come from Transformer Engine"),
        (["model.cpu_offloading=true", "model.cpu_offloading_num_layers=2"], "offloads activations"),
    ],
)
def test_local_spec_refusals(argv, msg):
    with pytest.raises(ConfigError, match=msg):
        checked(argv, te=False)


@pytest.mark.parametrize("backend", ["flash", "fused", "unfused", "local", "auto"])
def test_attention_backends_on_te(backend):
    assert checked(["--attention-backend", backend]).attention_backend == backend
    assert checked([f"model.attention_backend={backend}"]).attention_backend == backend


def test_cpu_offloading_layers_bounds():
    assert (
        checked(
            ["--num-layers", "4", "model.cpu_offloading=true", "model.cpu_offloading_num_layers=3"]
        ).cpu_offloading_num_layers
        == 3
    )
    for n in (0, 4):
        with pytest.raises(ConfigError, match=f"cpu_offloading_num_layers={n} must be between 1 and num_layers-1"):
            checked(["--num-layers", "4", "model.cpu_offloading=true", f"model.cpu_offloading_num_layers={n}"])


def test_sequence_parallel_default_on_te_with_tp():
    assert checked(["--tp", "2"], world=2).sp is True
    assert checked(["--tp", "2"], te=False, world=2).sp is False
    with pytest.raises(ConfigError, match="sp=true needs tp > 1"):
        checked(["model.sequence_parallel=true"])


def test_transformer_impl_override():
    assert checked(["model.transformer_impl=transformer_engine"]).layer_spec == "te"
    assert checked(["model.transformer_impl=local"]).layer_spec == "local"
    with pytest.raises(ConfigError, match="layer_spec='inference'"):
        checked(["model.transformer_impl=inference"])


def test_cli_refusal_is_one_line_exit_2(capsys, monkeypatch):
    monkeypatch.setattr("dse.recipes.mcore.config.te_importable", lambda: False)
    assert main(["--check-only", "--fp8", "tensorwise"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FP8 needs Transformer Engine" in err[0]


def test_recorded_te_runs_reparse():
    sys.path.insert(0, str(ROOT / "bench"))
    import h200_te_runs

    with open(h200_te_runs.TSV, newline="") as fh:
        recorded = {r["name"]: r for r in csv.DictReader(fh, delimiter="\t")}
    logs = sorted(h200_te_runs.LOGS.glob("*.log"))
    assert {p.stem for p in logs} == set(recorded)
    for log in logs:
        row = h200_te_runs.measure(log)
        rec = recorded[log.stem]
        assert float(rec["step_time_ms"]) == row["step_time_ms"]
        assert float(rec["peak_allocated_gib"]) == row["peak_allocated_gib"]
        assert rec["layer_spec"] == row["layer_spec"] and rec["precision"] == row["precision"]
        assert rec["attention_backend"] == row["attention_backend"] and rec["fp8_recipe"] == row["fp8_recipe"]
        assert log.stem.startswith(row["layer_spec"]) and (row["precision"] in log.stem)
        assert rec["recompute"] == row["recompute"] and int(rec["cpu_offload_layers"]) == row["cpu_offload_layers"]
        assert ("offload" in log.stem) == (row["cpu_offload_layers"] > 0)
