"""A hostile-input audit of the ``dse`` command: a reproducible corpus of bad inputs, each run through the CLI in a
subprocess, classified as refused (exit 2), accepted (exit 0), traceback (a "Traceback" or any other exit) or hang
(past the timeout). Prints the counts and every traceback, hang and suspicious accept.

    python bench/hostile.py                 # the whole corpus, 2 workers, 60 s per case
    python bench/hostile.py --only env -j 4 # the cases whose id contains "env"
    python bench/hostile.py --faults 5      # also SIGKILL a sim study 5 times, resume, compare with a clean run

Every case builds its own files in a fresh temporary directory (the CLI runs there), so the corpus is the same on
every machine. A case says what it expects: "refuse" (an accept is suspicious), "accept" (a refusal is noted) or
"any" (either is fine: a value that is legal but odd).
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLOUDAI = ROOT / "tests" / "fixtures" / "cloudai"

# A small, fast space: 2 grid points on the simulated backend. Each hostile case replaces one field.
BASE_SPACE: list[tuple[str, str, str]] = [
    ("", "name", '"hostile"'),
    ("", "recipe", '"llama3_8b"'),
    ("", "system", '"system.toml"'),
    ("", "num_nodes", "1"),
    ("settings", "seq_length", "8192"),
    ("settings", "gbs", "128"),
    ("settings", "max_steps", "20"),
    ("knobs", "tp", "[1, 2]"),
    ("knobs", "precision", '["bf16"]'),
    ("objective", "metric", '"tflops_per_gpu"'),
    ("objective", "direction", '"maximize"'),
    ("search", "agent", '"grid"'),
    ("search", "sampler", '"tpe"'),
    ("search", "trials", "2"),
    ("search", "seed", "0"),
    ("search", "parallel", "1"),
    ("search", "screen", '"memory"'),
    ("search", "screen_margin", "0.05"),
    ("backend", "kind", '"sim"'),
    ("backend", "payload", '"nemo2"'),
    ("backend", "truth", '"exact"'),
    ("backend", "twin_seed", "0"),
    ("backend", "timeout_s", "600"),
]
BASE_SYSTEM: list[tuple[str, str, str]] = [
    ("", "name", '"h100"'),
    ("", "gpu", '"h100"'),
    ("", "gpus_per_node", "8"),
    ("", "nvlink_domain", "8"),
    ("", "scaleout_gbps", "400"),
    ("", "container", '"25.09"'),
    ("", "startup_s", "60"),
    ("slurm", "partition", '""'),
    ("slurm", "account", '""'),
    ("slurm", "time_limit", '"00:30:00"'),
    ("slurm", "container_image", '"nvcr.io#nvidia/nemo:25.09"'),
    ("slurm", "container_mounts", "[]"),
    ("slurm", "use_container", "true"),
    ("slurm", "srun_args", "[]"),
    ("slurm", "job_dir", '""'),
    ("slurm", "max_pending", '""'),
]
MODEL = [
    ("", "name", '"tiny"'),
    ("", "num_layers", "2"),
    ("", "hidden_size", "64"),
    ("", "num_attention_heads", "4"),
    ("", "ffn_hidden_size", "128"),
    ("", "vocab_size", "1000"),
    ("", "gated_mlp", "true"),
]
CALIBRATION = [("params", "step_overhead_s", "0.02"), ("provenance", "gpu", '"h100"'), ("provenance", "runs", "3")]

# Hostile TOML values: control characters, newlines, huge numbers, NaN/inf, wrong types, unicode, shell text.
HOSTILE_VALUES: dict[str, str] = {
    "newline": '"a\\nb"',
    "escape": '"\\u001b[2J\\u001b]0;owned\\u0007"',
    "shell": '"$(touch pwned); `id` | x > /tmp/y"',
    "unicode": '"\\u202eLLAMA\\u00e9\\u65e5"',
    "empty": '""',
    "long": '"' + "x" * 200_000 + '"',
    "nan": "nan",
    "inf": "inf",
    "neg_inf": "-inf",
    "huge_float": "1e308",
    "negative": "-1",
    "zero": "0",
    "int64_max": "9223372036854775807",
    "bool": "true",
    "str_int": '"5"',
    "list": "[1, 2]",
    "table": "{ a = 1 }",
    "float": "1.5",
}


def _values(key: str, n: int = 8) -> list[tuple[str, str]]:
    """``n`` of the hostile values for one field: always the newline, NaN and wrong-type ones, the rest drawn by a
    seeded generator from the field's name (the same on every run), so the corpus stays a few hundred cases."""
    always = ["newline", "nan", "table", "bool"]
    rest = sorted(set(HOSTILE_VALUES) - set(always))
    rng = random.Random(key)
    names = always + rng.sample(rest, n - len(always))
    return [(v, HOSTILE_VALUES[v]) for v in names]


