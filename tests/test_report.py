"""The HTML report's content, checked on the figures and tables it builds (the browser test sees it drawn)."""

from __future__ import annotations

import math
import shlex

import pytest

from dse.results import report
from dse.rules.space import Objective
from dse.study.store import TrialRecord

TFLOPS = Objective(metric="tflops_per_gpu")
STEP_TIME = Objective(metric="step_time_s")
META = {"study_name": "s", "knobs": {"tp": [8, 4, 2], "recompute": ["none", "full"]}}


def rec(n, tp, status="ok", reward=None, recompute="none", reason=None):
    ok = status == "ok"
    reward = (100.0 + 10 * tp + n) if reward is None and ok else (reward or 0.0)
    metrics = {"tflops_per_gpu": reward, "step_time_s": 2.0, "steps": 10, "peak_memory_gib": 40.0 + tp} if ok else {}
    return TrialRecord(
        n, {"tp": tp, "recompute": recompute}, status, reward, reason, metrics, f"/r/{n:05d}", "h100", 16
    )


def records():
    return [
        rec(0, 2, "oom", reason="CUDA out of memory. " * 20),
        rec(1, 8),
        rec(2, 4, "nccl_error", reason="NCCL timeout"),
        rec(3, 2),
        rec(4, 4, recompute="full"),
        rec(5, 8, "oom", reason="CUDA out of memory. " * 20),
        rec(6, 2),
    ]


def test_fmt_rounds_to_four_significant_digits_and_never_writes_none():
    assert report.fmt(123456.789) == "123,500" and report.fmt(10362.0) == "10,360"
    assert report.fmt(1.5e-5) == "1.5e-05" and report.fmt(-2345.678) == "-2346"
    assert report.fmt(3.14159265) == "3.142"
    assert report.fmt(8.0) == "8" and report.fmt(7) == "7"
    assert report.fmt(None) == "" and report.fmt(math.nan) == ""


def test_best_so_far_is_a_step_line_over_every_trial_after_the_first_success():
    fig = report._figures(report.frame(records(), ["tp", "recompute"]), records(), META["knobs"], TFLOPS)[0]
    best = next(t for t in fig.data if t.name == "best so far")
    assert best.line.shape == "hv"
    assert list(best.x) == list(range(7))
    ys = list(best.y)
    assert math.isnan(ys[0]) and all(not math.isnan(y) for y in ys[1:])  # no gap at the failures (trials 2, 5)
    assert ys[-1] == max(r.reward for r in records() if r.ok)
    assert all(b >= a for a, b in zip(ys[1:], ys[2:]))
    marks = {t.name: list(t.x) for t in fig.data if t.name not in ("ok", "best so far")}
    assert marks == {"nccl_error": [2], "oom": [0, 5]}  # failed trials are visible, by status
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.tickformat == "d"  # integer trial ticks


def test_ordinal_knobs_are_drawn_in_numeric_order():
    figs = report._figures(report.frame(records(), ["tp", "recompute"]), records(), META["knobs"], TFLOPS)
    by_tp = next(f for f in figs if f.layout.title.text.endswith("by tp (ok trials)"))
    assert list(by_tp.layout.xaxis.categoryarray) == ["2", "4", "8"]
    by_rc = next(f for f in figs if f.layout.title.text.endswith("by recompute (ok trials)"))
    assert list(by_rc.layout.xaxis.categoryarray) == ["none", "full"]  # not numbers: the space's order
    par = next(f for f in figs if type(f.data[0]).__name__ == "Parcoords")
    assert list(par.data[0].dimensions[0].ticktext) == ["2", "4", "8"]


def test_importance_is_estimated_on_ok_trials_and_skipped_with_too_few():
    assert report.importances(records()[:3], META["knobs"]) == {}
    many = [
        rec(n, tp, recompute=rc, reward=float(10 * tp + (5 if rc == "full" else 0) + n % 2))
        for n, (tp, rc) in enumerate([(t, r) for t in (2, 4, 8) for r in ("none", "full")] * 2)
    ]
    imp = report.importances(many, META["knobs"])
    assert set(imp) == {"tp", "recompute"} and imp["tp"] > imp["recompute"]


def test_importance_is_the_share_of_the_variance_each_knob_explains_as_the_box_plots_show():
    """tp alone moves the objective; recompute moves it a little; the best trials differ only in recompute:
    the ranking follows the box plots' spread (tp first), whatever separates the top trials."""
    rows = [(t, r) for t in (2, 4, 8) for r in ("none", "full")] * 2
    many = [
        rec(n, tp, recompute=rc, reward=float(100 * tp + (1 if rc == "full" else 0))) for n, (tp, rc) in enumerate(rows)
    ]
    imp = report.importances(many, META["knobs"])
    assert list(imp) == ["tp", "recompute"]
    y = [r.reward for r in many]
    mean = sum(y) / len(y)
    total = sum((v - mean) ** 2 for v in y)
    assert imp["recompute"] == pytest.approx(len(y) * 0.5**2 / total)  # two halves, each 0.5 from the mean
    assert imp["tp"] + imp["recompute"] == pytest.approx(1.0)  # the two effects are all there is
    fig = report._importance_figure(imp, len(many))
    assert "eta squared" in fig.layout.title.text and "12 ok trials" in fig.layout.title.text


