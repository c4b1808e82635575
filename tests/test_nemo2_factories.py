"""The NeMo 2 factories against the real NeMo 2.7: build each model's recipe, apply a trial's overrides through
nemo-run's CLI parser, and check the resulting config (no training, CPU only).

Runs ``tests/nemo2_probe.py`` with the separate NeMo environment made by ``.ci/nemo-env.sh`` (``DSE_NEMO_ENV``,
default ``.venv-nemo``). Skipped when that environment is absent, except under CI with ``DSE_NEMO_ENV`` set,
where its absence is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dse.facts import knobs
from dse.recipes.models import RECIPES
from dse.recipes.nemo2 import spec

# one worker under xdist: the module builds its NeMo probe (one NeMo process for every trial) once
pytestmark = [pytest.mark.nemo, pytest.mark.xdist_group("nemo2_factories")]

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "nemo2_probe.py"

BASE = {
    "tp": 1,
    "pp": 1,
    "vp": 1,
    "cp": 1,
    "ep": 1,
    "sp": None,
    "mbs": 1,
    "gbs": 128,
    "seq_length": 8192,
    "recompute": "none",
    "recompute_num_layers": 0,
    "precision": "bf16",
    "fp8_recipe": "tensorwise",
    "fsdp": False,
    "tp_comm_overlap": False,
    "cpu_offload_layers": 0,
    "attention_backend": "auto",
    "num_nodes": 1,
    "max_steps": 30,
}

# (recipe, gpu, gpus_per_node, flops callback, knob values): every model, every precision recipe, every
# recompute mode, FSDP, interleaving, TP overlap with and without a tuned userbuffer config, activation offloading.
TRIALS = [
    ("llama3_8b", "h100", 8, True, dict(BASE, cp=2, mbs=2, gbs=64, cpu_offload_layers=4)),
    (
        "llama3_70b_16l",
        "h100",
        8,
        True,
        dict(
            BASE,
            tp=4,
            pp=2,
            vp=2,
            gbs=64,
            recompute="full",
            recompute_num_layers=2,
            precision="fp8",
            fp8_recipe="tensorwise",
            tp_comm_overlap=True,
            num_nodes=2,
        ),
    ),
    (
        "llama3_405b_8l",
        "h200",
        8,
        True,
        dict(
            BASE,
            tp=8,
            pp=2,
            cp=2,
            gbs=32,
            recompute="selective",
            precision="fp8",
            fp8_recipe="delayed",
            tp_comm_overlap=True,
            num_nodes=4,
        ),
    ),
    (
        "nemotron3_8b",
        "b200",
        8,
        False,
        dict(BASE, tp=2, seq_length=4096, gbs=32, precision="fp8", fp8_recipe="mxfp8", fsdp=True),
    ),
    (
        "nemotron4_15b",
        "h100",
        8,
        True,
        dict(
            BASE,
            tp=2,
            seq_length=4096,
            gbs=256,
            tp_comm_overlap=True,
            num_nodes=8,
            max_steps=10,
            attention_backend="unfused",
        ),
    ),
    (
        "nemotron4_340b_8l",
        "gb200",
        4,
        True,
        dict(
            BASE,
            tp=8,
            pp=2,
            vp=2,
            seq_length=4096,
            gbs=32,
            recompute="full",
            precision="fp8",
            fp8_recipe="blockwise",
            tp_comm_overlap=True,
            sp=True,
            num_nodes=4,
        ),
    ),
    # NVIDIA's 405B layout: 126 layers over pp=8, vp=8 only with the embedding and loss counted as layers
    ("llama3_405b", "h100", 8, True, dict(BASE, tp=8, pp=8, vp=8, cp=2, gbs=512, precision="fp8", num_nodes=128)),
]


def _nemo_python() -> Path:
    configured = os.environ.get("DSE_NEMO_ENV")
    env_dir = Path(configured) if configured else ROOT / ".venv-nemo"
    python = env_dir / "bin" / "python"
    if python.exists():
        return python
    if os.environ.get("CI") and configured:
        pytest.fail(f"DSE_NEMO_ENV={configured} has no bin/python; .ci/nemo-env.sh should have made it")
    pytest.skip(f"no NeMo environment at {env_dir}: run `bash .ci/nemo-env.sh` (or set DSE_NEMO_ENV)")


def _run_probe(python: Path, args: list[str]) -> list[dict]:
    proc = subprocess.run(
        [str(python), str(PROBE), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    results = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("DSE_PROBE ")]
    assert proc.returncode == 0 and results, (
        f"probe failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return results


@pytest.fixture(scope="module")
def nemo_python() -> Path:
    return _nemo_python()


@pytest.fixture(scope="module")
def probed(nemo_python, tmp_path_factory) -> list[tuple[tuple, tuple[str, ...], dict]]:
    """Every trial run through the payload's entry point in one NeMo process (NeMo takes ~8 s to import)."""
    cases, argvs = [], []
    for name, gpu, gpn, flops, values in TRIALS:
        argv = knobs.payload_args("nemo2", RECIPES[name], values, gpu=gpu, gpus_per_node=gpn)
        argvs.append(argv)
        cases.append({"env": {spec.ENV_FLOPS: "1" if flops else "0"}, "argv": list(argv)})
    # finetune: task and recipe from the environment, as the Slurm script sets them, no --factory in argv
    ft_values = dict(BASE, tp=4, gbs=16, seq_length=4096)
    ft_argv = knobs.payload_args("nemo2", RECIPES["llama3_8b"], ft_values, gpu="h100", gpus_per_node=8)[2:]
    cases.append({"env": {spec.ENV_TASK: "finetune", spec.ENV_RECIPE: "llama3_8b"}, "argv": list(ft_argv)})
    path = tmp_path_factory.mktemp("nemo") / "cases.json"
    path.write_text(json.dumps(cases))
    results = _run_probe(nemo_python, ["--cases", str(path)])
    assert len(results) == len(cases)
    trials = [*TRIALS, ("llama3_8b", "h100", 8, False, ft_values)]
    return list(zip(trials, [*argvs, ft_argv], results))


