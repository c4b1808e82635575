"""The replay backend (dse.backends.replay) over the real studies in bench/data/: each trial gets its point's
recorded outcome, a point the study never ran is refused before launch (costs nothing), and a bad table is one
line naming the file and the column. The backend contract suite runs it too (tests/test_backend_contract.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from dse.rules.space import load_space
from dse.study.loop import Request, run_study
from tests.helpers import dse, one_line_error

DATA = Path(__file__).resolve().parent.parent / "bench" / "data"
STUDY_70B = DATA / "h200_te_70b_4l_study"
STUDY_8B = DATA / "h200_local_study"


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def by_point(table: list[dict[str, str]], *knobs: str) -> dict[tuple[str, ...], dict[str, str]]:
    return {tuple(r[k] for k in knobs): r for r in table}


def replay_space(tmp_path: Path, study: Path, *, knobs: str, screen: str = "none", extra: str = "") -> Path:
    """A copy of ``study``'s shipped replay space with other knobs, the screen as given, the table absolute."""
    text = (study / "replay_space.toml").read_text()
    head, rest = text.split("[knobs]", 1)
    rest = rest.split("[objective]", 1)[1]
    text = f"{head}[knobs]\n{knobs}\n[objective]{rest}".replace('replay = "."', f'replay = "{study}"')
    text = text.replace("seed = 0", f'seed = 0\nscreen = "{screen}"') + extra
    p = tmp_path / "space.toml"
    p.write_text(text)
    return p


def test_a_replayed_study_gives_back_every_recorded_outcome(tmp_path):
    space = load_space(replay_space(tmp_path, STUDY_70B, knobs='mbs = [1, 2, 4]\nrecompute = ["none", "full"]'))
    run_study(space, Request(out_dir=tmp_path / "out"))
    recorded = by_point(rows(STUDY_70B / "leaderboard.csv"), "mbs", "recompute")
    replayed = by_point(rows(tmp_path / "out" / "leaderboard.csv"), "mbs", "recompute")
    assert replayed.keys() == recorded.keys()
    for point, want in recorded.items():
        got = replayed[point]
        assert got["status"] == want["status"], point
        for col in ("step_time_s", "tflops_per_gpu", "peak_memory_gib", "gpu_hours", "steps"):
            if want[col]:
                assert float(got[col]) == pytest.approx(float(want[col]), rel=1e-9), (point, col)
            else:
                assert got[col] == "", (point, col)
    oom = replayed[("4", "none")]
    assert oom["status"] == "oom" and "Tried to allocate 7.83 GiB" in oom["reason"]


def test_an_oom_is_replayed_as_oom_through_the_real_parser(tmp_path):
    space = load_space(replay_space(tmp_path, STUDY_70B, knobs='mbs = [4]\nrecompute = ["none"]'))
    run_study(space, Request(out_dir=tmp_path / "out"))
    (only,) = rows(tmp_path / "out" / "leaderboard.csv")
    assert only["status"] == "oom" and only["backend"] == "replay"
    r = dse("parse", tmp_path / "out" / only["run_dir"] / "log.txt")  # the log alone says oom
    assert "oom" in r.stdout


def test_a_point_the_table_lacks_is_refused_before_launch_and_costs_nothing(tmp_path):
    space = load_space(replay_space(tmp_path, STUDY_8B, knobs='mbs = [1, 4]\nrecompute = ["none", "full"]'))
    # the grid skips a refused point as it skips a broken one (masked): only the recorded points launch
    run_study(space, Request(out_dir=tmp_path / "grid"))
    assert {(r["mbs"], r["status"]) for r in rows(tmp_path / "grid" / "leaderboard.csv")} == {("1", "ok")}
    # Optuna sees every point it asks for: a refused one is recorded rejected, with its one-line reason
    run_study(space, Request(out_dir=tmp_path / "optuna", agent="optuna", trials=4))
    got = rows(tmp_path / "optuna" / "leaderboard.csv")
    refused = [r for r in got if r["mbs"] == "4"]
    assert refused and all(r["status"] == "rejected" and float(r["gpu_hours"]) == 0.0 for r in refused)
    for r in refused:
        assert r["reason"].startswith(f"replay: no recorded run of mbs=4, recompute={r['recompute']} in "), r
        assert r["run_dir"] == ""
    launched = [r for r in got if r["status"] != "rejected"]
    assert all(r["mbs"] == "1" for r in launched)
    assert len(list((tmp_path / "optuna" / "trials").iterdir())) == len(launched)


