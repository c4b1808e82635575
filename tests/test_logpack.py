"""Simulated trials' logs packed PACK_SIZE at a time (dse.logs.logpack): what is packed, what is read back, and
what a full disk, a damaged pack or a resume do."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import tarfile

import pandas as pd
import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.errors import InfrastructureError
from dse.logs import logpack
from dse.rules.space import load_space
from dse.study.loop import Request, open_store, run_study
from tests.helpers import write_space

runner = CliRunner()
SIZE = 8


@pytest.fixture
def small_packs(monkeypatch):
    monkeypatch.setattr(logpack, "PACK_SIZE", SIZE)


def _records(out):
    store, _ = open_store(out)
    try:
        return store.records()
    finally:
        store.close()


@pytest.mark.parametrize("parallel", [1, 3])
def test_a_sim_study_packs_its_logs_and_each_reads_back_as_it_was_parsed(tmp_path, small_packs, parallel):
    out = tmp_path / "out"
    res = run_study(load_space(write_space(tmp_path)), Request(out_dir=out, agent="grid", parallel=parallel))
    launched = [r for r in _records(out) if r.run_dir is not None]
    assert len(launched) > 2 * SIZE  # the grid makes more than two packs' worth
    trials = out / "trials"
    packs = sorted(trials.glob("logs-*.tar.xz"))
    left = sorted(p.name for p in trials.iterdir() if p.is_dir())
    assert len(packs) == len(launched) // SIZE and len(left) == len(launched) % SIZE  # the last few stay
    assert logpack.count(trials) + len(left) == len(launched)
    for r in launched:
        got = runner.invoke(app, ["parse", r.run_dir, "--json"])
        assert got.exit_code == 0, got.output
        parsed = json.loads(got.output)
        assert parsed["status"] == r.status and parsed["steps"] == r.metrics.get("steps")
        assert parsed["step_time_s"] == pytest.approx(r.metrics.get("step_time_s"), rel=1e-6)  # printed to 6 digits
    assert len(pd.read_csv(res.leaderboard)) == len(_records(out))


def test_packs_are_standard_tar_files_that_give_the_directories_back(tmp_path, small_packs):
    if shutil.which("tar") is None or shutil.which("xz") is None:
        pytest.skip("no tar or xz command")
    out = tmp_path / "out"
    run_study(load_space(write_space(tmp_path)), Request(out_dir=out, agent="random", trials=SIZE))
    pack = next((out / "trials").glob("logs-*.tar.xz"))
    dest = tmp_path / "x"
    dest.mkdir()
    subprocess.run(["tar", "-xJf", str(pack), "-C", str(dest)], check=True)
    for d in sorted(dest.iterdir()):
        assert (d / "log.txt").read_text() == logpack.read(out / "trials" / d.name)


def test_a_resumed_study_packs_on_without_touching_the_old_packs(tmp_path, small_packs):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    run_study(space, Request(out_dir=out, agent="random", trials=SIZE + 3))
    first = {p.name: p.read_bytes() for p in (out / "trials").glob("logs-*")}
    run_study(space, Request(out_dir=out, agent="random", trials=3 * SIZE, resume=True))
    packs = {p.name: p.read_bytes() for p in (out / "trials").glob("logs-*")}
    assert len(first) == 1 and all(packs[k] == v for k, v in first.items()) and len(packs) >= 2
    numbers = [r.number for r in _records(out) if r.run_dir is not None]
    held = logpack.count(out / "trials") + sum(1 for p in (out / "trials").iterdir() if p.is_dir())
    assert held == len(numbers) == len(set(numbers))


def test_only_a_directory_holding_exactly_the_compressed_log_is_packed(tmp_path):
    trials = tmp_path / "trials"
    for n, files in [(0, ["log.txt.gz"]), (1, ["log.txt.gz", "launch.sh"]), (2, ["log.txt"]), (3, ["log.txt.gz"])]:
        d = trials / f"{n:05d}"
        d.mkdir(parents=True)
        for f in files:
            data = b"x\n"
            if f.endswith(".gz"):
                import gzip

                data = gzip.compress(f"log of {n}\n".encode())
            (d / f).write_bytes(data)
    pack = logpack.pack(trials, range(5))
    assert pack.name == "logs-00000-00003.tar.xz"
    assert sorted(p.name for p in trials.iterdir() if p.is_dir()) == ["00001", "00002"]  # untouched
    assert logpack.read(trials / "00003") == "log of 3\n" and logpack.read(trials / "00001") is None
    assert logpack.pack(trials, [1, 2]) is None  # nothing packable: no pack


def test_a_full_disk_while_packing_leaves_every_directory_and_no_temporary_file(tmp_path, monkeypatch):
    import gzip

    trials = tmp_path / "trials"
    for n in range(3):
        (trials / f"{n:05d}").mkdir(parents=True)
        (trials / f"{n:05d}" / "log.txt.gz").write_bytes(gzip.compress(b"log\n"))
    real = tarfile.open

    def full(name=None, mode="r", *a, **k):
        if mode.startswith("w"):
            raise OSError(errno.ENOSPC, "No space left on device", str(name or trials))
        return real(name, mode, *a, **k)

    monkeypatch.setattr(tarfile, "open", full)
    with pytest.raises(InfrastructureError, match="No space left"):
        logpack.pack(trials, range(3))
    assert sorted(p.name for p in trials.iterdir()) == ["00000", "00001", "00002"]


def test_a_damaged_pack_is_one_line_naming_it(tmp_path, small_packs):
    out = tmp_path / "out"
    run_study(load_space(write_space(tmp_path)), Request(out_dir=out, agent="random", trials=SIZE))
    pack = next((out / "trials").glob("logs-*.tar.xz"))
    pack.write_bytes(pack.read_bytes()[: len(pack.read_bytes()) // 2])  # cut, as a full disk or a bad copy leaves it
    last = pack.name.split("-")[2].split(".")[0]  # a log past the cut (one before it still reads as it was)
    r = runner.invoke(app, ["parse", str(out / "trials" / last)])
    assert r.exit_code == 2 and pack.name in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_a_study_whose_database_is_gone_counts_its_packed_trials(tmp_path, small_packs):
    out = tmp_path / "out"
    run_study(load_space(write_space(tmp_path)), Request(out_dir=out, agent="random", trials=SIZE + 2))
    (out / "study.db").unlink()
    r = runner.invoke(app, ["leaderboard", str(out)])
    assert r.exit_code == 2 and f"({SIZE + 2} run directories)" in r.output


def test_a_study_started_anew_sets_the_old_packs_aside(tmp_path, small_packs):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    run_study(space, Request(out_dir=out, agent="random", trials=SIZE, seed=1))
    old = next((out / "trials").glob("logs-*.tar.xz"))
    before = old.read_bytes()
    (out / "study.db").unlink()
    run_study(space, Request(out_dir=out, agent="grid", trials=SIZE, resume=True, rebuild=True))
    aside = out / "trials" / old.name.replace(".tar.xz", ".orphan0.tar.xz")
    assert aside.read_bytes() == before and old.read_bytes() != before  # the new pack took the free name
    for r in _records(out):
        if r.run_dir is not None:  # each new trial's log is its own, not the old trial's of the same number
            parsed = json.loads(runner.invoke(app, ["parse", r.run_dir, "--json"]).output)
            assert parsed["status"] == r.status
            assert parsed["step_time_s"] == pytest.approx(r.metrics.get("step_time_s"), rel=1e-6)