def _expected_fp8(values) -> dict:
    """What the precision plugin must say, from NeMo's own plugin factories."""
    if values["precision"] == "bf16":
        return {"fp8": None}
    return {
        "delayed": {"fp8": "hybrid", "fp8_recipe": "delayed", "fp8_amax_history_len": 1024, "fp8_param_gather": True},
        "tensorwise": {
            "fp8": "hybrid",
            "fp8_recipe": "tensorwise",
            "first_last_layers_bf16": False,
            "fp8_param_gather": True,
        },
        "mxfp8": {"fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True},
        "blockwise": {"fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param_gather": False},
    }[values["fp8_recipe"]]


def _expected_recompute(values) -> tuple:
    if values["recompute"] == "full":
        n = values["recompute_num_layers"]
        return ("full", "block", n) if n else ("full", "uniform", 1)
    return (None if values["recompute"] == "none" else values["recompute"], None, None)


@pytest.mark.parametrize("index", range(len(TRIALS) + 1), ids=[t[0] for t in TRIALS] + ["llama3_8b-finetune"])
def test_trial_reaches_the_nemo_config(probed, index):
    (name, gpu, gpn, flops, values), argv, got = probed[index]
    assert "error" not in got, f"{name}: {got.get('error')}\nargv: {argv}"
    recipe = RECIPES[name]
    arch = recipe.arch
    finetune = index == len(TRIALS)
    assert got["fn"] == ("finetune" if finetune else "pretrain")
    # parallel layout and batch
    assert (got["tp"], got["pp"], got["cp"], got["ep"]) == (values["tp"], values["pp"], values["cp"], values["ep"])
    assert got["vp"] == (None if values["vp"] == 1 else values["vp"])
    # embedding and loss count as pipeline layers exactly when that evens the split (never inherited)
    layers, chunks = recipe.arch.num_layers, values["pp"] * values["vp"]
    split = values["pp"] > 1 and layers % chunks != 0 and (layers + 2) % chunks == 0
    assert got["split_embedding"] is split and got["split_loss"] is split
    assert got["sp"] == (values["tp"] > 1 if values["sp"] is None else values["sp"])
    assert (got["mbs"], got["gbs"]) == (values["mbs"], values["gbs"])
    assert got["data_seq_length"] == got["model_seq_length"] == values["seq_length"]
    assert (got["num_nodes"], int(got["devices"]), got["max_steps"]) == (values["num_nodes"], gpn, values["max_steps"])
    # the model is the dse architecture (scaled reproducers: fewer layers, same width)
    assert got["num_layers"] == got["built_num_layers"] == arch.num_layers
    groups = got["num_query_groups"] or got["num_attention_heads"]  # None means one group per head (Megatron)
    assert (got["hidden_size"], got["ffn_hidden_size"], got["num_attention_heads"], groups) == (
        arch.hidden_size,
        arch.ffn_hidden_size,
        arch.num_attention_heads,
        arch.num_query_groups,
    )
    # recompute, precision, FSDP
    assert (got["recompute_granularity"], got["recompute_method"], got["recompute_num_layers"]) == _expected_recompute(
        values
    )
    n_off = values["cpu_offload_layers"]  # offloading: activations of n layers, never weights; 0 = off
    want_off = [n_off > 0, n_off, True, False]
    got_off = [
        got[f]
        for f in ("cpu_offloading", "cpu_offloading_num_layers", "cpu_offloading_activations", "cpu_offloading_weights")
    ]
    assert got_off == got["built_cpu_offloading"] == want_off
    # attention backend: a factory argument (nemo-run cannot parse the enum); auto leaves the recipe's own (auto)
    assert got["attention_backend"] == got["built_attention_backend"] == values["attention_backend"]
    for field, want in _expected_fp8(values).items():
        assert got[field] == want, f"{name}: plugins.{field}"
    assert got["built_fp8"] == _expected_fp8(values)["fp8"]
    assert got["fsdp"] == ("megatron" if values["fsdp"] else None)
    if values["fsdp"]:
        assert got["sharding"] == "optim_grads_params" and got["init_model_with_meta_device"] is True
    # callbacks built from real NeMo classes
    want_cbs = ["TimingCallback", "GarbageCollectionCallback", "MegatronCommOverlapCallback"]
    assert sorted(got["built_callbacks"]) == sorted(want_cbs + (["FLOPsMeasurementCallback"] if flops else []))
    assert got["tp_comm_overlap"] is values["tp_comm_overlap"]
    ub = knobs.factory_args(values, gpu=gpu, hidden_size=arch.hidden_size).get("tp_comm_overlap_cfg")
    assert (got["tp_comm_overlap_cfg"] is not None) == bool(ub)
    if ub:
        assert got["built_ub_cfg"] == "TransformerLayerTPOverlapCfg"
    if flops:  # the callback sees the overridden model and data, not the recipe's defaults
        model = spec.MODELS[recipe.scaled_from or recipe.name]
        assert (got["flops_model_name"], got["flops_seq_length"], got["flops_gbs"]) == (
            model.flops_name,
            values["seq_length"],
            values["gbs"],
        )
    if not finetune:  # mock data with a null tokenizer of the model's vocabulary (NullTokenizer adds EOD)
        assert got["vocab_size"] == arch.vocab_size and got["built_vocab_size"] == arch.vocab_size + 1
        assert got["limit_val_batches"] == 0 and got["check_for_nan_in_grad"] is False
        # TE's fused loss, which dse.perfmodel.stack prices for this payload (NeMo's LoRA finetune recipes turn
        # the loss fusion off: "some settings currently do not function correctly with LoRA")
        assert got["cross_entropy"][0] is True
    assert got["cross_entropy"][1] == "te"


def test_tables_match_the_installed_nemo(nemo_python):
    (got,) = _run_probe(nemo_python, ["--tables"])
    assert got == {
        "missing_modules": [],
        "missing_registry_modules": [],
        "missing_userbuffers": [],
        "unlisted_userbuffers": [],
    }


def test_unknown_task_is_refused_before_nemo_runs(nemo_python):
    proc = subprocess.run(
        [str(nemo_python), "-m", "recipes.nemo2", "--factory", "llama3_8b_recipe", "-y"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, spec.ENV_TASK: "sft"},
    )
    assert proc.returncode != 0 and "DSE_NEMO_TASK='sft' is not a task" in proc.stderr