def render(lines: list[tuple[str, str, str]], replace: dict[tuple[str, str], str | None] | None = None) -> str:
    """TOML text of ``lines`` with some (table, key) values replaced (None: the key dropped, a new key: added)."""
    replace = dict(replace or {})
    tables: dict[str, list[str]] = {}
    for table, key, value in lines:
        new = replace.pop((table, key), value)
        if new is not None:
            tables.setdefault(table, []).append(f"{key} = {new}")
    for (table, key), value in replace.items():
        if value is not None:
            tables.setdefault(table, []).append(f"{key} = {value}")
    out = tables.pop("", [])
    for table, body in tables.items():
        out += ["", f"[{table}]", *body]
    return "\n".join(out) + "\n"


@dataclass
class Case:
    """One hostile input: the CLI arguments (``{d}`` is the case's directory), the files it needs and what the
    CLI should do with it."""

    id: str
    argv: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)
    expect: str = "refuse"  # refuse | accept | any
    special: dict[str, str] = field(default_factory=dict)  # name -> fifo | dir | loop | devzero | devnull


def space_case(
    cid: str, replace: dict, *, system: dict | None = None, cmd: str = "run", expect: str = "refuse"
) -> Case:
    """A space (and its system file) with some fields replaced, run through ``cmd``."""
    files: dict[str, str | bytes] = {
        "space.toml": render(BASE_SPACE, replace),
        "system.toml": render(BASE_SYSTEM, system),
    }
    argv = {
        "run": ["run", "--space", "space.toml", "--out", "{d}/out"],
        "validate": ["validate", "space.toml"],
        "dry-run": ["dry-run", "--space", "space.toml", "--backend", "slurm", "--out", "{d}/dry", "--limit", "1"],
        "space": ["space", "space.toml"],
    }[cmd]
    return Case(cid, argv, files, expect)


def _field_cases() -> list[Case]:
    """Every hostile value in every field of a space and of a system file."""
    cases = []
    for table, key, _ in BASE_SPACE:
        for vname, value in _values(table + key):
            cases.append(space_case(f"space.{table}.{key}={vname}", {(table, key): value}, cmd="validate"))
    for table, key, _ in BASE_SYSTEM:
        for vname, value in _values(table + key):
            cases.append(space_case(f"system.{table}.{key}={vname}", {}, system={(table, key): value}, cmd="validate"))
    # Values that are legal for a field: the corpus says so, so an accept is not counted as suspicious.
    legal = {
        ("name", "unicode"),
        ("name", "long"),
        ("name", "shell"),
        ("partition", "empty"),
        ("account", "empty"),
        ("job_dir", "empty"),
        ("max_pending", "empty"),
        ("seed", "zero"),
        ("twin_seed", "zero"),
        ("screen_margin", "zero"),
        ("screen_margin", "float"),
        ("startup_s", "zero"),
        ("startup_s", "float"),
        ("scaleout_gbps", "float"),
        ("timeout_s", "float"),
        ("use_container", "bool"),
        ("container_image", "empty"),
        ("name", "str_int"),
        ("gpus_per_node", "bool"),
        ("partition", "unicode"),
        ("account", "unicode"),
    }
    for c in cases:
        key, vname = c.id.split(".")[-1].split("=")
        if (key, vname) in legal:
            c.expect = "any"
    return cases


