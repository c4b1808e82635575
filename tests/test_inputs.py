"""Hostile inputs (issue 36, items 7, 8, 10, 11): every input file is a regular file of bounded size, every number
of a space, system or calibration file has a type and a range, every count a cap, and each refusal is one line
with exit code 2 (tests.helpers.one_line_error), never a traceback, a hang or an exhausted machine."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dse.inputs import MAX_INPUT_BYTES
from tests.helpers import SMALL_SPACE, dse, one_line_error, write_space

MODEL = """name = "tiny"
num_layers = 2
hidden_size = 64
num_attention_heads = 4
ffn_hidden_size = 128
vocab_size = 1000
gated_mlp = true
"""
CALIBRATION = '[params]\nstep_overhead_s = 0.02\n\n[provenance]\ngpu = "h100"\nruns = 3\n'


@pytest.fixture(autouse=True)
def _no_hang():
    """A reader that blocks (a FIFO opened for reading) fails the test instead of hanging the suite."""

    def stuck(*_):
        raise TimeoutError("a reader blocked")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# -- 7. paths that are not small regular files ------------------------------------------------------------------
def _hostile(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"hostile-{kind}.toml"
    if kind == "device":
        return Path("/dev/zero")
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "loop":
        other = tmp_path / "other.toml"
        p.symlink_to(other)
        other.symlink_to(p)
    elif kind == "large":
        p.write_text("# " + "x" * MAX_INPUT_BYTES + "\n")
    elif kind == "directory":
        p.mkdir()
    elif kind == "binary":
        p.write_bytes(b"\x00\xff\xfe" * 100)
    return p


KINDS = {
    "device": "not a regular file",
    "fifo": "not a regular file",
    "loop": "a symlink loop",
    "large": "at most 1 MiB",
    "directory": "is a directory",
    "binary": "not UTF-8 text",
}


def _read_by(reader: str, path: Path, tmp_path: Path):
    """``dse`` reading ``path`` as the ``reader`` input."""
    if reader == "space":
        return dse("validate", path)
    if reader == "system":
        return dse("validate", write_space(tmp_path, SMALL_SPACE.replace('system = "h100"', f'system = "{path}"')))
    if reader == "space-calibration":
        text = SMALL_SPACE.replace("[search]", f'[backend]\ncalibration = "{path}"\n\n[search]')
        return dse("validate", write_space(tmp_path, text))
    if reader == "model-file":
        return dse("predict", "--model-file", path, "--gpu", "h100", "--num-gpus", "8", "--seq-length", "512")
    if reader == "calibration":
        return dse("predict", "--model", "llama3_8b", "--gpu", "h100", "--calibration", path)
    if reader == "cloudai-test":
        return dse("import", "cloudai", path, "--gpu", "h100", "--out", tmp_path / "o" / "s.toml")
    assert reader == "cloudai-system"
    test = Path(__file__).parent / "fixtures" / "cloudai" / "test" / "llama3_8b_dse.toml"
    return dse("import", "cloudai", test, "--system", path, "--gpu", "h100", "--out", tmp_path / "o" / "s.toml")


READERS = ["space", "system", "space-calibration", "model-file", "calibration", "cloudai-test", "cloudai-system"]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("reader", READERS)
def test_an_input_that_is_not_a_small_regular_file_is_one_line(tmp_path, reader, kind):
    path = _hostile(tmp_path, kind)
    one_line_error(_read_by(reader, path, tmp_path), str(path), KINDS[kind])
    assert not (tmp_path / "o").exists()


def test_a_symlink_to_a_file_is_read(tmp_path):
    real = write_space(tmp_path, name="real.toml")
    (tmp_path / "link.toml").symlink_to(real)
    r = dse("validate", tmp_path / "link.toml")
    assert r.exit_code == 0, r.output


def test_the_reader_never_opens_a_fifo(tmp_path):
    """The check is made before any open: a FIFO's reader never blocks, even with no writer."""
    from dse.errors import UserError
    from dse.inputs import read_text

    fifo = _hostile(tmp_path, "fifo")
    with pytest.raises(UserError, match="not a regular file"):
        read_text(fifo)