def test_the_replay_path_is_relative_to_the_space_file(tmp_path):
    r = dse("validate", DATA / "h200_te_8b_4l_study" / "replay_space.toml", cwd=tmp_path)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (lambda t: t.replace("status", "state", 1), ("leaderboard.csv", "status", "no status column")),
        (lambda t: t.replace(",ok,", ",fine,", 1), ("leaderboard.csv", "status (row 1)", "unknown status 'fine'")),
        (lambda t: t.replace(",0.4595,", ",,", 1), ("step_time_s (row 1)", "needs its step time")),
        (lambda t: t.replace(",0.4595,", ",fast,", 1), ("step_time_s (row 1)", "'fast' is not a finite number")),
        (lambda t: t.replace(",h200,", ",h100,", 1), ("gpu (row 1)", "recorded on h100")),
        (lambda t: t.replace(",recompute,", ",colour,"), ("recompute", "has no recompute column")),
    ],
)
def test_a_bad_replay_table_is_one_line_naming_the_file_and_column(tmp_path, edit, needles):
    table = tmp_path / "leaderboard.csv"
    table.write_text(edit((STUDY_8B / "leaderboard.csv").read_text()))
    space = replay_space(tmp_path, STUDY_8B, knobs='mbs = [1, 2]\nrecompute = ["none", "full"]')
    space.write_text(space.read_text().replace(f'replay = "{STUDY_8B}"', 'replay = "leaderboard.csv"'))
    one_line_error(dse("validate", space), *needles)
    r = dse("run", "--space", space, "--out", tmp_path / "out")
    one_line_error(r, *needles)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_missing_table_or_setting_is_one_line(tmp_path):
    space = replay_space(tmp_path, STUDY_8B, knobs="mbs = [1, 2]")
    space.write_text(space.read_text().replace(f'replay = "{STUDY_8B}"', 'replay = "nowhere.csv"'))
    one_line_error(dse("validate", space), "nowhere.csv", "no such file")
    space.write_text(space.read_text().replace('replay = "nowhere.csv"', ""))
    one_line_error(dse("validate", space), "backend.replay", "needs the study to replay")


def test_a_resume_over_another_table_is_refused(tmp_path):
    space = replay_space(tmp_path, STUDY_8B, knobs='mbs = [1]\nrecompute = ["none"]')
    table = tmp_path / "leaderboard.csv"
    table.write_text((STUDY_8B / "leaderboard.csv").read_text())
    space.write_text(space.read_text().replace(f'replay = "{STUDY_8B}"', 'replay = "leaderboard.csv"'))
    assert dse("run", "--space", space, "--out", tmp_path / "out").exit_code == 0
    table.write_text(table.read_text().replace("0.4922", "0.4"))
    one_line_error(dse("run", "--space", space, "--out", tmp_path / "out", "--resume"), "replay")


def test_the_rl_environment_takes_a_replayed_study_as_its_truth(tmp_path):
    import gymnasium as gym

    import dse.envs  # noqa: F401  (registers dse/Recipe-v0)

    space = STUDY_70B / "replay_space.toml"
    env = gym.make("dse/Recipe-v0", space=str(space), backend="replay", budget=10, out_dir=tmp_path)
    env.reset(seed=0)
    got = {}
    for mbs in range(3):  # mbs [1, 2, 4] x recompute [none, full]
        for rec in range(2):
            *_, terminated, _, info = env.step([mbs, rec, 0])  # the last entry: stop (0, go on)
            got[(mbs, rec)] = info
    recorded = by_point(rows(STUDY_70B / "leaderboard.csv"), "mbs", "recompute")
    assert got[(2, 0)]["status"] == "oom" and got[(2, 0)]["launched"]
    assert got[(1, 0)]["reward"] == pytest.approx(float(recorded[("2", "none")]["tflops_per_gpu"]))
    assert {info["status"] for info in got.values()} == {"ok", "oom"}
    assert terminated  # every point the table holds has run
    env.close()