def _knob_cases() -> list[Case]:
    """Hostile knob names and values, env knobs of dangerous families, caps on knobs and values."""
    cases = []
    values = {
        "nan": "[nan]",
        "inf": "[inf]",
        "huge": "[9223372036854775807]",
        "neg": "[-4]",
        "str": '["2"]',
        "bool": "[true]",
        "empty": "[]",
        "nested": "[[1]]",
        "table": "[{a=1}]",
        "newline": '["a\\nb"]',
    }
    for vname, v in values.items():
        cases.append(space_case(f"knob.tp={vname}", {("knobs", "tp"): v}, cmd="validate"))
    for name in ["bogus", "env.", '"tp\\n"', '"env.A B"', '"env.NCCL_X\\nY"', '"\\u001b[2J"']:
        key = name if name.startswith('"') else f'"{name}"'
        cases.append(space_case(f"knob.name={name}", {("knobs", key): '["1"]'}, cmd="validate"))
    dangerous = [
        "PYTHONPYCACHEPREFIX",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "BASH_ENV",
        "ENV",
        "PATH",
        "HOME",
        "SLURM_TASK_PROLOG",
        "SLURM_TASK_EPILOG",
        "SRUN_EXPORT_ENV",
        "SLURM_EXPORT_ENV",
        "SBATCH_EXPORT",
        "SLURM_CPU_BIND",
        "IFS",
        "PS4",
        "PROMPT_COMMAND",
        "NCCL_NET_PLUGIN",
        "GCONV_PATH",
        "MALLOC_CONF",
        "TORCHINDUCTOR_CACHE_DIR",
        "OMP_NUM_THREADS",
        "nccl_debug",
    ]
    for name in dangerous:
        for backend in ("sim", "slurm"):
            rep = {("knobs", f'"env.{name}"'): '["/tmp/x"]', ("backend", "kind"): f'"{backend}"'}
            cases.append(space_case(f"env.{name}@{backend}", rep, cmd="validate"))
    # Legal env knobs with hostile values: the name is allowed, the value must never reach a shell unquoted.
    for vname, v in {"shell": '["$(id)"]', "newline": '["1\\nexport LD_PRELOAD=/x.so"]', "nan": "[nan]"}.items():
        cases.append(space_case(f"env.NCCL_DEBUG={vname}@dry-run", {("knobs", '"env.NCCL_DEBUG"'): v}, cmd="dry-run"))
    many_knobs = {("knobs", f'"env.NCCL_K{i}"'): '["1"]' for i in range(1000)}
    cases.append(space_case("caps.1000_env_knobs", many_knobs, cmd="validate"))
    cases.append(
        space_case("caps.20000_values", {("knobs", "tp"): "[" + ", ".join(["1"] * 20000) + "]"}, cmd="validate")
    )
    deep = "[" * 2000 + "]" * 2000
    cases.append(space_case("toml.deep_nesting", {("knobs", "tp"): deep}, cmd="validate"))
    cases.append(space_case("toml.5000_digit_int", {("", "num_nodes"): "9" * 5000}, cmd="validate"))
    cases.append(
        space_case(
            "optuna.no_valid_point",
            {("knobs", "tp"): "[3, 5, 7]", ("search", "agent"): '"optuna"', ("search", "trials"): "50"},
            cmd="run",
            expect="any",
        )
    )
    return cases