def test_failures_are_grouped_by_class_with_one_short_reason():
    text = report.failures_table(report.frame(records(), ["tp", "recompute"]))
    assert text.count("<tr>") == 3  # header, oom, nccl_error
    assert "CUDA out of memory. " * 20 not in text.split("title=")[0]  # cut in the cell, whole on hover
    assert text.index("oom") < text.index("nccl_error")  # most frequent first


def test_report_has_no_literal_none_and_a_launch_command_that_parses_back():
    best = {"argv": ["python", "-m", "recipes.nemo2", "--factory", "f(a='x y')"], "env": {"A": "1 2", "B": "x"}}
    page = report.render([r for r in records() if r.ok], META, best=best)
    assert "None" not in page.split("<script")[0] + page.split("</script>")[-1]
    assert "No failed trials." in page
    cmd = report.launch_command(best)
    assert shlex.split(cmd) == ["env", "A=1 2", "B=x", *best["argv"]]


@pytest.mark.parametrize("n", [0, 1])
def test_report_of_a_study_with_no_success_renders(n):
    page = report.render([rec(i, 2, "oom", reason="oom") for i in range(n)], META)
    assert "No trial succeeded" in page or n == 0


XSS = "</script><script>alert(1)</script>"


def test_a_script_in_a_reason_knob_value_or_name_is_escaped_everywhere():
    """The page is an autoescaped template: a hostile reason, knob value, study name or launch command shows as
    text in the tables and is escaped in Plotly's data too; no value opens a script."""
    meta = {"study_name": XSS, "knobs": {"tp": [8, 4, 2], "recompute": ["none", XSS]}}
    recs = [
        rec(0, 2, "oom", reason=XSS),
        rec(1, 8),
        rec(2, 4, recompute=XSS),
        rec(3, 2),
        rec(4, 4, "pruned", reward=50.0, reason=XSS),
        rec(5, 8, "nccl_error", reason=XSS),
    ]
    page = report.render(recs, meta, best={"argv": ["python", XSS], "env": {"K": XSS}})
    assert "<script>alert" not in page and page.count("alert(1)") >= 8
    assert "<td>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page  # the failures' reason
    assert f"<h1>dse study {XSS}" not in page and "<h1>dse study &lt;/script&gt;" in page


def test_the_comparison_page_escapes_study_names_and_knob_values(tmp_path):
    import pandas as pd

    from dse.results import compare

    df = pd.DataFrame(
        [{c: None for c in compare.COLUMNS} | {"study": XSS, "changed_knobs": f"tp 8->{XSS}"}],
        columns=list(compare.COLUMNS),
    )
    page = compare.page(df, [{"dir": tmp_path / "x'y", "meta": {"study_name": XSS}}])
    assert "<script>alert" not in page and page.count("&lt;script&gt;alert(1)") == 3
    assert "x&#39;y" in page  # the link's quote cannot end its attribute


def step_rec(n, tp, status="ok", step=None):
    """A trial of a step-time study: its reward is minus its step time (seconds)."""
    ok = status == "ok"
    step = step if step is not None else 1.0 + 0.1 * tp + 0.01 * n
    metrics = {"step_time_s": step, "tflops_per_gpu": 400 / step, "peak_memory_gib": 40.0 + tp} if ok else {}
    reward = -step if ok else -3600.0
    return TrialRecord(n, {"tp": tp, "recompute": "none"}, status, reward, None if ok else "oom", metrics, None)


def step_records():
    return [step_rec(0, 8), step_rec(1, 2, "oom"), step_rec(2, 4), step_rec(3, 8, step=3.0), step_rec(4, 2)]


