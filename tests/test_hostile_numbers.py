"""Hostile numbers and unlucky clocks: a figure no run can produce, a study resumed under another definition,
a clock that jumps. Each ends in a recorded trial or a one-line refusal, never a traceback."""

from __future__ import annotations

import pytest

from dse.logs.parse import PLAUSIBLE_MAX, parse_log
from tests.helpers import dse, write_space

_NEMO = (
    "Training epoch 0, iteration {i}/9 | global_step: {i} | reduced_train_loss: 5.0 | "
    "train_step_timing in s: {t} | TFLOPS_per_GPU: {tf} | max_memory_allocated: {mem}"
)


def _log(t="1.5", tf="400", mem="1e10", at=None, n=10):
    return [_NEMO.format(i=i, t=t if at in (None, i) else "1.5", tf=tf, mem=mem) for i in range(n)]


@pytest.mark.parametrize(
    "kw",
    [
        {"t": "1e308"},
        {"t": "1e308", "at": 7},
        {"t": "9" * 400},  # parses to inf: ignored as before, then all-invalid
        {"tf": "1e308"},
        {"mem": "1e308"},
        {"t": "1e300", "n": 3000},
    ],
)
def test_absurd_figures_are_no_metrics_with_a_reason(kw):
    m = parse_log(_log(**kw), exit_code=0)
    assert m.status == "no_metrics", m
    assert m.reason and ("implausible" in m.reason or "no valid step time" in m.reason)
    assert m.step_time_s is None or m.step_time_s < PLAUSIBLE_MAX["step time (s)"]


def test_a_huge_global_step_is_not_an_iteration():
    line = _NEMO.format(i=0, t="1.5", tf="400", mem="1e10").replace("global_step: 0", "global_step: 1e300")
    m = parse_log([line] * 3 + _log(), exit_code=0)
    assert m.last_iteration is not None and m.last_iteration < 10**12


def test_dse_parse_of_an_absurd_log_reports_it(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("\n".join(_log(t="1e308")) + "\n")
    r = dse("parse", log)
    assert r.exit_code == 0, r.output
    assert "no_metrics" in r.stdout and "implausible step time" in r.stdout


def _absurd_after(monkeypatch, n):
    """The simulated trainer prints 1e308 as its step time from the (n+1)-th run on."""
    import dse.backends.sim as sim

    real, calls = sim.write_log, {"n": 0}

    def write_log(run, fh, **kw):
        calls["n"] += 1
        if calls["n"] <= n:
            return real(run, fh, **kw)

        class Absurd:
            def write(self, text):
                return fh.write(text.replace("train_step_timing in s: ", "train_step_timing in s: 1e308 | x: "))

        return real(run, Absurd(), **kw)

    monkeypatch.setattr(sim, "write_log", write_log)


def test_an_absurd_log_is_a_trial_and_the_study_and_resume_go_on(tmp_path, monkeypatch):
    from dse.study.loop import open_store

    path = write_space(tmp_path)
    out = tmp_path / "out"
    _absurd_after(monkeypatch, 2)
    r = dse("run", "--space", path, "--out", out, "--agent", "random", "--trials", "4")
    assert r.exit_code == 0, r.output
    r = dse("run", "--space", path, "--out", out, "--agent", "random", "--trials", "6", "--resume")
    assert r.exit_code == 0, r.output
    store, _ = open_store(out)
    records = [x for x in store.records() if x.status not in ("rejected", "screened")]
    store.close()
    assert len(records) == 6
    later = [x for x in records[2:] if x.status != "oom"]  # an OOM run ends before its figures count
    assert later and all(x.status == "no_metrics" and "implausible step time" in (x.reason or "") for x in later)
    assert dse("leaderboard", out).exit_code == 0


# -- dse's control variables are not a space's settings ------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        '"env.DSE_NEMO_TASK" = "finetune"',
        '"env.DSE_SIM_STEP_TIME_S" = "0.001"',
        '"env.DSE_NEMO_RECIPE" = "llama3_8b"',
        '"env.DSE_ANYTHING" = "1"',
    ],
)
def test_a_space_cannot_set_dses_control_variables(tmp_path, line):
    from tests.helpers import one_line_error

    name = line.split('"')[1]
    text = write_space(tmp_path).read_text().replace("[knobs]", f"{line}\n\n[knobs]")
    path = write_space(tmp_path, text)
    for args in (
        ("validate", path),
        ("dry-run", "--space", path, "--out", tmp_path / "out"),
        ("run", "--space", path, "--out", tmp_path / "out"),
    ):
        one_line_error(dse(*args), f"settings.{name}", "not a setting of a space")
    assert not (tmp_path / "out").exists()


def test_allow_env_cannot_opt_into_a_control_variable(tmp_path):
    from tests.helpers import one_line_error

    text = write_space(tmp_path).read_text()
    text = text.replace("[knobs]", '"env.DSE_NEMO_TASK" = "finetune"\n\n[knobs]').replace(
        "[search]", '[backend]\nallow_env = ["DSE_NEMO_TASK"]\n\n[search]'
    )
    one_line_error(dse("validate", write_space(tmp_path, text)), "allow_env", "DSE_NEMO_TASK")


