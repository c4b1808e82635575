"""How a study learns (dse.perfmodel.refit): the censored out-of-memory fit, the out-of-memory neighbour rule, the screen's
margin from the model's measured error, the refit said and kept in the study's directory, and refit on resume."""

from __future__ import annotations

import pytest

from dse.facts.calibration_file import load_calibration
from dse.forecast import Screen
from dse.perfmodel import DEFAULT_PARAMS, predict
from dse.perfmodel.calibrate import Run, fit_runs
from dse.perfmodel.refit import MARGIN_FLOOR, StudyModel, needs_more_memory
from dse.rules import constraints
from dse.rules.space import load_space
from dse.rules.trial import resolve
from dse.study import loop as study_mod
from tests.helpers import SMALL_SPACE, write_space

TWIN = SMALL_SPACE.replace('screen = "none"', "") + '\n[backend]\nkind = "sim"\ntruth = "twin"\ntwin_seed = 1\n'


def _space(tmp_path, text=TWIN):
    return load_space(write_space(tmp_path, text))


def _fitting(space, low=0.6, high=0.95):
    """A valid point predicted to fit, between ``low`` and ``high`` of the GPU's memory."""
    for p in space.points():
        t = resolve(space, p)
        if constraints.check(t) is None:
            pr = predict(t)
            if low * pr.gpu_memory_gib < pr.peak_memory_gib < high * pr.gpu_memory_gib:
                return p, t, pr
    raise AssertionError("no such point")


def test_an_out_of_memory_run_raises_the_memory_estimate_of_its_point_above_the_gpus(tmp_path):
    space = _space(tmp_path)
    _, trial, before = _fitting(space)
    fitted = fit_runs([Run("oom", trial, None, None, oom=True)], [], ["memory_offset_gib"])
    after = predict(trial, params=fitted)
    assert before.peak_memory_gib < before.gpu_memory_gib < after.peak_memory_gib


def test_the_out_of_memory_neighbour_rule():
    ran_out = {"tp": 2, "pp": 1, "mbs": 2, "recompute": "selective", "seq_length": 4096}
    assert needs_more_memory({**ran_out, "mbs": 4}, ran_out)
    assert needs_more_memory({**ran_out, "recompute": "none"}, ran_out)
    assert needs_more_memory({**ran_out, "seq_length": 8192, "mbs": 2}, ran_out)
    assert needs_more_memory(dict(ran_out), ran_out)
    assert not needs_more_memory({**ran_out, "mbs": 1}, ran_out)
    assert not needs_more_memory({**ran_out, "recompute": "full"}, ran_out)
    assert not needs_more_memory({**ran_out, "tp": 4}, ran_out)  # another layout: the model decides


def test_a_point_needing_the_memory_of_an_oom_is_screened_whatever_the_model_says(tmp_path):
    space = _space(tmp_path)
    point, trial, _ = _fitting(space)
    model = StudyModel(space, DEFAULT_PARAMS, learns=False)
    screen = Screen(space, model)
    assert screen.reason(trial) is None
    model.observe(7, trial, "oom", None)
    assert "trial 7" in screen.reason(trial) and "ran out of memory" in screen.reason(trial)
    bigger = resolve(space, {**point, "mbs": 2})
    smaller_layout = resolve(space, {**point, "tp": 8})
    assert "trial 7" in (screen.reason(bigger) or "")
    assert "trial 7" not in (screen.reason(smaller_layout) or "")
    named = ", ".join(f"{k} {trial.values[k]}" for k in space.knob_names)
    assert model.contradictions and model.contradictions[0].startswith(
        f"trial 7 ({named}) ran out of memory where the model said it fits"
    )


def test_the_margin_is_the_shipped_one_before_a_peak_and_narrows_as_runs_agree(tmp_path):
    space = _space(tmp_path)
    _, trial, pr = _fitting(space)
    model = StudyModel(space, DEFAULT_PARAMS, learns=True)
    assert model.margin == space.search.screen_margin
    line = model.observe(0, trial, "ok", {"step_time_s": pr.step_time_s * 1.5, "peak_memory_gib": pr.peak_memory_gib})
    assert line.startswith("model: step time x1.") and "after 1 runs" in line
    assert MARGIN_FLOOR <= model.margin < space.search.screen_margin
    assert model.predict(trial).step_time_s > 1.3 * pr.step_time_s  # the refit learnt the slower machine


