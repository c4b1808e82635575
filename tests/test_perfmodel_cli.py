"""``dse predict``: JSON output, defaults from the recipe, and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dse.cli import app

runner = CliRunner()

LAYOUT_405B = [
    "--model",
    "llama3_405b",
    "--gpu",
    "h100",
    "--num-gpus",
    "1024",
    "--precision",
    "fp8",
    "--seq-length",
    "8192",
    "--gbs",
    "512",
    "--mbs",
    "1",
    "--tp",
    "8",
    "--pp",
    "8",
    "--cp",
    "2",
    "--vp",
    "8",
]

GPT3 = """name = "gpt3_175b"
num_layers = 96
hidden_size = 12288
num_attention_heads = 96
num_query_groups = 96
ffn_hidden_size = 49152
vocab_size = 51200
gated_mlp = false
"""


def test_predict_json_has_the_figures():
    res = runner.invoke(app, ["predict", *LAYOUT_405B, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "peak_memory_gib", "fits"):
        assert key in out
    assert out["fits"] is True and out["sp"] is True and out["dp"] == 8
    assert out["tokens_per_s_per_gpu"] == pytest.approx(512 * 8192 / (out["step_time_s"] * 1024))


def test_flops_convention_changes_tflops_not_tokens():
    causal = json.loads(runner.invoke(app, ["predict", *LAYOUT_405B, "--json"]).stdout)
    noncausal = json.loads(
        runner.invoke(app, ["predict", *LAYOUT_405B, "--json", "--flops-convention", "noncausal"]).stdout
    )
    assert noncausal["tflops_per_gpu"] > causal["tflops_per_gpu"]
    assert noncausal["tokens_per_s_per_gpu"] == pytest.approx(causal["tokens_per_s_per_gpu"])


def test_table_output_and_recipe_defaults():
    res = runner.invoke(app, ["predict", "--model", "llama3_70b", "--gpu", "h100", "--precision", "fp8"])
    assert res.exit_code == 0, res.output
    assert "tokens/s/GPU" in res.stdout and "tp=4 pp=8" in res.stdout  # the recipe's H100 FP8 layout


def test_model_file(tmp_path):
    f = tmp_path / "gpt3.toml"
    f.write_text(GPT3)
    res = runner.invoke(
        app,
        [
            "predict",
            "--model-file",
            str(f),
            "--gpu",
            "a100",
            "--num-gpus",
            "64",
            "--seq-length",
            "2048",
            "--gbs",
            "64",
            "--tp",
            "8",
            "--pp",
            "8",
            "--recompute",
            "selective",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["model"] == "gpt3_175b" and out["fits"] is True


@pytest.mark.parametrize(
    "text,field",
    [
        (GPT3.replace("num_attention_heads = 96", 'num_attention_heads = "many"'), "num_attention_heads"),
        (GPT3.replace("vocab_size = 51200\n", ""), "vocab_size"),
        (GPT3 + "bias = true\n", "bias"),
        (GPT3.replace("hidden_size = 12288", "hidden_size = 12289"), "hidden_size"),
        ("name = [", None),
    ],
)
def test_bad_model_file_is_one_line_and_exit_2(tmp_path, text, field):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    res = runner.invoke(
        app, ["predict", "--model-file", str(f), "--gpu", "a100", "--num-gpus", "8", "--seq-length", "2048"]
    )
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and "Traceback" not in res.output
    if field:
        assert field in lines[0]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--tp", "3"], "tp*pp*cp"),
        (["--tp", "16"], "tp=16"),
        (["--gpu", "h10"], "h100"),
        (["--precision", "fp4"], "--precision"),
        (["--recompute", "some"], "recompute"),
    ],
)
def test_invalid_input_exits_2_with_the_reason(args, needle):
    base = dict(zip(LAYOUT_405B[::2], LAYOUT_405B[1::2]))
    base.update(dict(zip(args[::2], args[1::2])))
    res = runner.invoke(app, ["predict", *[x for kv in base.items() for x in kv]])
    assert res.exit_code == 2
    assert needle in res.output and len(res.output.strip().splitlines()) == 1


def test_model_and_model_file_are_exclusive():
    res = runner.invoke(app, ["predict", "--gpu", "h100"])
    assert res.exit_code == 2 and "--model" in res.output


def test_cpu_offload_layers_flag_defaults_to_the_recipe_and_is_checked():
    base = ["predict", "--model", "llama3_70b", "--gpu", "gb200", "--precision", "fp8", "--json"]
    default = json.loads(runner.invoke(app, base).stdout)  # the recipe's GB200 layout offloads 40 layers
    off = json.loads(runner.invoke(app, [*base, "--cpu-offload-layers", "0"]).stdout)
    assert off["peak_memory_gib"] > default["peak_memory_gib"] + 100
    res = runner.invoke(app, [*base, "--cpu-offload-layers", "40", "--pp", "2", "--no-fsdp"])
    assert res.exit_code == 2 and "needs pp=1" in res.output


def test_predict_takes_the_attention_backend_and_fp8_recipe():
    import json

    from typer.testing import CliRunner

    from dse.cli import app

    def run(*extra):
        r = CliRunner().invoke(
            app,
            [
                "predict",
                "--model",
                "llama3_70b",
                "--gpu",
                "b200",
                "--num-gpus",
                "64",
                "--tp",
                "4",
                "--pp",
                "4",
                "--cp",
                "1",
                "--vp",
                "5",
                "--json",
                *extra,
            ],
        )
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    flash, unfused = run(), run("--attention-backend", "unfused")
    assert flash["attention_backend"] == "auto" and unfused["attention_backend"] == "unfused"
    assert unfused["step_time_s"] > flash["step_time_s"]  # the s x s scores cost time
    assert unfused["peak_memory_gib"] > flash["peak_memory_gib"]  # and memory (5as/h)
    mx = run("--precision", "fp8", "--fp8-recipe", "mxfp8")
    assert mx["precision"] == "fp8" and mx["fp8_recipe"] == "mxfp8"
    bad = CliRunner().invoke(app, ["predict", "--model", "llama3_70b", "--gpu", "b200", "--attention-backend", "x"])
    assert bad.exit_code == 2 and "attention_backend takes one of" in bad.output


_MODEL_FILE_ARGS = [
    "predict",
    "--gpu",
    "h100",
    "--num-gpus",
    "64",
    "--seq-length",
    "2048",
    "--gbs",
    "64",
    "--tp",
    "8",
    "--pp",
    "8",
    "--json",
]


def _model_file_run(tmp_path, name: str, line: str):
    """``dse predict --model-file`` on GPT-3 175B's file with one more line."""
    f = tmp_path / f"{name}.toml"
    f.write_text(GPT3 + line + "\n")
    return runner.invoke(app, [*_MODEL_FILE_ARGS, "--model-file", str(f)])