def test_the_payloads_own_settings_stay_allowed_and_the_launch_keeps_its_control():
    import dataclasses

    from dse.errors import UserError
    from dse.launch import build_plan
    from tests.trials import system, trial

    t = trial(sys=system("h100", gpus_per_node=1), num_nodes=1, tp=1, pp=1, cp=1, vp=1, env_DSE_SIM_STEP_S="0.1")
    assert build_plan(t, payload="sim").env["DSE_SIM_STEP_S"] == "0.1"
    forced = dataclasses.replace(t, env={"DSE_NEMO_TASK": "finetune"})  # past validation, as a bug might
    with pytest.raises(UserError, match="DSE_NEMO_TASK"):
        build_plan(forced, payload="nemo2")


# -- Slurm options that Slurm would read otherwise, or never schedule --------------------------------------------
@pytest.mark.parametrize(
    "slurm, nodes, field, needle",
    [
        ('time_limit = "00:61:99"', 2, "slurm.time_limit", "minutes 61"),
        ('time_limit = "1-24:00:00"', 2, "slurm.time_limit", "hours 24"),
        ('max_pending = "10:75"', 2, "slurm.max_pending", "seconds 75"),
        ('job_dir = "../../../../../etc"', 2, "slurm.job_dir", "no . or .. components"),
        ('job_dir = "/scratch/jobs/../../etc"', 2, "slurm.job_dir", "no . or .. components"),
        ('sbatch_options = { time_min = "00:10:00", "time-min" = "00:20:00" }', 2, "sbatch_options", "give it once"),
        ('time_limit = "00:30:00"\nsbatch_options = { time_min = "01:00:00" }', 2, "slurm", "exceeds time_limit"),
        ('sbatch_options = { time_min = "00:61:99" }', 2, "sbatch_options", "minutes 61"),
        ("sbatch_options = { segment = 7 }", 18, "segment", "does not divide the space's node count 18"),
        ("sbatch_options = { segment = 1000000 }", 2, "segment", "does not divide the space's node count 2"),
    ],
)
def test_slurm_options_slurm_would_misread_are_refused(tmp_path, slurm, nodes, field, needle):
    from tests.helpers import one_line_error

    sysfile = tmp_path / "sys.toml"
    sysfile.write_text(f'gpu = "gb200"\ngpus_per_node = 4\nnvlink_domain = 72\n[slurm]\n{slurm}\n')
    text = write_space(tmp_path).read_text().replace('system = "h100"', f'system = "{sysfile}"')
    path = write_space(tmp_path, text.replace("num_nodes = 2", f"num_nodes = {nodes}"))
    one_line_error(dse("validate", path), field, needle)


@pytest.mark.parametrize(
    "text, seconds",
    [("90", 5400), ("10:30", 630), ("01:02:03", 3723), ("2-03", 183600), ("1-00:00:00", 86400), ("UNLIMITED", None)],
)
def test_slurm_times_in_every_spelling(text, seconds):
    from dse.facts.allowlists import slurm_time

    assert slurm_time(text) == seconds


# -- a storage password is never written down ---------------------------------------------------------------
def test_a_storage_url_is_kept_and_shown_without_its_password(monkeypatch):
    from dse.study.store import PASSWORD_ENV, shown, with_password, without_password

    url = "postgresql+psycopg://dse:s3cret@db.example:5432/studies?sslmode=require"
    assert without_password(url) == "postgresql+psycopg://dse@db.example:5432/studies?sslmode=require"
    assert "s3cret" not in shown(url) and "***" in shown(url)
    assert without_password("sqlite:////x/study.db") == "sqlite:////x/study.db"
    monkeypatch.setenv(PASSWORD_ENV, "fromenv")
    assert with_password(without_password(url)).password == "fromenv"
    assert with_password(url) is url  # a URL with its own password keeps it
    assert with_password("sqlite:////x/study.db") == "sqlite:////x/study.db"


@pytest.mark.parametrize(
    "url", ["postgresql+psycopg://u:s3cret@127.0.0.1:1/x", "mysql://u:s3cret@h/db", "mysql+pymysql://u:s3cret@h/db"]
)
def test_a_refused_storage_is_one_line_that_never_shows_its_password(tmp_path, url):
    path = write_space(tmp_path)
    r = dse("run", "--space", path, "--out", tmp_path / "out", "--storage", url)
    assert r.exit_code == 2 and "s3cret" not in r.output and "Traceback" not in r.output, r.output
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("error:")]) == 1, r.output
    assert not (tmp_path / "out" / "dse.json").exists()