def test_a_twin_study_refits_says_so_and_keeps_the_fit(tmp_path):
    space = _space(tmp_path)
    lines: list[str] = []
    res = study_mod.run_study(
        space, study_mod.Request(out_dir=tmp_path / "out", agent="guided", trials=4, on_model=lines.append)
    )
    launched = [r for r in res.records if r.status in ("ok", "oom")]
    refits = [x for x in lines if x.startswith("model: ")]
    assert len(refits) == len(launched) and f"after {len(launched)} runs" in refits[-1]
    cal = load_calibration(tmp_path / "out" / study_mod.MODEL_FILE, gpu=space.system.gpu)
    assert cal.runs == len(launched) and cal.params
    # the fit is a calibration file a later study takes
    text = TWIN.replace('kind = "sim"', f'kind = "sim"\ncalibration = "{tmp_path / "out" / study_mod.MODEL_FILE}"')
    again = load_space(write_space(tmp_path, text, name="again.toml"))
    assert Screen(again).source == "the space's calibration"


def test_the_exact_truth_teaches_the_model_nothing(tmp_path):
    space = _space(tmp_path, TWIN.replace('truth = "twin"', 'truth = "exact"'))
    lines: list[str] = []
    study_mod.run_study(
        space, study_mod.Request(out_dir=tmp_path / "out", agent="guided", trials=3, on_model=lines.append)
    )
    assert not [x for x in lines if x.startswith("model")]
    assert not (tmp_path / "out" / study_mod.MODEL_FILE).exists()


def test_a_resumed_study_refits_on_its_stored_runs(tmp_path):
    space = _space(tmp_path)
    study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", agent="guided", trials=3))
    lines: list[str] = []
    study_mod.run_study(
        space, study_mod.Request(out_dir=tmp_path / "out", agent="guided", trials=4, resume=True, on_model=lines.append)
    )
    assert lines[0].startswith("model (resumed): ") and "after 3 runs" in lines[0]


def test_one_oom_of_a_larger_micro_batch_refits_the_logits_so_larger_ones_are_predicted_not_to_fit():
    """The real one-H100 grid (Megatron's local attention, Megatron's fp32 loss): mbs 1 ran, mbs 2 without recompute
    ran out of memory. The shipped model already puts the points that ran out near or above the GPU's memory (mbs 2
    without recompute and mbs 4 with full recompute at 95% of 80 GiB or more, mbs 4 with selective above it: the
    local spec's fp32 softmax and its backward, dse.perfmodel.memory). The refit on the two runs moves the bytes
    per logit element (they grow with mbs in every recompute mode), so mbs 2 and mbs 4 without recompute or with
    selective recompute are predicted above the GPU's memory."""
    from pathlib import Path

    from dse.backends.replay import read_table

    space = load_space(Path(__file__).resolve().parent.parent / "bench/data/h100_mcore_grid/replay_space.toml")
    table = read_table(space.backend.replay, varied=space.knob_names, gpu=space.system.gpu)
    model = StudyModel(space, DEFAULT_PARAMS, learns=True)
    for number, point in enumerate(({"mbs": 1, "recompute": "none"}, {"mbs": 2, "recompute": "none"})):
        trial = resolve(space, point)
        got = table.outcome(trial)
        model.observe(
            number, trial, got.status, {"step_time_s": got.step_time_s, "peak_memory_gib": got.peak_memory_gib}
        )
    assert model.params.logits_bytes_native > DEFAULT_PARAMS.logits_bytes_native
    for point in ({"mbs": 2, "recompute": "none"}, {"mbs": 4, "recompute": "full"}):
        assert predict(resolve(space, point)).peak_memory_gib >= 0.95 * 80
    for point in (
        {"mbs": 2, "recompute": "none"},
        {"mbs": 4, "recompute": "none"},
        {"mbs": 4, "recompute": "selective"},
    ):
        assert model.predict(resolve(space, point)).peak_memory_gib > 80