# -- 11. TOML that Python's parser cannot take ------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, needle",
    [
        ("x = " + "[" * 5000 + "]" * 5000, "nested too deeply"),
        ("x = " + "{a = " * 3000 + "1" + "}" * 3000, "nested too deeply"),
        (SMALL_SPACE.replace("max_steps = 20", "max_steps = " + "9" * 5000), "a number too long"),
        (SMALL_SPACE.replace("num_nodes = 2", "num_nodes = 1" + "0" * 4400), "a number too long"),
    ],
)
def test_toml_the_parser_cannot_take_is_one_line(tmp_path, text, needle):
    one_line_error(dse("validate", write_space(tmp_path, text)), "space.toml", needle)


# -- 8. caps on knobs, settings, values and trials ----------------------------------------------------------
def _env_knobs(n: int, values: int = 1) -> str:
    return "\n".join(f'"env.NCCL_X{i}" = [' + f"{', '.join(str(v) for v in range(values))}]" for i in range(n))


@pytest.mark.parametrize(
    "repl, needles",
    [
        (("[objective]", _env_knobs(65) + "\n\n[objective]"), ("knobs", "at most 64")),
        (("[objective]", _env_knobs(20_000) + "\n\n[objective]"), ("knobs", "20,004 knobs")),
        (("[objective]", _env_knobs(100_000) + "\n\n[objective]"), ("space.toml", "at most 1 MiB")),
        (("[objective]", _env_knobs(9, 1000) + "\n\n[objective]"), ("knobs", "at most 8,192")),
        (
            ("max_steps = 20", "max_steps = 20\n" + "\n".join(f'"env.NCCL_S{i}" = 1' for i in range(130))),
            ("settings", "at most 128"),
        ),
        (("seed = 0", "seed = 0\ntrials = 10000001"), ("search.trials", "10000000")),
    ],
)
def test_counts_are_capped_at_load(tmp_path, repl, needles):
    path = write_space(tmp_path, SMALL_SPACE.replace(*repl))
    one_line_error(dse("validate", path), *needles)


def test_the_caps_hold_what_the_largest_supported_space_needs(tmp_path):
    """At the caps exactly (64 knobs; 8 knobs of 1024 values in all), a space loads."""
    from dse.rules.space import MAX_KNOBS, load_space

    text = SMALL_SPACE.replace("[objective]", _env_knobs(MAX_KNOBS - 4) + "\n\n[objective]")
    assert len(load_space(write_space(tmp_path, text)).knobs) == MAX_KNOBS


# -- 10. strict types and ranges in space and system files --------------------------------------------------
SYSTEM_INLINE = 'system = {name = "s", gpu = "h100", gpus_per_node = 8, %s}'


@pytest.mark.parametrize(
    "repl, needles",
    [
        (("num_nodes = 2", "num_nodes = true"), ("num_nodes", "valid integer", "True")),
        (("num_nodes = 2", "num_nodes = 2.0"), ("num_nodes", "valid integer")),
        (("seed = 0", 'seed = 0\ntrials = "5"'), ("search.trials", "valid integer", "'5'")),
        (("seed = 0", 'seed = "0"'), ("search.seed", "valid integer")),
        (("max_steps = 20", 'max_steps = 20\n"env.NCCL_X" = nan'), ("settings.env.NCCL_X", "nan")),
        (("max_steps = 20", 'max_steps = 20\n"env.NCCL_X" = inf'), ("settings.env.NCCL_X", "inf")),
        (("max_steps = 20", 'max_steps = 20\n"env.NCCL_X" = -inf'), ("settings.env.NCCL_X", "-inf")),
        (("max_steps = 20", "max_steps = true"), ("settings.max_steps", "not an integer")),
        (("[search]", "[backend]\ntwin_seed = 18446744073709551616\n\n[search]"), ("backend.twin_seed",)),
        (("[search]", '[backend]\ntimeout_s = "60"\n\n[search]'), ("backend.timeout_s", "valid number")),
        (("[search]", '[backend.early_stop]\nenabled = "yes"\n\n[search]'), ("backend.early_stop.enabled", "boolean")),
        (('system = "h100"', SYSTEM_INLINE % 'slurm = {use_container = "yes"}'), ("use_container", "boolean")),
        (('system = "h100"', SYSTEM_INLINE % "startup_s = inf"), ("system.startup_s", "finite")),
        (('system = "h100"', SYSTEM_INLINE % "startup_s = 1e9"), ("system.startup_s", "86400")),
        (('system = "h100"', SYSTEM_INLINE % "price_per_gpu_hour = inf"), ("price_per_gpu_hour", "finite")),
        (('system = "h100"', SYSTEM_INLINE % "nvlink_domain = true"), ("nvlink_domain", "valid integer")),
        (('system = "h100"', SYSTEM_INLINE % "scaleout_gbps = nan"), ("scaleout_gbps", "finite")),
        (
            ('system = "h100"', SYSTEM_INLINE % "scaleout_gbps = 1e-300"),
            ("scaleout_gbps", "greater than or equal to 1"),
        ),
        (('system = "h100"', SYSTEM_INLINE % 'scaleout_gbps = "400"'), ("scaleout_gbps", "valid number")),
        (('system = "h100"', SYSTEM_INLINE % "slurm = {exclusive = 1}"), ("slurm.exclusive", "boolean")),
        (('metric = "tflops_per_gpu"', 'metric = "tflops_per_gpu"\nfailure_reward = 1e300'), ("failure_reward",)),
    ],
)
def test_strict_types_and_ranges(tmp_path, repl, needles):
    assert repl[0] in SMALL_SPACE
    out = tmp_path / "out"
    path = write_space(tmp_path, SMALL_SPACE.replace(*repl))
    one_line_error(dse("run", "--space", path, "--out", out), *needles)
    assert not out.exists()


