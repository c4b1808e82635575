"""Predicted beside measured: each trial keeps what the study's model predicted at its launch, the summary says
the model's error so far, and every gain says whether its figures were measured or predicted."""

from __future__ import annotations

import pytest

from dse.forecast import Screen
from dse.rules.space import load_space
from dse.rules.trial import resolve
from dse.study.leaderboard import PRIOR_STEP_ERROR
from dse.study.loop import Request, run_study
from tests.test_replay import STUDY_8B, STUDY_70B, replay_space, rows


def predicted(space, row: dict[str, str]):
    knobs = {k: (int(row[k]) if k == "mbs" else row[k]) for k in space.knob_names}
    return Screen(space).point(resolve(space, knobs))


def test_each_trial_keeps_what_the_model_predicted_beside_what_ran(tmp_path):
    space = load_space(replay_space(tmp_path, STUDY_70B, knobs='mbs = [1, 2, 4]\nrecompute = ["none", "full"]'))
    res = run_study(space, Request(out_dir=tmp_path / "out"))
    got = rows(tmp_path / "out" / "leaderboard.csv")
    cols = list(got[0])
    assert cols.index("predicted_step_time_s") == cols.index("mfu") + 1
    assert cols.index("predicted_peak_memory_gib") == cols.index("mfu") + 2
    # the first trial is predicted by the prior model; the later ones by the model refit on the runs before them
    # (dse.perfmodel.refit; tests/test_refit.py), which learnt the replayed stack's speed
    first = next(r for r in got if r["trial"] == "0")
    f = predicted(space, first)
    assert float(first["predicted_step_time_s"]) == pytest.approx(f.step_time_s)
    assert float(first["predicted_peak_memory_gib"]) == pytest.approx(f.peak_memory_gib)
    later = [r for r in got if r["trial"] != "0"]
    assert any(float(r["predicted_step_time_s"]) != pytest.approx(predicted(space, r).step_time_s) for r in later)
    oom = next(r for r in got if r["status"] == "oom")
    assert oom["peak_memory_gib"] == "" and float(oom["predicted_peak_memory_gib"]) > 141  # beyond the H200's
    # the summary's error: the MAPE of the ok rows, computed here from the CSV
    ok = [r for r in got if r["status"] == "ok"]
    step = sum(abs(float(r["predicted_step_time_s"]) / float(r["step_time_s"]) - 1) for r in ok) / len(ok)
    mem = sum(abs(float(r["predicted_peak_memory_gib"]) / float(r["peak_memory_gib"]) - 1) for r in ok) / len(ok)
    assert res.summary.model.step == pytest.approx(step) and res.summary.model.memory == pytest.approx(mem)
    assert res.summary.model_line() == (
        f"model error so far (predicted at launch vs measured): step time +-{step:.1%} MAPE over {len(ok)} runs; "
        f"peak memory +-{mem:.1%} over {len(ok)}; 0 of 1 OOM runs the model said fit"
    )


def test_an_oom_the_model_said_fits_is_counted(tmp_path):
    table = tmp_path / "leaderboard.csv"
    lines = (STUDY_8B / "leaderboard.csv").read_text().splitlines()
    # trial 3 (mbs 2, no recompute) recorded as a run out of memory: the model predicts it well within the H200
    lines = [
        ln.replace("3,ok,306.25,0.4595,306.25,35656.14798694233,45.011784076690674,", "3,oom,0.0,,,,,")
        + ("torch.OutOfMemoryError: CUDA out of memory." if ln.startswith("3,") else "")
        for ln in lines
    ]
    table.write_text("\n".join(lines) + "\n")
    space = replay_space(tmp_path, STUDY_8B, knobs='mbs = [1, 2]\nrecompute = ["none"]')
    space.write_text(space.read_text().replace(f'replay = "{STUDY_8B}"', 'replay = "leaderboard.csv"'))
    res = run_study(load_space(space), Request(out_dir=tmp_path / "out"))
    assert {r.status for r in res.records} == {"ok", "oom"}
    assert res.summary.model_line().endswith("; 1 of 1 OOM runs the model said fit")


def test_a_measured_gain_says_measured_and_a_simulated_one_predicted(tmp_path):
    space = load_space(replay_space(tmp_path, STUDY_70B, knobs='mbs = [1, 2]\nrecompute = ["none"]'))
    res = run_study(space, Request(out_dir=tmp_path / "replay"))
    assert res.summary.baseline_line().endswith(f"over {res.summary.baseline.source} (trial 0): measured")
    sim = space.model_copy(update={"backend": space.backend.model_copy(update={"kind": "sim"})})
    res = run_study(sim, Request(out_dir=tmp_path / "sim"))
    line = res.summary.baseline_line()
    assert line.endswith("(trial 0): predicted (simulated, truth exact)") or line.startswith("the best is")
    assert res.summary.model_line() == ""  # the model against its own figures says nothing