def test_a_step_time_study_plots_seconds_and_its_best_so_far_decreases():
    recs = step_records()
    figs = report._figures(report.frame(recs, ["tp", "recompute"]), recs, META["knobs"], STEP_TIME)
    by_trial = figs[0]
    assert "step time (s)" in by_trial.layout.title.text and by_trial.layout.yaxis.title.text == "step time (s)"
    ok = next(t for t in by_trial.data if t.name == "ok")
    assert sorted(ok.y) == sorted(r.metrics["step_time_s"] for r in recs if r.ok)  # seconds, never negative
    best = [y for y in next(t for t in by_trial.data if t.name == "best so far").y if not math.isnan(y)]
    assert best[0] == recs[0].metrics["step_time_s"] and best[-1] == min(ok.y)
    assert all(b <= a for a, b in zip(best, best[1:])) and best[-1] < best[0]
    oom = next(t for t in by_trial.data if t.name == "oom")
    assert list(oom.x) == [1] and oom.y[0] > max(ok.y)  # a failure is marked beyond the worst, above it
    by_tp = next(f for f in figs if f.layout.title.text.endswith("by tp (ok trials)"))
    assert by_tp.layout.yaxis.title.text == "step time (s)" and min(by_tp.data[0].y) > 0
    par = next(f for f in figs if type(f.data[0]).__name__ == "Parcoords")
    assert par.data[0].line.reversescale is True and list(par.data[0].line.color) == list(by_tp.data[0].y)
    assert par.data[0].dimensions[-1].label == "step time (s)"
    memory = figs[-1]
    assert memory.layout.yaxis.title.text == "step time (s)" and memory.data[0].marker.reversescale is True


def test_a_throughput_study_keeps_higher_is_better():
    figs = report._figures(report.frame(records(), ["tp", "recompute"]), records(), META["knobs"], TFLOPS)
    assert figs[0].layout.yaxis.title.text == "TFLOP/s per GPU" and "higher is better" in figs[0].layout.title.text
    par = next(f for f in figs if type(f.data[0]).__name__ == "Parcoords")
    assert par.data[0].line.reversescale is False


def test_the_objective_comes_from_dse_json_then_the_space_file_then_the_default(tmp_path):
    from tests.helpers import SMALL_SPACE, write_space

    fingerprint = {"fields": {"objective": {"metric": "step_time_s", "direction": None}}}
    assert report.study_objective({"fingerprint": fingerprint}).sense == "minimize"
    space = write_space(tmp_path, SMALL_SPACE.replace('"tflops_per_gpu"', '"tokens_per_s_per_gpu"'))
    meta = {"space": str(space), "space_name": "small"}
    assert report.study_objective(meta).metric == "tokens_per_s_per_gpu"
    assert report.study_objective({**meta, "space_name": "another"}).metric == "tflops_per_gpu"  # not that space
    assert report.study_objective({"space": str(tmp_path / "gone.toml")}) == Objective()


def test_the_header_says_where_the_figures_come_from(tmp_path):
    from dse.study.leaderboard import Provenance
    from tests.helpers import SMALL_SPACE, write_space

    twin = SMALL_SPACE + '\n[backend]\ntruth = "twin"\ntwin_seed = 3\n'
    meta = {**META, "space": str(write_space(tmp_path, twin)), "space_name": "small", "backend": "sim"}
    prov = report.study_provenance(meta)
    assert (prov.backend, prov.truth, prov.calibration, prov.simulated) == ("sim", "twin (seed 3)", "none", True)
    page = report.render([r for r in records() if r.ok], meta)
    assert "predicted by the performance model, not measured (truth twin (seed 3), calibration none)" in page
    measured = report.render([r for r in records() if r.ok], {**META, "backend": "slurm"})
    assert "Measured: every figure comes from runs launched by the slurm backend." in measured
    assert "predicted by" not in measured
    fields = {"backend": "sim", "payload": "sim", "truth": "exact", "twin_seed": None, "calibration": None}
    assert report.study_provenance({"fingerprint": {"fields": fields}}) == Provenance("sim", "exact", "none")
    recorded = {"provenance": {"backend": "sim", "truth": "exact", "calibration": "cal.toml"}, "backend": "slurm"}
    assert report.study_provenance(recorded) == Provenance("sim", "exact", "cal.toml")  # dse.json's record first


def test_a_step_time_studys_leaderboard_shows_seconds_not_rewards():
    page = report.render(step_records(), META, objective=STEP_TIME)
    board = page.split("<h2>Leaderboard</h2>")[1]
    assert "<th>reward</th>" not in board and "<th>step_<wbr>time_<wbr>s</th>" in board
    assert "-1.24" not in board and "<td>1.24</td>" in board  # trial 4: a 1.24 s step, never its reward -1.24


def test_a_leaderboard_shows_the_reward_only_where_it_says_something_its_metric_does_not():
    """A maximising study's reward is its metric (TFLOP/s): one column, not two; a pruned trial's reward is its
    bound, not its figure, so a table with one keeps the column."""
    board = report.render(records(), META).split("<h2>Leaderboard</h2>")[1]
    assert "<th>reward</th>" not in board and "<th>tflops_<wbr>per_<wbr>gpu</th>" in board
    pruned = [*records(), rec(7, 4, "pruned", reward=150.0)]
    assert "<th>reward</th>" in report.render(pruned, META).split("<h2>Leaderboard</h2>")[1]