@pytest.mark.parametrize(
    "agent, option, needles",
    [
        ("guided", "tau_bias = inf", ("search.options.tau_bias", "finite")),
        ("guided", 'tau_bias = "0.1"', ("search.options.tau_bias", "valid number")),
        ("guided", "stop_prob = 1.5", ("search.options.stop_prob",)),
        ("random", "max_invalid_draws = true", ("search.options.max_invalid_draws", "valid integer")),
        ("random", "seed = 3", ("search.options.seed", "has no option 'seed'")),
        ("optuna", "parallel = 2.5", ("search.options.parallel", "valid integer")),
    ],
)
def test_agent_options_are_strict(tmp_path, agent, option, needles):
    """``[search.options]`` is typed and bounded as the rest of the space; an option named like one of the agent
    constructor's own keywords (seed) is refused as unknown, not a TypeError."""
    text = SMALL_SPACE.replace('agent = "grid"', f'agent = "{agent}"') + f"\n[search.options]\n{option}\n"
    out = tmp_path / "out"
    one_line_error(
        dse("run", "--space", write_space(tmp_path, text), "--out", out, "--trials", "2"), "space.toml", *needles
    )
    assert not out.exists()


def test_a_system_file_is_strict_too(tmp_path):
    sysf = tmp_path / "sys.toml"
    sysf.write_text('name = "s"\ngpu = "h100"\ngpus_per_node = true\n')
    path = write_space(tmp_path, SMALL_SPACE.replace('system = "h100"', f'system = "{sysf}"'))
    one_line_error(dse("validate", path), "sys.toml", "gpus_per_node", "valid integer")


def test_an_integer_is_still_a_float(tmp_path):
    # (no container: validate runs dse run's checks, and best/'s Slurm script would need an image otherwise)
    fields = "scaleout_gbps = 400, startup_s = 60, slurm = {use_container = false}"
    text = SMALL_SPACE.replace('system = "h100"', SYSTEM_INLINE % fields)
    r = dse("validate", write_space(tmp_path, text))
    assert r.exit_code == 0, r.output