@pytest.fixture
def pg_db(pg_server):
    """A fresh database on the test server (tests/services.py, trust authentication), dropped afterwards."""
    import uuid

    import psycopg

    name = f"dse_test_{uuid.uuid4().hex[:10]}"
    admin = pg_server.replace("+psycopg", "")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_postgresql_study_keeps_no_password_in_dse_json_and_resumes(tmp_path, pg_db, monkeypatch):
    import json

    from dse.study.store import PASSWORD_ENV

    with_secret = pg_db.replace("postgres@", "postgres:s3cret@")
    path, out = write_space(tmp_path), tmp_path / "out"
    r = dse("run", "--space", path, "--out", out, "--storage", with_secret, "--agent", "random", "--trials", "2")
    assert r.exit_code == 0, r.output
    assert PASSWORD_ENV in r.stderr
    assert "s3cret" not in (out / "dse.json").read_text()
    assert json.loads((out / "dse.json").read_text())["storage"] == pg_db
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")  # the server trusts any; this is the path a resume takes
    r = dse("run", "--space", path, "--out", out, "--resume", "--agent", "random", "--trials", "3")
    assert r.exit_code == 0, r.output


# -- an environment value no program can be started with ---------------------------------------------------
@pytest.mark.parametrize("value", ['"' + "x" * 200_000 + '"', "9" * 4200])
def test_an_overlong_environment_value_is_refused_at_validation(tmp_path, value):
    from tests.helpers import one_line_error

    text = write_space(tmp_path).read_text().replace("[knobs]", f'"env.NCCL_DEBUG" = {value}\n\n[knobs]')
    line = one_line_error(dse("validate", write_space(tmp_path, text)), "env.NCCL_DEBUG")
    assert len(line) < 400


# -- a damaged compressed log is said to be damaged ----------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_log_gz_is_a_failed_run_saying_so(tmp_path, damage):
    import gzip

    data = gzip.compress(("\n".join(_log()) + "\n").encode())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data = data[:20] + bytes(b ^ 0xFF for b in data[20:60]) + data[60:]
    log = tmp_path / "log.txt.gz"
    log.write_bytes(data)
    m = parse_log(log, exit_code=0)
    assert m.status == "failed" and m.reason.startswith("corrupt log: log.txt.gz"), m
    r = dse("parse", log)
    assert r.exit_code == 0 and "corrupt log" in r.stdout, r.output


def test_an_intact_log_gz_parses_as_its_text(tmp_path):
    import gzip

    log = tmp_path / "log.txt.gz"
    log.write_bytes(gzip.compress(("\n".join(_log()) + "\n").encode()))
    assert parse_log(log, exit_code=0).status == "ok"


# -- what a log says reaches a terminal and a spreadsheet as text ------------------------------------------------
def test_dse_parse_prints_no_control_character_from_a_log(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("Traceback (most recent call last):\nRuntimeError: boom\x07\x1b[2J\x1b]0;title\x07\n")
    r = dse("parse", log, "--exit-code", "1")
    assert r.exit_code == 0 and "boom" in r.stdout, r.output
    assert not any(c in r.stdout for c in "\x07\x1b\x00"), repr(r.stdout)
    assert "\\x07" in r.stdout


def test_cells_a_spreadsheet_would_run_are_written_as_text_and_read_back(tmp_path):
    import csv

    import pandas as pd

    from dse.inputs import csv_row
    from dse.study.leaderboard import write_csv

    cells = ['=HYPERLINK("http://x")', "+1+2", "-2+3", "@SUM(A1)", "\tx", "plain", "'quoted"]
    path = write_csv(pd.DataFrame({"reason": cells, "n": [-1, 2, 3, 4, 5, 6, 7]}), tmp_path / "t.csv")
    with open(path, newline="") as fh:
        raw = list(csv.DictReader(fh))
    assert [r["reason"][0] for r in raw[:5]] == ["'"] * 5 and raw[5]["reason"] == "plain"
    assert raw[0]["n"] == "-1"  # a number is a number, not a formula
    assert [csv_row(r)["reason"] for r in raw] == cells


def test_a_failure_reason_that_looks_like_a_formula_is_text_in_the_leaderboard(tmp_path, monkeypatch):
    import dse.backends.sim as sim

    real = sim.write_log

    def write_log(run, fh, **kw):
        real(run, fh, **kw)
        fh.write('=HYPERLINK("http://evil") Segmentation fault\n')
        return 1

    monkeypatch.setattr(sim, "write_log", write_log)
    path, out = write_space(tmp_path), tmp_path / "out"
    assert dse("run", "--space", path, "--out", out, "--agent", "random", "--trials", "2").exit_code == 0
    board = (out / "leaderboard.csv").read_text()
    assert "=HYPERLINK" in board and ",=HYPERLINK" not in board and "'=HYPERLINK" in board


def test_the_security_page_names_tests_that_exist():
    """docs/security.md names each boundary's test: each named file and test exists."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "security.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert named
    for path, test in named:
        source = (root / path).read_text()
        assert not test or re.search(rf"^def {test}\(", source, re.M), f"{path}::{test}"
    every = "".join(p.read_text() for p in (root / "tests").glob("test_*.py"))
    for test in re.findall(r"`(test_\w+)`", text):
        assert re.search(rf"^def {test}\(", every, re.M), test