def test_a_predicted_baseline_says_the_models_error(tmp_path):
    # mbs 2 and 4 only: the recipe's mbs 1 is not in the space, so the model predicts it
    space = load_space(replay_space(tmp_path, STUDY_70B, knobs='mbs = [2, 4]\nrecompute = ["full"]'))
    res = run_study(space, Request(out_dir=tmp_path / "out"))
    line = res.summary.baseline_line()
    model = res.summary.model
    assert model.step_n == 2
    assert line.endswith(
        f"the best measured, {res.summary.baseline.source} predicted (model error +-{model.step:.0%} over 2 measured runs)"
    )
    empty = type(model)()  # before any measured run: the shipped model's error on published layouts
    assert empty.label() == (
        f"predicted (model error +-{PRIOR_STEP_ERROR:.0%} on published layouts; none measured here)"
    )


def test_the_report_says_the_models_error(tmp_path):
    from tests.helpers import dse

    space = replay_space(tmp_path, STUDY_70B, knobs='mbs = [1, 2]\nrecompute = ["none"]')
    assert dse("run", "--space", space, "--out", tmp_path / "out").exit_code == 0
    assert dse("report", tmp_path / "out").exit_code == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Model error so far (predicted at launch vs measured): step time +-" in page
    assert ": measured" in page


def test_best_readme_gives_the_headroom_against_the_models_memory_error(tmp_path):
    space = load_space(replay_space(tmp_path, STUDY_70B, knobs='mbs = [1, 2]\nrecompute = ["none"]'))
    res = run_study(space, Request(out_dir=tmp_path / "out"))
    best = res.summary.best
    peak, capacity = best.metrics["predicted_peak_memory_gib"], best.metrics["predicted_memory_gib"]
    readme = (tmp_path / "out" / "best" / "README").read_text()
    mem = res.summary.model.memory
    assert (
        f"Memory: predicted peak {peak:.1f} of {capacity:.1f} GiB, headroom {capacity - peak:.1f} GiB "
        f"({(capacity - peak) / capacity:.1%}); the model's memory error +-{mem:.1%} of the peak "
        f"({mem * peak:.1f} GiB), its error on 2 measured runs." in readme
    )
    assert f"Measured peak (allocated): {best.metrics['peak_memory_gib']:.1f} GiB." in readme
    assert "WARNING" not in readme  # 15 GiB of headroom against a 3% error


@pytest.mark.parametrize(("peak", "warned"), [(135.0, True), (130.0, False)])
def test_a_headroom_inside_the_memory_error_is_warned(tmp_path, peak, warned):
    from dse.study.best import memory_lines
    from dse.study.store import TrialRecord

    space = load_space(replay_space(tmp_path, STUDY_70B, knobs='mbs = [1, 2]\nrecompute = ["none"]'))
    rec = TrialRecord(
        0,
        {"mbs": 1, "recompute": "none"},
        "ok",
        1.0,
        metrics={
            "predicted_peak_memory_gib": peak,
            "predicted_memory_gib": 141.0,
        },
    )
    text = "\n".join(memory_lines(space, rec, resolve(space, rec.knobs), None))
    # before any measured run the error is the screen's margin: 5% of 141 GiB = 7.05 GiB (7.1)
    assert "the model's memory error +-7.1 GiB (5% of the GPU's memory, the screen's margin" in text
    assert ("WARNING: the predicted headroom" in text) is warned


def test_a_best_recorded_before_trials_kept_predictions_is_predicted_now(tmp_path):
    from dse.study.best import memory_lines
    from dse.study.store import TrialRecord

    space = load_space(replay_space(tmp_path, STUDY_70B, knobs='mbs = [1, 2]\nrecompute = ["none"]'))
    rec = TrialRecord(0, {"mbs": 2, "recompute": "none"}, "ok", 1.0, metrics={"peak_memory_gib": 121.7})
    f = predicted(space, {"mbs": "2", "recompute": "none"})
    text = "\n".join(memory_lines(space, rec, resolve(space, rec.knobs), None))
    assert f"Memory: predicted peak {f.peak_memory_gib:.1f} of {f.memory_gib:.1f} GiB" in text
    assert "Measured peak (allocated): 121.7 GiB." in text


def test_a_comparison_says_where_its_figures_come_from(tmp_path):
    from tests.helpers import dse

    a = replay_space(tmp_path, STUDY_70B, knobs='mbs = [1, 2]\nrecompute = ["none"]')
    assert dse("run", "--space", a, "--out", tmp_path / "a").exit_code == 0
    r = dse("compare", tmp_path / "a", tmp_path / "a", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    assert "figures: measured\n" in r.stdout
    assert "(trial 0): measured" in r.stdout