def _srun_cases() -> list[Case]:
    """srun options by abbreviation and sbatch options through the system's [slurm] table."""
    cases = []
    bad = [
        "--export=ALL,LD_PRELOAD=/x.so",
        "--expor=LD_PRELOAD=/x.so",
        "--exp=ALL",
        "--task-prolog=/x.sh",
        "--task-p=/x.sh",
        "--prolog=/x.sh",
        "--epilog=/x.sh",
        "--output=/etc/cron.d/x",
        "--out=/x",
        "-o /x",
        "--error=/x",
        "--input=/dev/zero",
        "--chdir=/",
        "--container-image=evil",
        "--bcast=/x",
        "-E",
        "--mpi=pmix; rm -rf /",
        "--uid=0",
        "--get-user-env",
        "--propagate=ALL",
        "--wrap=id",
        "$(id)",
        "a\nb",
        "--nodes=1\n--export=ALL",
    ]
    for arg in bad:
        lit = '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        for cmd in ("validate", "dry-run"):
            sys_rep = {("slurm", "srun_args"): f"[{lit}]"}
            cases.append(space_case(f"srun[{arg!r}]@{cmd}", {("backend", "kind"): '"slurm"'}, system=sys_rep, cmd=cmd))
    for ok in ["--cpu-bind=none", "--mpi=pmix", "--gres=gpu:8"]:
        sys_rep = {("slurm", "srun_args"): f'["{ok}"]'}
        cases.append(
            space_case(f"srun[{ok!r}]", {("backend", "kind"): '"slurm"'}, system=sys_rep, cmd="validate", expect="any")
        )
    sbatch = {
        "wrap": '"id"',
        "export": '"ALL,LD_PRELOAD=/x"',
        "output": '"/etc/cron.d/x"',
        "chdir": '"/"',
        "x\\ny": '"1"',
        "comment": '"a\\n#SBATCH --export=ALL"',
        "exclusive": "nan",
        "mem": "[1]",
    }
    for key, value in sbatch.items():
        sys_rep = {("slurm.sbatch_options", f'"{key}"'): value}
        cases.append(space_case(f"sbatch.{key}", {("backend", "kind"): '"slurm"'}, system=sys_rep, cmd="dry-run"))
    for cmd in ("run", "dry-run"):
        # the README's inline system without a container image: found before the first trial
        rep = {("", "system"): '{gpu = "gb200", gpus_per_node = 4, nvlink_domain = 72}', ("backend", "kind"): '"slurm"'}
        cases.append(space_case(f"inline_system_no_image@{cmd}", rep, cmd=cmd))
    cases.append(space_case("container=abc@run", {}, system={("", "container"): '"abc"'}, cmd="run"))
    cases.append(space_case("startup_s=inf@run", {}, system={("", "startup_s"): "inf"}, cmd="run"))
    return cases


def _path_cases() -> list[Case]:
    """Paths that are not small regular files, given wherever a file is read."""
    kinds = {"fifo": "fifo", "dir": "dir", "loop": "loop", "devzero": "devzero", "missing": None, "devnull": "devnull"}
    extra = {
        "binary": b"\x00\xff\xfe" * 1000,
        "big": b"# " + b"x" * (3 * 1024 * 1024) + b"\n",
        "utf16": "a = 1".encode("utf-16"),
    }
    places = {
        "space": (["validate", "P"], {}),
        "run.space": (["run", "--space", "P", "--out", "{d}/out"], {}),
        "system": (["validate", "space.toml"], {"space.toml": render(BASE_SPACE, {("", "system"): '"P"'})}),
        "model": (["predict", "--model-file", "P", "--gpu", "h100", "--num-gpus", "8"], {}),
        "calibration": (["predict", "--model", "llama3_8b", "--gpu", "h100", "--calibration", "P"], {}),
        "cloudai.test": (["import", "cloudai", "P", "--gpu", "h100", "--out", "{d}/o.toml"], {}),
        "cloudai.system": (
            [
                "import",
                "cloudai",
                str(CLOUDAI / "test" / "llama3_8b_dse.toml"),
                "--system",
                "P",
                "--gpu",
                "h100",
                "--out",
                "{d}/o.toml",
            ],
            {},
        ),
        "parse": (["parse", "P"], {}),
        "calibrate.tsv": (["calibrate", "P", "--gpu", "h100", "--out", "{d}/c.toml"], {}),
        "leaderboard": (["leaderboard", "P"], {}),
        "report": (["report", "P"], {}),
        "compare": (["compare", "P", "P"], {}),
        "warm_start": (
            ["run", "--space", "space.toml", "--out", "{d}/o", "--warm-start", "P"],
            {"space.toml": render(BASE_SPACE)},
        ),
    }
    cases = []
    for place, (argv, files) in places.items():
        needs_system = "space.toml" in files or place in ("space", "run.space")
        base_files: dict[str, str | bytes] = dict(files)
        if needs_system:
            base_files["system.toml"] = render(BASE_SYSTEM)
        for kname, special in kinds.items():
            argv_k = [a if a != "P" else "target" for a in argv]
            sp = {"target": special} if special else {}
            expect = "any" if place in ("leaderboard", "report", "compare") and kname == "dir" else "refuse"
            cases.append(Case(f"path.{place}={kname}", argv_k, dict(base_files), expect, sp))
        for ename, data in extra.items():
            argv_k = [a if a != "P" else "target" for a in argv]
            f = dict(base_files)
            f["target"] = data
            cases.append(Case(f"path.{place}={ename}", argv_k, f))
    return cases