# -- 10. calibration parameters have ranges -------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, needles",
    [
        ("step_overhead_s = -100", ("params.step_overhead_s", "out of range", ">= 0")),
        ("memory_offset_gib = -1e308", ("params.memory_offset_gib", ">= -1024")),
        ("memory_offset_gib = 1e308", ("params.memory_offset_gib", "<= 1024")),
        ("elementwise_scale = 0", ("params.elementwise_scale", ">= 0.001")),
        ("nvlink_eff = 1e-300", ("params.nvlink_eff", "divides a time")),
        ("nvlink_eff = 1e308", ("params.nvlink_eff", "<= 10")),
        ("tp_overlap = 1.5", ("params.tp_overlap", "<= 1")),
        ("step_overhead_s = nan", ("params.step_overhead_s", "not a number")),
        ("step_overhead_s = inf", ("params.step_overhead_s", "not a number")),
        ("step_overhead_s = true", ("params.step_overhead_s", "not a number")),
        ("warp_speed = 1.0", ("params.warp_speed", "unknown parameter")),
    ],
)
def test_calibration_parameters_have_ranges(tmp_path, line, needles):
    cal = tmp_path / "cal.toml"
    cal.write_text(CALIBRATION.replace("step_overhead_s = 0.02", line))
    one_line_error(dse("predict", "--model", "llama3_8b", "--gpu", "h100", "--calibration", cal), "cal.toml", *needles)
    # the same file named by a space is refused when the space is read, before any trial
    text = SMALL_SPACE.replace("[search]", '[backend]\ncalibration = "cal.toml"\n\n[search]')
    one_line_error(dse("validate", write_space(tmp_path, text)), "backend.calibration", *needles[1:])


@pytest.mark.parametrize(
    "repl, needle",
    [
        (("runs = 3", 'runs = "3"'), "provenance.runs"),
        (("runs = 3", "runs = 3\nsources = 5"), "provenance.sources"),
        (('[provenance]\ngpu = "h100"', 'provenance = 5\n[x]\ngpu = "h100"'), "provenance"),
        (("runs = 3", "runs = 3\nmemory_miss_gib = -1.0"), "provenance.memory_miss_gib"),
        (("runs = 3", "runs = 3\nmemory_miss_gib = nan"), "provenance.memory_miss_gib"),
        (("runs = 3", 'runs = 3\nmemory_miss_gib = "9"'), "provenance.memory_miss_gib"),
        (("runs = 3", "runs = 3\nmemory_miss_gib = 1e308"), "provenance.memory_miss_gib"),
    ],
)
def test_calibration_provenance_is_typed(tmp_path, repl, needle):
    cal = tmp_path / "cal.toml"
    cal.write_text(CALIBRATION.replace(*repl))
    one_line_error(dse("predict", "--model", "llama3_8b", "--gpu", "h100", "--calibration", cal), needle)


def test_every_model_parameter_has_a_range():
    from dse.facts.calibration_file import PARAM_RANGES
    from dse.perfmodel.timing import DEFAULT_PARAMS, PARAM_NAMES

    assert set(PARAM_RANGES) == set(PARAM_NAMES)
    for name, r in PARAM_RANGES.items():  # the shipped values lie in their ranges
        assert r.holds(getattr(DEFAULT_PARAMS, name)), name


def test_a_calibration_at_its_ranges_predicts_finite_positive_figures(tmp_path):
    """The ranges' ends give a prediction, not a ZeroDivisionError, an OverflowError or a negative time."""
    import math

    from dse.facts.calibration_file import PARAM_RANGES

    for end in ("low", "high"):
        values = {n: (r.high if end == "high" else r.low) for n, r in PARAM_RANGES.items()}
        cal = tmp_path / f"{end}.toml"
        cal.write_text(
            "[params]\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items()) + '[provenance]\ngpu = "h100"\n'
        )
        r = dse("predict", "--model", "llama3_8b", "--gpu", "h100", "--calibration", cal, "--json")
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert math.isfinite(out["step_time_s"]) and out["step_time_s"] > 0, out


# -- 10. storage that would vanish --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    ["sqlite:///:memory:", "sqlite://", "sqlite:///file::memory:?uri=true", "sqlite:///file:x?mode=memory&uri=true"],
)
def test_in_memory_storage_is_refused(tmp_path, url):
    out = tmp_path / "out"
    one_line_error(
        dse("run", "--space", write_space(tmp_path), "--out", out, "--storage", url), "--storage", "in-memory"
    )
    assert not out.exists()


# -- 11. command-line values -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, needles",
    [
        (("--num-gpus", "1000000000000"), ("--num-gpus", "out of range", "800,000")),
        (("--num-gpus", "0"), ("--num-gpus", "out of range")),
        (("--gpus-per-node", "1000000"), ("--gpus-per-node", "1 to 1024")),
        (("--gpus-per-node", "0"), ("--gpus-per-node", "1 to 1024")),
    ],
)
def test_predict_counts_are_bounded(args, needles):
    one_line_error(dse("predict", "--model", "llama3_8b", "--gpu", "h100", *args), *needles)