def test_a_warm_start_starts_from_the_old_studys_refit_and_says_so(tmp_path):
    import pandas as pd

    from dse.agents.base import load_agents
    from dse.cli.studies import with_calibration
    from dse.perfmodel.calibrate import calibrated_params
    from tests.helpers import dse

    path = write_space(tmp_path, TWIN)
    old = tmp_path / "old"
    assert dse("run", "--space", path, "--out", old, "--agent", "guided", "--trials", "3").exit_code == 0
    kept = old / study_mod.MODEL_FILE
    r = dse(
        "run", "--space", path, "--out", tmp_path / "new", "--agent", "random", "--trials", "1", "--warm-start", old
    )
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("warm start:"))
    assert f"the model starts from its refit on 3 runs ({kept})" in line
    # the old study's refit keeps the most its model missed a peak by at launch; the new study starts from it
    miss = load_calibration(kept).memory_miss_gib
    assert miss is not None and miss >= 0
    assert load_calibration(tmp_path / "new" / study_mod.MODEL_FILE).memory_miss_gib >= miss
    warm = with_calibration(load_space(path), kept)
    assert study_mod.space_options(warm, "guided", {}, load_agents())["memory_miss"] == miss
    # the first trial launched with the old study's refit model's prediction, not the shipped model's
    first = pd.read_csv(tmp_path / "new" / "leaderboard.csv").sort_values("trial").iloc[0]
    trial = resolve(load_space(path), {k: first[k].item() for k in ("tp", "pp", "vp", "mbs")})
    refit = predict(trial, params=calibrated_params(str(kept))).step_time_s
    assert first["predicted_step_time_s"] == pytest.approx(refit, rel=1e-6)
    assert abs(predict(trial).step_time_s / refit - 1) > 0.01
    # a space that names its own calibration keeps it, and the line says so
    named = write_space(tmp_path, TWIN.replace('kind = "sim"', f'kind = "sim"\ncalibration = "{kept}"'), "named.toml")
    r = dse("run", "--space", named, "--out", tmp_path / "n2", "--trials", "1", "--warm-start", old)
    assert r.exit_code == 0 and "the calibration this study names" in r.stderr, r.output


@pytest.mark.parametrize("how", ["space", "cli"])
def test_with_learning_off_the_predicted_columns_are_the_priors(tmp_path, how):
    """``[search] learn = false`` or ``dse run --no-learn``: a twin study (whose runs would refit the model) keeps
    the model it starts from: every launched trial's predicted figures are the shipped model's, no refit is said or
    kept. The same study learning predicts differently once it has run (so the check can fail)."""
    import pandas as pd

    from tests.helpers import dse

    def predicted(out):
        lb = pd.read_csv(out / "leaderboard.csv")
        lb = lb[lb.status.isin(["ok", "oom"])].sort_values("trial")
        space = load_space(write_space(tmp_path, TWIN, "plain.toml"))
        rows = []
        for _, r in lb.iterrows():
            pr = predict(resolve(space, {k: int(r[k]) for k in ("tp", "pp", "vp", "mbs")}))
            rows.append(
                (r["predicted_step_time_s"], pr.step_time_s, r["predicted_peak_memory_gib"], pr.peak_memory_gib)
            )
        return rows

    text = TWIN.replace("[search]", "[search]\nlearn = false") if how == "space" else TWIN
    path = write_space(tmp_path, text)
    args = ["--no-learn"] if how == "cli" else []
    r = dse("run", "--space", path, "--out", tmp_path / "off", "--agent", "random", "--trials", "6", *args)
    assert r.exit_code == 0, r.output
    assert "model: " not in r.output and not (tmp_path / "off" / study_mod.MODEL_FILE).exists()
    rows = predicted(tmp_path / "off")
    assert len(rows) >= 2
    for st, st_prior, peak, peak_prior in rows:
        assert st == pytest.approx(st_prior, rel=1e-9) and peak == pytest.approx(peak_prior, rel=1e-9)
    on = dse(
        "run",
        "--space",
        write_space(tmp_path, TWIN, "on.toml"),
        "--out",
        tmp_path / "on",
        "--agent",
        "random",
        "--trials",
        "6",
    )
    assert on.exit_code == 0, on.output
    later = predicted(tmp_path / "on")[1:]  # launched after the first refit
    assert any(abs(st / st_prior - 1) > 1e-6 for st, st_prior, _, _ in later)
