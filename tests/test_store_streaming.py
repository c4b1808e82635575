"""Reading a large study streams (batches, bounded rows held); a killed writer loses only its unflushed batch;
run directories are stored relative to the study, so a copied study still finds them."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.results import report
from dse.rules.space import load_space
from dse.study.leaderboard import Summary, frame
from dse.study.loop import Request, open_store, run_study
from dse.study.store import Store, TrialRecord
from tests.helpers import SMALL_SPACE, write_space

runner = CliRunner()
KNOBS = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8, 16], "mbs": [1, 2], "recompute": ["none", "selective", "full"]}
N = 12_000
# one worker under xdist: the generated study (big_study) is written once for the module
pytestmark = pytest.mark.xdist_group("store_streaming")


def _record(n: int) -> TrialRecord:
    ok = n % 4 != 0
    point = {k: v[(n // (i + 1)) % len(v)] for i, (k, v) in enumerate(KNOBS.items())}
    return TrialRecord(
        number=n,
        knobs=point,
        status="ok" if ok else "oom",
        reward=float((n * 7919) % 10_007) if ok else 0.0,
        reason=None if ok else f"oom {n % 3}",
        metrics={"step_time_s": 1.0 + n % 5, "tflops_per_gpu": 100.0 + n % 11, "steps": 50},
        run_dir=f"trials/{n:05d}",
        gpu="h100",
        num_gpus=16,
        gpu_hours=0.5 + n % 3,
    )


@pytest.fixture(scope="module")
def big_study(tmp_path_factory) -> Path:
    """A dse output directory holding a generated study of N trials (written through the store's batches)."""
    out = tmp_path_factory.mktemp("big") / "study"
    out.mkdir()
    meta = {
        "space": "gen.toml",
        "space_name": "big",
        "study_name": "big",
        "storage": "study.db",
        "knobs": KNOBS,
        "recipe": "llama3_8b",
        "system": "h100",
        "gpu": "h100",
        "num_nodes": 2,
        "agent": "random",
        "backend": "sim",
    }
    (out / "dse.json").write_text(json.dumps(meta))
    store = Store(f"sqlite:///{out / 'study.db'}", "big", KNOBS, batch_size=1000)
    for n in range(N):
        store.record(_record(n))
    store.close()
    return out


def test_reading_streams_in_batches(big_study):
    store, _ = open_store(big_study)
    try:
        it = store.iter_records(batch_size=1000)
        first = next(it)
        assert first.number == 0 and store.batches_read == 1  # one batch read, not the study
        numbers = [first.number] + [r.number for r in it]
        assert numbers == list(range(N)) and store.batches_read == N // 1000
        # the run directory is resolved against the study directory as it is now
        assert first.run_dir == str((big_study / "trials" / "00000").absolute())
    finally:
        store.close()


def test_summary_holds_the_top_rows_not_the_study(big_study):
    store, _ = open_store(big_study)
    summary, held = Summary(top=10), []
    try:
        for r in store.iter_records(batch_size=2000):
            summary.add(r)
            held.append(summary.rows_held)
        everything = store.records()
    finally:
        store.close()
    assert max(held) <= 2 * 10 + 64 and summary.n == N
    full = frame(everything, list(KNOBS))
    assert [r.number for r in summary.rows] == list(full.trial[:10])
    assert summary.counts == dict(full.status.value_counts())
    best = max((r for r in everything if r.ok), key=lambda r: (r.reward, -r.number))
    assert summary.best == best
    assert summary.to_best == pytest.approx(sum(r.gpu_hours for r in everything if r.number <= best.number))
    assert summary.spent == pytest.approx(sum(r.gpu_hours for r in everything))


def test_batched_frame_equals_the_whole_frame(big_study):
    store, _ = open_store(big_study)
    try:
        batched = frame(store.iter_records(batch_size=3000), list(KNOBS), batch=2500)
        whole = frame(store.records(), list(KNOBS))
    finally:
        store.close()
    assert batched.to_csv(index=False) == whole.to_csv(index=False)  # the same table, written the same
    assert isinstance(batched.status.dtype, pd.CategoricalDtype)  # compact: a code per row, not a string


def test_leaderboard_and_report_of_a_large_study(big_study, tmp_path, monkeypatch):
    csv = tmp_path / "lb.csv"
    r = runner.invoke(app, ["leaderboard", str(big_study), "--csv", str(csv), "--top", "3"])
    assert r.exit_code == 0, r.output
    assert f"wrote {N} rows" in r.output and f"oom {N // 4}" in r.output
    df = pd.read_csv(csv)
    assert len(df) == N and df.trial.is_unique and (df.status.iloc[: 3 * N // 4] == "ok").all()
    monkeypatch.setattr(report, "PLOT_TRIALS", 500)
    monkeypatch.setattr(report, "REPORT_ROWS", 50)
    html_file = tmp_path / "r.html"
    r = runner.invoke(app, ["report", str(big_study), "--html", str(html_file)])
    assert r.exit_code == 0, r.output
    page = html_file.read_text()
    assert f"The top 50 of {N:,} trials" in page and f"every 24th of {N:,} trials" in page
    assert f"{N} trials: ok {3 * N // 4}, oom {N // 4}" in page


def test_compare_and_warm_start_stream_a_large_study(big_study, tmp_path, monkeypatch):
    """`dse compare` and the warm start of `--systems` read a study as a stream: never `Store.records()`
    (the whole study as one list); what they report is what the whole list gives."""
    from dse.results import compare
    from dse.study.generations import warm_start_points

    everything = open_store(big_study)[0].records()

    def whole(self):
        raise AssertionError("read the whole study as one list")

    monkeypatch.setattr(Store, "records", whole)
    monkeypatch.setattr(report, "PLOT_TRIALS", 500)
    studies = compare.gather([big_study])
    df, _, _ = compare.write(studies, tmp_path / "cmp")
    best = max((r for r in everything if r.ok), key=lambda r: (r.reward, -r.number))
    row = df.iloc[0]
    assert (row.best_trial, row.trials, row.ok) == (best.number, N, sum(r.ok for r in everything))
    assert row.search_gpu_hours == pytest.approx(sum(r.gpu_hours for r in everything))
    assert f"{N} trials: ok {3 * N // 4}, oom {N // 4}" in (big_study / "report.html").read_text()
    from dse.rules import constraints
    from dse.rules.trial import resolve

    text = SMALL_SPACE.replace("pp = [1, 2, 4]\nvp = [1, 2]\n", "pp = [1, 2]\n").replace(
        "max_steps = 20\n", "max_steps = 20\nvp = 1\ncp = 1\n"
    )
    space = load_space(write_space(tmp_path, text))
    assert set(space.knobs) == {"tp", "pp", "mbs"}
    expected: list[dict] = []
    for r in sorted((r for r in everything if r.ok), key=lambda r: (-r.reward, r.number)):
        point = {k: r.knobs[k] for k in space.knobs}
        if (
            point["pp"] in (1, 2)
            and point not in expected
            and len(expected) < 3
            and constraints.check(resolve(space, point)) is None
        ):
            expected.append(point)
    assert len(expected) == 3 and warm_start_points(space, big_study, top=3) == expected


KILLER = """
import os, signal, sys
from dse.study.store import Store
from dse.rules.space import load_space
from dse.study.loop import Request, run_study

init, record = Store.__init__, Store.record

def small_batches(self, *a, **k):
    init(self, *a, **{**k, "batch_size": 8, "max_delay_s": 1e9})

def record_then_die(self, rec):
    record(self, rec)
    if rec.number == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: as a crash or `kill -9`

Store.__init__, Store.record = small_batches, record_then_die
run_study(load_space(sys.argv[1]), Request(out_dir=sys.argv[2], agent="grid"))
"""


def test_a_killed_writer_loses_only_its_unflushed_batch(tmp_path):
    space_file = write_space(tmp_path)
    out = tmp_path / "out"
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, str(script), str(space_file), str(out), "19"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    space = load_space(space_file)
    store, _ = open_store(out)
    try:
        kept = store.records()
    finally:
        store.close()
    assert [r.number for r in kept] == list(range(16))  # two batches of 8 flushed; 16..19 were pending
    assert sorted(p.name for p in (out / "trials").iterdir()) == [f"{n:05d}" for n in range(20)]
    res = run_study(space, Request(out_dir=out, resume=True))
    points = [tuple(r.knobs.values()) for r in res.records]
    assert len(points) == len(set(points))  # nothing twice
    assert res.new_trials == len(points) - 16  # everything after the flushed batches, the lost ones included
    grid = run_study(space, Request(out_dir=tmp_path / "fresh", agent="grid"))
    assert sorted(points) == sorted(tuple(r.knobs.values()) for r in grid.records)
    # the run directories of the lost trials were set aside, not mixed with their reruns
    assert sorted(p.name for p in (out / "trials").iterdir() if "orphan" in p.name) == [
        f"{n:05d}.orphan0" for n in range(16, 20)
    ]


def test_a_copied_study_finds_its_own_run_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_space(tmp_path)
    r = runner.invoke(app, ["run", "--space", "space.toml", "--out", "rel", "--agent", "random", "--trials", "4"])
    assert r.exit_code == 0, r.output
    own = pd.read_csv("rel/leaderboard.csv").run_dir.dropna()  # the study's own table: relative to the study
    assert len(own) and all(p.startswith("trials/") and (Path("rel") / p).is_dir() for p in own)
    shutil.copytree("rel", "copy")
    shutil.rmtree("rel")
    r = runner.invoke(app, ["leaderboard", "copy", "--csv", "copy.csv"])
    assert r.exit_code == 0, r.output
    dirs = pd.read_csv("copy.csv").run_dir.dropna()  # an export: relative to the study it names, as its own table
    assert len(dirs) and all(d.startswith("trials/") and (tmp_path / "copy" / d).is_dir() for d in dirs)
    best = json.loads(Path("copy/best/best.json").read_text())
    assert not Path(best["run_dir"]).is_absolute() and (tmp_path / "copy" / best["run_dir"]).is_dir()


def test_an_occupied_default_directory_is_named_not_a_flag_never_passed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_space(tmp_path)
    args = ["run", "--space", "space.toml", "--agent", "random", "--trials", "2"]
    assert runner.invoke(app, args).exit_code == 0
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    line = r.output.strip()
    assert "--out:" not in line and "default output directory" in line and "--resume" in line
    assert "0/?" not in r.output and len(line.splitlines()) == 1  # no stray progress bar before the error
    r = runner.invoke(app, [*args, "--out", "runs/small"])
    assert r.exit_code == 2 and "--out: already holds a study" in r.output and "default" not in r.output


def test_a_simulated_run_directory_is_compact_and_parses_again(tmp_path):
    space = load_space(write_space(tmp_path))
    res = run_study(space, Request(out_dir=tmp_path / "out", agent="random", trials=3, seed=2))
    rec = next(r for r in res.records if r.ok)
    run_dir = Path(rec.run_dir)
    assert [p.name for p in run_dir.iterdir()] == ["log.txt.gz"]
    size = (run_dir / "log.txt.gz").stat().st_size
    import gzip

    plain = len(gzip.decompress((run_dir / "log.txt.gz").read_bytes()))
    assert size < plain / 3  # compressed, not a copy
    r = runner.invoke(app, ["parse", str(run_dir), "--json"])
    assert r.exit_code == 0, r.output
    parsed = json.loads(r.output)
    assert parsed["status"] == "ok" and parsed["tflops_per_gpu"] == pytest.approx(rec.metrics["tflops_per_gpu"])
    assert parsed["steps"] == rec.metrics["steps"]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = runner.invoke(app, ["parse", str(empty)])
    assert r.exit_code == 2 and "holds no log.txt" in r.output


def test_the_streamed_summary_says_what_the_list_functions_say():
    from dse.study.leaderboard import gpu_hours, savings_line

    recs = [
        TrialRecord(
            number=n,
            knobs={},
            status=["ok", "pruned", "oom", "ok"][n % 4],
            reward=float(n % 7),
            metrics={"early_stopped": n % 4 == 3, "gpu_hours_saved": 0.25 if n % 4 in (1, 3) else None},
            gpu_hours=1.0 + n % 2,
        )
        for n in range(40)
    ]
    s = Summary.of(recs, top=5)
    assert s.savings_line() == savings_line(recs) and "pruned" in s.savings_line()
    assert (s.spent, s.to_best) == gpu_hours(recs)