@pytest.mark.parametrize("value", ["9" * 5000, "[" * 5000])
def test_predict_set_values_python_cannot_read_are_one_line(value):
    one_line_error(dse("predict", "--model", "llama3_8b", "--gpu", "h100", "--set", f"tp={value}"), "--set tp")


@pytest.mark.parametrize("cmd", ["space", "run"])
def test_twin_seeds_are_bounded_on_the_command_line(tmp_path, cmd):
    path, out = write_space(tmp_path), tmp_path / "out"
    args = (
        [path, "--twin-seed", str(2**64)]
        if cmd == "space"
        else ["--space", path, "--out", out, "--twin-seed", str(2**64)]
    )
    one_line_error(dse(cmd, *args), "--twin-seed", "4294967295")
    assert not out.exists()


@pytest.mark.parametrize("trials", ["10000001", "99999999999999999999999"])
def test_run_trials_are_bounded(tmp_path, trials):
    out = tmp_path / "out"
    one_line_error(
        dse("run", "--space", write_space(tmp_path), "--out", out, "--trials", trials), "--trials", "10,000,000"
    )
    assert not out.exists()


def test_calibrate_sources_that_are_binary_or_no_study_are_one_line(study, tmp_path):
    binary = tmp_path / "runs.tsv"
    binary.write_bytes(b"name\tgpu\n\x94\xff\xfe" * 50)
    one_line_error(dse("calibrate", binary, "--gpu", "h100", "--out", tmp_path / "c.toml"), "runs.tsv", "not UTF-8")
    header = "\t".join(["model", "gpu", "step_time_ms"]) + "\n"
    wide = tmp_path / "wide.tsv"
    wide.write_text(header + "x" * 200_000 + "\n")
    r = dse("calibrate", wide, "--gpu", "h100", "--out", tmp_path / "c.toml")
    one_line_error(r, "wide.tsv")
    out = _copy(study, tmp_path)
    (out / "dse.json").write_text("[1]")
    one_line_error(dse("calibrate", out, "--out", tmp_path / "c.toml"), "dse.json", "not a dse.json")
    assert not (tmp_path / "c.toml").exists()


def test_calibrate_out_that_is_a_directory_is_refused_before_the_fit(tmp_path):
    (tmp_path / "d").mkdir()
    one_line_error(dse("calibrate", tmp_path / "nothing", "--out", tmp_path / "d"), "--out", "is a directory")
    one_line_error(dse("calibrate", tmp_path / "nothing", "--out", tmp_path / "no" / "c.toml"), "folder does not exist")


@pytest.mark.parametrize(
    "field, value",
    [
        ("name", "x" * 129),
        ("num_layers", 10**6),
        ("hidden_size", 10**300),
        ("num_layers", True),
        ("hidden_size", '"64"'),
        ("vocab_size", 1.5),
    ],
)
def test_model_file_values_have_types_and_ranges(tmp_path, field, value):
    f = tmp_path / "m.toml"
    shown = json.dumps(value) if field == "name" else str(value).lower() if isinstance(value, bool) else value
    lines = [ln if not ln.startswith(field + " ") else f"{field} = {shown}" for ln in MODEL.splitlines()]
    f.write_text("\n".join(lines) + "\n")
    r = dse("predict", "--model-file", f, "--gpu", "h100", "--num-gpus", "8", "--seq-length", "512")
    one_line_error(r, "m.toml", field)


