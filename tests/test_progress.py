"""``dse run``'s progress bar: the study's best (resumed trials included), written as the summary's cells are."""

from __future__ import annotations

from dse.cli import render
from dse.rules.space import load_space
from dse.study import loop as study_mod
from tests.helpers import write_space


def test_after_resume_the_progress_shows_the_studys_best_not_the_new_trials(tmp_path):
    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    first = study_mod.run_study(space, study_mod.Request(out_dir=out, agent="grid", trials=12))
    before = max(r.metrics["tflops_per_gpu"] for r in first.records if r.ok)
    shown = []
    again = study_mod.run_study(
        space,
        study_mod.Request(
            out_dir=out, agent="grid", trials=14, resume=True, on_trial=lambda r, d, t, best: shown.append(best)
        ),
    )
    new = [r for r in again.records if r.number >= 12 and r.ok]
    assert shown and all(b >= before for b in shown)
    assert shown[-1] == max([before, *(r.metrics["tflops_per_gpu"] for r in new)])


def test_the_progress_writes_large_figures_without_an_exponent():
    progress, on_trial = render.trial_progress("s", "step_time_s")
    try:
        on_trial(None, 1, 10, 10164.3)
        text = progress.tasks[0].fields["best"]
    finally:
        progress.stop()
    assert text == "best step_time_s: 10164"


def test_the_reports_header_writes_the_gpu_hours_as_the_cli_does(tmp_path):
    """One sentence for launched runs and GPU-hours: the report's header and the terminal's summary agree."""
    from typer.testing import CliRunner

    from dse.cli import app

    out = tmp_path / "out"
    study_mod.run_study(load_space(write_space(tmp_path)), study_mod.Request(out_dir=out, agent="grid", trials=30))
    runner = CliRunner()
    board = runner.invoke(app, ["leaderboard", str(out)])
    assert board.exit_code == 0, board.output
    sentence = next(ln for ln in board.output.splitlines() if ln.startswith("launched runs:"))
    assert "GPU-hours:" in sentence
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    assert sentence in (out / "report.html").read_text()