def _step_time(tmp_path, name: str, line: str) -> float:
    res = _model_file_run(tmp_path, name, line)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["step_time_s"]


def _assert_one_line_refusal(tmp_path, line: str, field: str) -> None:
    res = _model_file_run(tmp_path, "bad", line)
    assert res.exit_code == 2, (line, res.output)
    assert "bad.toml" in res.output and field in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_model_file_activation(tmp_path):
    """A model file may say its MLP runs Nemotron's eager squared ReLU (slower on NVIDIA's stacks); any other
    value is a one-line error naming the file and the field, exit code 2."""
    fused = _step_time(tmp_path, "fused", 'activation = "fused"')
    assert _step_time(tmp_path, "squared_relu", 'activation = "squared_relu"') > fused
    _assert_one_line_refusal(tmp_path, 'activation = "$(rm -rf ~)"', "activation")


def test_model_file_dropout(tmp_path):
    """A model file may give the dropout it trains with (slower: the masks); outside [0, 1) is a one-line error
    naming the file and the field, exit code 2."""
    assert _step_time(tmp_path, "d1", "dropout = 0.1") > _step_time(tmp_path, "d0", "dropout = 0.0")
    for bad_value in ("1.5", "-0.1", '"0.1; rm -rf ~"'):
        _assert_one_line_refusal(tmp_path, f"dropout = {bad_value}", "dropout")