def test_a_model_name_with_terminal_escapes_prints_inert(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(MODEL.replace('name = "tiny"', 'name = "\\u001b[2J\\u001b]0;owned\\u0007[bold]x\\u009b31m"'))
    r = dse("predict", "--model-file", f, "--gpu", "h100", "--num-gpus", "8", "--seq-length", "512")
    assert r.exit_code == 0, r.output
    assert not any(c in r.stdout for c in "\x1b\x07\x9b"), repr(r.stdout[:200])
    assert "\\x1b[2J\\x1b]0;owned\\x07[bold]x\\x9b31m" in r.stdout.replace("\n", "")


def test_an_error_line_escapes_control_characters(tmp_path):
    r = dse("validate", tmp_path / "no\x1b[2Jsuch.toml")
    line = one_line_error(r, "\\x1b[2J")
    assert "\x1b" not in line


# -- 11. what a study directory holds ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("study")
    out = tmp / "out"
    r = dse("run", "--space", write_space(tmp), "--out", out, "--trials", "3", "--agent", "random")
    assert r.exit_code == 0, r.output
    return out


def _copy(study: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(study, tmp_path / "copy"))


@pytest.mark.parametrize(
    "edit, needles",
    [
        (lambda m: m.pop("knobs"), ("knobs", "missing or not a JSON object")),
        (lambda m: m.update(knobs={"tp": 1}), ("knobs", "JSON list")),
        (lambda m: m.update(study_name=5), ("study_name", "JSON string")),
        (lambda m: m.pop("storage"), ("storage",)),
    ],
)
@pytest.mark.parametrize("cmd", ["leaderboard", "report"])
def test_a_dse_json_without_what_readers_need_is_one_line(study, tmp_path, edit, needles, cmd):
    out = _copy(study, tmp_path)
    meta = json.loads((out / "dse.json").read_text())
    edit(meta)
    (out / "dse.json").write_text(json.dumps(meta))
    one_line_error(dse(cmd, out), "dse.json", *needles)


@pytest.mark.parametrize("text, needle", [("[1, 2]", "not a JSON object"), ("[" * 100_000, "cannot read")])
def test_a_dse_json_that_is_no_object_is_one_line(study, tmp_path, text, needle):
    out = _copy(study, tmp_path)
    (out / "dse.json").write_text(text)
    one_line_error(dse("leaderboard", out), "dse.json", needle)


def test_a_log_named_gz_that_is_not_gzip_parses_inertly(tmp_path):
    """A ``log.txt.gz`` that is not gzip is read as the text it is; gzip's magic followed by junk is a failed
    trial that says the log is corrupt; a truncated one is read up to where it breaks."""
    from dse.logs.parse import parse_log

    line = "Training epoch 0, iteration {i}/9 | global_step: {i} | train_step_timing in s: 2.5 | TFLOPS_per_GPU: 400\n"
    text = "".join(line.format(i=i) for i in range(10))
    plain = tmp_path / "a" / "log.txt.gz"
    plain.parent.mkdir()
    plain.write_text(text)
    assert parse_log(plain, exit_code=0).step_time_s == 2.5
    junk = tmp_path / "b" / "log.txt.gz"
    junk.parent.mkdir()
    junk.write_bytes(b"\x1f\x8b" + os.urandom(4000))
    broken = parse_log(junk, exit_code=0)
    assert broken.status == "failed" and broken.reason.startswith("corrupt log: log.txt.gz"), broken
    cut = tmp_path / "c" / "log.txt.gz"
    cut.parent.mkdir()
    packed = gzip.compress(text.encode() * 50)
    cut.write_bytes(packed[: len(packed) // 2])
    m = parse_log(cut, exit_code=0)
    assert m.steps > 0 and (m.status == "ok" or m.reason.startswith("corrupt log")), m
    r = dse("parse", cut.parent)
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output


def _drop_privileges() -> list[str] | None:
    """A prefix that runs a command as an unprivileged user (root ignores file modes), or [] when not root."""
    if os.geteuid() != 0:
        return []
    import shutil

    setpriv = shutil.which("setpriv")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"] if setpriv else None


def test_a_read_only_study_is_read(study, tmp_path_factory):
    """``dse leaderboard`` and ``dse report --html`` elsewhere read a study its user may not write: the table,
    no traceback; a report into the study directory is one line."""
    import shutil
    import tempfile

    prefix = _drop_privileges()
    if prefix is None:
        pytest.skip("running as root without setpriv: file modes cannot be tested")
    root = Path(tempfile.mkdtemp(prefix="dse-ro-"))
    try:
        out = Path(shutil.copytree(study, root / "out"))
        for p in [root, *root.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        cmd = [*prefix, sys.executable, "-m", "dse"]
        env = {**os.environ, "HOME": str(root)}
        r = subprocess.run([*cmd, "leaderboard", str(out)], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0 and "statuses: ok 3" in r.stdout, r.stdout + r.stderr
        r = subprocess.run([*cmd, "report", str(out)], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "cannot write" in r.stderr, r.stderr
    finally:
        for p in [root, *root.rglob("*")]:
            p.chmod(0o755)
        shutil.rmtree(root)