def _model_and_calibration_cases() -> list[Case]:
    """Every hostile value in every field of a model file and a calibration file."""
    cases = []
    for table, key, _ in MODEL:
        for vname, value in _values("model" + key):
            files = {"m.toml": render(MODEL, {(table, key): value})}
            argv = ["predict", "--model-file", "m.toml", "--gpu", "h100", "--num-gpus", "8", "--tp", "1"]
            expect = "any" if key == "name" and vname in ("unicode", "long", "shell", "str_int", "escape") else "refuse"
            cases.append(Case(f"model.{key}={vname}", argv, files, expect))
    params = ["step_overhead_s", "memory_offset_gib", "layer_overhead_s", "memory_fragmentation", "bogus_param"]
    for p in params:
        for vname, value in {
            "neg": "-100",
            "neg_huge": "-1e308",
            "zero": "0",
            "huge": "1e308",
            "nan": "nan",
            "inf": "inf",
            "str": '"1"',
            "bool": "true",
        }.items():
            files = {"c.toml": render(CALIBRATION, {("params", "step_overhead_s"): None, ("params", p): value})}
            argv = ["predict", "--model", "llama3_8b", "--gpu", "h100", "--calibration", "c.toml"]
            expect = "any" if vname == "zero" and p != "bogus_param" else "refuse"
            cases.append(Case(f"calibration.{p}={vname}", argv, files, expect))
    for key in ("gpu", "runs"):
        for vname, value in {"newline": '"a\\nb"', "neg": "-1", "table": "{a=1}", "huge": "1e308"}.items():
            files = {"c.toml": render(CALIBRATION, {("provenance", key): value})}
            argv = ["predict", "--model", "llama3_8b", "--gpu", "h100", "--calibration", "c.toml"]
            cases.append(Case(f"calibration.provenance.{key}={vname}", argv, files, "any"))
    return cases


def _cloudai_cases() -> list[Case]:
    """CloudAI tests whose text would inject TOML, values pydantic refuses, and --out over an existing file."""
    test = (CLOUDAI / "test" / "llama3_8b_dse.toml").read_text()
    system = str(CLOUDAI / "system" / "slurm_cluster.toml")
    edits = {
        "description_newline": test.replace(
            '"Llama 3 8B layout sweep"', '"x\\n[objective]\\nmetric = \\"step_time_s\\""'
        ),
        "name_newline": test.replace('name = "llama3_8b_dse"', 'name = "a\\nb"'),
        "env_key_newline": test.replace('NVTE_FUSED_ATTN = "1"', '"NCCL_A\\n[objective]" = "1"'),
        "env_ld_preload": test.replace('NVTE_FUSED_ATTN = "1"', 'LD_PRELOAD = "/x.so"'),
        "mbs_nan": test.replace("micro_batch_size = [1, 2]", "micro_batch_size = [nan]"),
        "mbs_str": test.replace("micro_batch_size = [1, 2]", 'micro_batch_size = ["a"]'),
        "tp_table": test.replace("tensor_model_parallel_size = [1, 2, 4]", "tensor_model_parallel_size = {a = 1}"),
        "nodes_huge": test.replace("num_nodes = 1", "num_nodes = 9223372036854775807"),
        "nodes_neg": test.replace("num_nodes = 1", "num_nodes = -1"),
        "seq_float": test.replace("seq_length = 8192", "seq_length = 1e308"),
        "image_shell": test.replace('"nvcr.io#nvidia/nemo:25.09"', '"$(id)"'),
        "steps_str": test.replace("max_steps = 20", 'max_steps = "20"'),
        "no_cmd_args": "\n".join(line for line in test.splitlines() if "cmd_args" not in line),
        "template_other": test.replace('"NeMoRun"', '"NcclTest"'),
        "deep": test + "\nx = " + "[" * 2000 + "]" * 2000 + "\n",
    }
    cases = []
    for name, text in edits.items():
        argv = ["import", "cloudai", "t.toml", "--system", system, "--gpu", "h100", "--out", "{d}/o.toml"]
        cases.append(Case(f"cloudai.{name}", argv, {"t.toml": text}, "any" if name == "image_shell" else "refuse"))
    # an existing --out is refused without --force, and the files beside it are kept
    argv = ["import", "cloudai", "t.toml", "--system", system, "--gpu", "h100", "--out", "o.toml"]
    cases.append(Case("cloudai.existing_out", argv, {"t.toml": test, "o.toml": "keep = 1\n"}))
    for gpu in ["", "h999", "\x1b[2J", "h100\n"]:
        argv = ["import", "cloudai", "t.toml", "--system", system, "--gpu", gpu, "--out", "{d}/o.toml"]
        cases.append(Case(f"cloudai.gpu={gpu!r}", argv, {"t.toml": test}))
    return cases


