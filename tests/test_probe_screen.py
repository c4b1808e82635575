"""``[search] screen = "probe"``: each point probed on one GPU before its launch, screened on the probe's measured
peak plus the model's NCCL buffers, the probes recorded apart from the runs (``probes/``, ``dse.json``, the
summary). The one-H100 grid of bench/data/h100_mcore_grid stands in for the GPU: each probe 'runs' by writing its
point's recorded probe log, each launched trial by writing its point's recorded real log."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from dse import probe
from dse.backends.base import RunResult
from dse.backends.local import LocalBackend
from dse.rules.space import load_space
from dse.study.leaderboard import ProbeCost, Summary
from dse.study.loop import Request, run_study
from tests.helpers import dse, one_line_error

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "bench/data/h100_mcore_grid"
SPACE = ROOT / "conf/spaces/llama3_8b_4l_h100_local_space.toml"
MBS, RECOMPUTE = [1, 2, 4], ["none", "selective", "full"]


def _grid_index(values) -> int:
    return MBS.index(int(values["mbs"])) * len(RECOMPUTE) + RECOMPUTE.index(values["recompute"])


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.read_text().splitlines()))


@pytest.fixture
def h100(monkeypatch):
    """The recorded H100: probes and real runs replayed from their logs; returns the points launched at scale."""
    launched: list[int] = []

    def execute(script: Path, backend: str, timeout_s: float):
        args = script.read_text()
        mbs = int(re.search(r"train\.micro_batch_size=(\d+)", args).group(1))
        rec = re.search(r"model\.recompute_granularity=(\w+)", args).group(1)
        index = _grid_index({"mbs": mbs, "recompute": "none" if rec == "null" else rec})
        log = GRID / "probes" / f"grid_probe_{index:05d}.log"
        shutil.copy(log, script.parent / "log.txt")
        return (1 if "OutOfMemoryError" in log.read_text() else 0), None

    def run(self, plan, run_dir, stop=None):
        index = _grid_index(plan.trial.values)
        launched.append(index)
        run_dir.mkdir(parents=True, exist_ok=True)
        log = GRID / "trials" / f"{index:05d}" / "log.txt"
        shutil.copy(log, run_dir / "log.txt")
        code = 1 if "OutOfMemoryError" in log.read_text() else 0
        return RunResult(run_dir=run_dir, log_path=run_dir / "log.txt", exit_code=code)

    monkeypatch.setattr(probe, "_execute", execute)
    monkeypatch.setattr(LocalBackend, "_run", run)
    return launched


def _probe_space(tmp_path: Path, **replace: str) -> Path:
    text = SPACE.read_text().replace('screen = "none"', 'screen = "probe"')
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "space.toml"
    path.write_text(text)
    return path


def test_the_probe_screen_launches_none_of_the_grids_out_of_memory_points(tmp_path, h100):
    """The real grid launched 9 points and 4 ran out of memory; probed first, the 4 are screened (3 whose probe ran
    out of memory, mbs 2 without recompute on its measured 77.4 GiB plus the model's 3 GiB of NCCL buffers) and
    the 5 that fit are launched, none out of memory."""
    out = tmp_path / "study"
    run_study(load_space(_probe_space(tmp_path)), Request(out_dir=out))
    board = {_grid_index(r): r for r in _rows(out / "leaderboard.csv")}
    assert sorted(h100) == [0, 1, 2, 4, 5]
    assert [i for i, r in sorted(board.items()) if r["status"] == "screened"] == [3, 6, 7, 8]
    assert [i for i, r in sorted(board.items()) if r["status"] == "ok"] == [0, 1, 2, 4, 5]
    assert "held 77.4 GiB (measured) + 8.9 GiB" in board[3]["reason"] and "> 80 GiB GPU memory" in board[3]["reason"]
    for i in (6, 7, 8):
        assert "rank 0 (first stage) ran out of memory on one GPU (measured)" in board[i]["reason"]
        assert float(board[i]["gpu_hours"]) == 0.0
    probes = _rows(out / "probes" / "probes.csv")
    assert sorted(int(r["point"]) for r in probes) == list(range(9))
    assert {int(r["point"]) for r in probes if r["screened"] == "True"} == {3, 6, 7, 8}
    for r in probes:  # each row's peak is its probe log's, and its run directory is the study's
        assert (out / r["run_dir"] / "log.txt").is_file() and (out / r["run_dir"] / "launch.sh").is_file()
        if r["status"] == "ok":
            assert float(r["peak_memory_reserved_gib"]) >= float(r["peak_memory_gib"]) > 40
    meta = json.loads((out / "dse.json").read_text())
    assert {k: meta["probes"][k] for k in ("points", "ranks", "screened")} == {"points": 9, "ranks": 9, "screened": 4}
    assert meta["probes"]["gpu_minutes"] >= 0


def test_the_summary_and_leaderboard_say_the_probes_apart_from_the_runs(tmp_path, h100):
    out = tmp_path / "study"
    run_study(load_space(_probe_space(tmp_path)), Request(out_dir=out))
    r = dse("leaderboard", str(out))
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())  # the terminal wraps the line
    line = text[text.index("launched runs") :]
    assert "launched runs: 5; screened (not launched): 4" in line
    assert "probes (one GPU each, before launch): 9 points on 9 ranks, 4 screened" in line
    assert "GPU-minutes measured (not in the GPU-hours)" in line


def test_a_resumed_probe_study_probes_no_point_twice(tmp_path, h100):
    out = tmp_path / "study"
    space = load_space(_probe_space(tmp_path))
    run_study(space, Request(out_dir=out, trials=3))
    run_study(space, Request(out_dir=out, resume=True))
    probes = _rows(out / "probes" / "probes.csv")
    assert sorted(int(r["point"]) for r in probes) == list(range(9))
    assert json.loads((out / "dse.json").read_text())["probes"]["points"] == 9


def test_a_probe_that_measured_no_peak_leaves_the_point_to_the_model(tmp_path, monkeypatch, h100):
    """A probe that failed for another reason (no memory line) is no evidence: the model's screen decides."""

    def failed(script: Path, backend: str, timeout_s: float):
        (script.parent / "log.txt").write_text("ImportError: no module named megatron\n")
        return 1, None

    monkeypatch.setattr(probe, "_execute", failed)
    out = tmp_path / "study"
    run_study(load_space(_probe_space(tmp_path, **{"mbs = [1, 2, 4]": "mbs = [1, 4]"})), Request(out_dir=out))
    board = {_grid_index(r): r for r in _rows(out / "leaderboard.csv")}
    # mbs 4 without recompute and with selective recompute: 124 and 86 GiB predicted (both ran out of memory)
    assert [i for i, r in board.items() if r["status"] == "screened"] == [6, 7]
    assert board[6]["reason"].startswith("the probe measured no peak; predicted peak memory")
    assert sorted(h100) == [0, 1, 2, 8]  # the model lets the others through


@pytest.mark.parametrize(
    "replace, args, message",
    [
        (
            {},
            ["--backend", "sim"],
            "probes each point on one GPU of the local or slurm backend; this study runs on 'sim'",
        ),
        ({'payload = "mcore"': 'payload = "nemo2"'}, [], "this space's payload is 'nemo2'"),
    ],
)
def test_a_probe_screen_the_study_cannot_run_is_refused_in_one_line(tmp_path, replace, args, message):
    path = _probe_space(tmp_path, **replace)
    r = dse("run", "--space", str(path), "--out", str(tmp_path / "out"), *args)
    one_line_error(r, "search.screen", message)
    assert not (tmp_path / "out" / "dse.json").exists()


def test_probe_cost_reads_only_what_it_can():
    assert ProbeCost.of_meta({}) is None
    assert ProbeCost.of_meta({"probes": "many"}) is None
    assert ProbeCost.of_meta({"probes": {"points": 2, "ranks": 3, "screened": 1, "gpu_minutes": "nan"}}) is None
    cost = ProbeCost.of_meta({"probes": {"points": 2, "ranks": 3, "screened": 1, "gpu_minutes": 1.25}})
    assert cost == ProbeCost(2, 3, 1, 1.25)
    assert "2 points on 3 ranks, 1 screened, 1.2 GPU-minutes" in Summary(probes=cost).runs_line()
    assert "probes" not in Summary().runs_line()


# ------------------------------------------------------------------------------------------- the device's study
def _max_allocated_gib(log: Path) -> float:
    return max(float(x) for x in re.findall(r"\| max allocated: ([0-9.]+)", log.read_text())) / 1024


def test_the_probe_screened_study_on_the_h100_launched_no_point_that_ran_out_of_memory():
    """bench/data/h100_probe_screen: dse run with screen = "probe" on one H100 (mbs 2 and 4, recompute none and
    selective). The probes screened exactly the points the real grid (bench/data/h100_mcore_grid) ran out of
    memory on; the one launched point ran, with its probe's peak; the probes' GPU-minutes are dse.json's."""
    data = ROOT / "bench/data/h100_probe_screen"
    study = data / "study"
    probes = _rows(study / "probes" / "probes.csv")
    for r in probes:
        run = study / r["run_dir"]
        assert "--fake-process-group" in (run / "launch.sh").read_text()
        if r["status"] == "ok":
            assert float(r["peak_memory_gib"]) == pytest.approx(_max_allocated_gib(run / "log.txt"), rel=1e-6)
        else:
            assert r["status"] == "oom" and "OutOfMemoryError" in (run / "log.txt").read_text()
    board = _rows(study / "leaderboard.csv")
    assert "oom" not in {r["status"] for r in board}
    real = {_grid_index(r): r["status"] for r in _rows(GRID / "leaderboard.csv")}
    screened = {_grid_index(r) for r in board if r["status"] == "screened"}
    launched = {_grid_index(r) for r in board if r["status"] == "ok"}
    assert {_grid_index(r) for r in probes} == screened | launched == {3, 4, 6, 7}
    assert screened == {i for i in screened | launched if real[i] == "oom"} == {3, 6, 7}
    held = next(r for r in probes if r["screened"] == "True" and r["status"] == "ok")
    assert (
        float(held["peak_memory_reserved_gib"]) + float(held["buffers_gib"])
        > 80
        > float(held["peak_memory_gib"]) + float(held["buffers_gib"])
    )  # the allocator's blocks, not its live tensors, decided it
    (ran,) = [r for r in board if r["status"] == "ok"]
    probe_peak = next(float(r["peak_memory_gib"]) for r in probes if r["screened"] == "False")
    assert float(ran["peak_memory_gib"]) == pytest.approx(probe_peak, rel=0.03)
    meta = json.loads((study / "dse.json").read_text())["probes"]
    assert meta["ranks"] == len(probes) == 4 and meta["screened"] == 3
    assert meta["gpu_minutes"] == pytest.approx(sum(float(r["gpu_minutes"]) for r in probes), abs=1e-3)
    assert "probes (one GPU each, before launch): 4 points on 4 ranks, 3 screened" in " ".join(
        (data / "dse_run.txt").read_text().split()
    )