# Hostile CLI values, given to each numeric / text option.
CLI_VALUES = ["-1", "9" * 5000, "nan", "abc", "", "\x1b[2J", "1\n2"]


def _cli_cases() -> list[Case]:
    """Every option of the main commands with hostile values."""
    space = {"space.toml": render(BASE_SPACE), "system.toml": render(BASE_SYSTEM)}
    run = ["run", "--space", "space.toml", "--out", "{d}/out"]
    predict = ["predict", "--model", "llama3_8b", "--gpu", "h100"]
    parse = ["parse", "log.txt"]
    log = "iteration        5/      20 | elapsed time per iteration (ms): 1000.0 | lm loss: 1.0\n" * 10
    opts: list[tuple[list[str], str, dict]] = []
    for o in [
        "--trials",
        "--seed",
        "--twin-seed",
        "--parallel",
        "--agent",
        "--sampler",
        "--backend",
        "--storage",
        "--gpu",
        "--systems",
    ]:
        opts.append((run, o, space))
    for o in [
        "--num-gpus",
        "--gpus-per-node",
        "--tp",
        "--pp",
        "--vp",
        "--cp",
        "--ep",
        "--mbs",
        "--gbs",
        "--seq-length",
        "--recompute",
        "--recompute-num-layers",
        "--precision",
        "--fp8-recipe",
        "--cpu-offload-layers",
        "--attention-backend",
        "--flops-convention",
        "--payload",
        "--model",
        "--system",
        "--set",
    ]:
        opts.append((predict if o != "--model" else ["predict", "--gpu", "h100"], o, {}))
    for o in ["--gbs", "--seq-length", "--num-gpus", "--exit-code", "--scheduler-state"]:
        opts.append((parse, o, {"log.txt": log}))
    opts.append((["dry-run", "--space", "space.toml", "--out", "{d}/dry"], "--limit", space))
    opts.append((["dry-run", "--space", "space.toml", "--out", "{d}/dry"], "--backend", space))
    opts.append((["space", "space.toml"], "--twin-seed", space))
    cases = []
    for base, opt, files in opts:
        for i, v in enumerate(CLI_VALUES):
            # 0/1.5/1e3 are legal for some options (a seed of 0, a gbs of 1000): either answer is fine there
            expect = "any" if v in ("0", "1e3", "1000000000000", "abc") else "refuse"
            cases.append(Case(f"cli.{base[0]}{opt}={v[:12]!r}#{i}", [*base, opt, v], dict(files), expect))
    # storage URLs
    for url in [
        "sqlite:///:memory:",
        "sqlite://",
        "postgresql://x:y@127.0.0.1:1/db",
        "bogus://",
        "sqlite:////dev/zero",
        "sqlite:///{d}",
        "file:///etc/passwd",
    ]:
        cases.append(Case(f"cli.storage={url}", [*run, "--storage", url], dict(space)))
    # a path longer than the file system allows, wherever a path or a name of a file goes
    long = "9" * 5000
    for i, argv in enumerate(
        [
            ["validate", long],
            [*run, "--systems", long],
            ["run", "--space", "space.toml", "--out", long],
            [*run, "--warm-start", long],
            ["dry-run", "--space", "space.toml", "--out", long, "--limit", "1"],
            ["parse", long],
            ["leaderboard", long],
            ["report", long],
            ["calibrate", long, "--gpu", "h100", "--out", "c.toml"],
            [*predict, "--calibration", long],
            ["predict", "--model", "llama3_8b", "--system", long],
            ["predict", "--model-file", long, "--gpu", "h100"],
            ["import", "cloudai", long, "--gpu", "h100", "--out", "o.toml"],
        ]
    ):
        cases.append(Case(f"cli.long_path.{argv[0]}#{i}", argv, dict(space)))
    # predict with a world size of 10^12, a calibrate --out that is a directory, a leaderboard of a read-only study
    cases.append(Case("cli.predict.num_gpus_1e12", [*predict, "--num-gpus", str(10**12)]))
    cases.append(
        Case(
            "cli.calibrate.out_dir",
            ["calibrate", "runs.tsv", "--gpu", "h100", "--out", "{d}"],
            {"runs.tsv": "gpu\tstep_time_s\n"},
        )
    )
    cases.append(Case("cli.set_bogus", [*predict, "--set", "bogus=1"]))
    cases.append(Case("cli.set_noeq", [*predict, "--set", "tp"]))
    cases.append(Case("cli.set_env", [*predict, "--set", "env.LD_PRELOAD=/x.so"]))
    return cases


def _study_cases() -> list[Case]:
    """Broken study directories: a dse.json without knobs, a non-gzip log.txt.gz, a huge iteration number."""
    cases = []
    huge_iter = f"iteration {'9' * 5000}/      20 | elapsed time per iteration (ms): 1000.0 | lm loss: 1.0\n"
    cases.append(Case("log.huge_iteration", ["parse", "log.txt"], {"log.txt": huge_iter}, "any"))
    cases.append(Case("log.not_gzip", ["parse", "log.txt.gz"], {"log.txt.gz": b"not gzip at all"}))
    cases.append(Case("log.escape", ["parse", "log.txt"], {"log.txt": "\x1b[2J\x1b]0;owned\x07 Error: boom\n"}, "any"))
    for name, text in {
        "no_knobs": '{"name": "x"}',
        "garbage": "{not json",
        "list": "[]",
        "nan": '{"knobs": NaN}',
        "deep": "[" * 100000 + "]" * 100000,
    }.items():
        for cmd in ("leaderboard", "report"):
            cases.append(Case(f"study.dse_json_{name}@{cmd}", [cmd, "st"], {"st/dse.json": text}))
        files = {"st/dse.json": text, "space.toml": render(BASE_SPACE), "system.toml": render(BASE_SYSTEM)}
        cases.append(
            Case(f"study.dse_json_{name}@resume", ["run", "--space", "space.toml", "--out", "st", "--resume"], files)
        )
    return cases


def corpus() -> list[Case]:
    """The whole corpus, in a fixed order."""
    return [
        *_field_cases(),
        *_knob_cases(),
        *_srun_cases(),
        *_path_cases(),
        *_model_and_calibration_cases(),
        *_cloudai_cases(),
        *_cli_cases(),
        *_study_cases(),
    ]


def _make(d: Path, case: Case) -> None:
    for name, data in case.files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            p.write_bytes(data)
        else:
            p.write_text(data, encoding="utf-8")
    for name, kind in case.special.items():
        p = d / name
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dir":
            p.mkdir()
        elif kind == "loop":
            p.symlink_to(p.name)
        elif kind in ("devzero", "devnull"):
            p.symlink_to(f"/dev/{kind[3:]}")


@dataclass
class Result:
    case: Case
    kind: str  # refused | accepted | traceback | hang
    rc: int | None
    text: str
    lines: int


def run_case(case: Case, timeout: float) -> Result:
    """Run one case through ``python -m dse`` in its own directory and classify what came back."""
    d = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        _make(d, case)
        argv = [a.replace("{d}", str(d)) for a in case.argv]
        env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            p = subprocess.run(
                [sys.executable, "-m", "dse", *argv],
                cwd=d,
                capture_output=True,
                timeout=timeout,
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return Result(case, "hang", None, "", 0)
        out = (p.stdout + p.stderr).decode("utf-8", "replace")
        err = p.stderr.decode("utf-8", "replace").strip()
        if "Traceback" in out or p.returncode not in (0, 2):
            kind = "traceback"
        else:
            kind = "refused" if p.returncode == 2 else "accepted"
        text = err if kind != "accepted" else p.stdout.decode("utf-8", "replace")[-300:]
        return Result(case, kind, p.returncode, text, len(err.splitlines()))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _short(text: str, n: int = 200) -> str:
    return ascii(text.strip().splitlines()[-1][:n]) if text.strip() else "''"


def report(results: list[Result]) -> int:
    """Print the counts and the cases that need a look; the exit status is 1 when any traceback or hang."""
    counts = {k: sum(r.kind == k for r in results) for k in ("refused", "accepted", "traceback", "hang")}
    suspicious = [r for r in results if r.kind == "accepted" and r.case.expect == "refuse"]
    multiline = [r for r in results if r.kind == "refused" and r.lines > 1]
    refused_ok = [r for r in results if r.kind == "refused" and r.case.expect == "accept"]
    for r in results:
        if r.kind in ("traceback", "hang"):
            print(f"{r.kind.upper():9} {r.case.id}  rc={r.rc}  {_short(r.text, 300)}")
    for r in suspicious:
        print(f"ACCEPTED? {r.case.id}")
    for r in multiline:
        print(f"MULTILINE {r.case.id}  ({r.lines} lines) {_short(r.text)}")
    for r in refused_ok:
        print(f"REFUSED!  {r.case.id}  {_short(r.text)}")
    print(
        f"\n{len(results)} cases: {counts['refused']} refused ({len(multiline)} in more than one line), "
        f"{counts['accepted']} accepted ({len(suspicious)} that the corpus expected refused), "
        f"{counts['traceback']} tracebacks, {counts['hang']} hangs"
    )
    return 1 if counts["traceback"] or counts["hang"] else 0


def faults(n: int, seed: int, timeout: float) -> int:
    """SIGKILL a sim study ``n`` times at random moments, resume it each time, and compare its leaderboard with a
    clean run's (the trial order and rewards must be the same). Returns the number of faults survived."""
    rng = random.Random(seed)
    d = Path(tempfile.mkdtemp(prefix="hostile-faults-"))
    space = render(
        BASE_SPACE,
        {
            ("knobs", "tp"): "[1, 2, 4, 8]",
            ("knobs", "mbs"): "[1, 2]",
            ("search", "trials"): "8",
            ("search", "agent"): '"random"',
        },
    )
    (d / "space.toml").write_text(space)
    (d / "system.toml").write_text(render(BASE_SYSTEM))
    cmd = [sys.executable, "-m", "dse", "run", "--space", "space.toml"]
    subprocess.run([*cmd, "--out", "clean"], cwd=d, capture_output=True, timeout=timeout, check=True)
    kills = 0
    for _ in range(n):
        started = (d / "killed" / "dse.json").exists()
        p = subprocess.Popen(
            [*cmd, "--out", "killed", *(["--resume"] if started else [])],
            cwd=d,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(1.0, 8.0))
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            kills += 1
        p.wait()
    started = (d / "killed" / "dse.json").exists()
    last = subprocess.run(
        [*cmd, "--out", "killed", *(["--resume"] if started else [])], cwd=d, capture_output=True, timeout=timeout
    )

    def board(name: str) -> list[tuple[str, ...]]:
        with open(d / name / "leaderboard.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        keep = [k for k in (rows[0] if rows else {}) if k not in ("run_dir", "wall_s", "started", "finished", "trial")]
        return sorted(tuple(str(r.get(k)) for k in keep) for r in rows)

    clean = board("clean")
    same = last.returncode == 0 and len(clean) > 0 and clean == board("killed")
    print(f"faults: the clean run's leaderboard has {len(clean)} rows")
    survived = kills if same else 0
    print(
        f"faults: {kills} SIGKILLs (of {n} tries; the rest finished first), then --resume: exit {last.returncode}, "
        f"leaderboard {'identical to a clean run' if same else 'DIFFERENT'}"
    )
    if not same:
        print(last.stderr.decode("utf-8", "replace")[-2000:])
    shutil.rmtree(d, ignore_errors=True)
    return survived


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", "--jobs", type=int, default=2, help="cases run at once")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang")
    ap.add_argument("--only", default="", help="run only the cases whose id contains this text")
    ap.add_argument("--list", action="store_true", help="list the case ids and exit")
    ap.add_argument("--faults", type=int, default=0, help="also SIGKILL a running study this many times")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cases = [c for c in corpus() if args.only in c.id]
    if args.list:
        print("\n".join(c.id for c in cases))
        return 0
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: run_case(c, args.timeout), cases))
    rc = report(results)
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.faults:
        faults(args.faults, args.seed, args.timeout * 4)
    return rc


if __name__ == "__main__":
    sys.exit(main())
