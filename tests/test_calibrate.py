"""dse calibrate: the calibration file, the refusals, and recovery of known parameters from synthetic runs.

The synthetic runs are the model's own predictions with altered parameters (``Params.with_values``) on the
layouts of the real H200 runs; the search issue's twin (dse/perfmodel/twin.py) is written concurrently, so
these tests generate their own "known machine" the same way a twin would.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.errors import UserError
from dse.perfmodel import DEFAULT_PARAMS, predict
from dse.perfmodel.calibrate import (
    CALIBRATION_PRIORS,
    Calibration,
    apply,
    calibrate,
    dumps,
    load_calibration,
    loads,
    runs_from_tsv,
)

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "bench" / "data" / "h200_real_runs.tsv"
runner = CliRunner()

KNOWN = {"elementwise_scale": 4.0, "unfused_scores_scale": 3.0, "gemm_eff_bf16": 0.62, "memory_offset_gib": -2.0}


def _rows() -> list[dict]:
    with open(REAL, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _write(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]), delimiter="\t", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def synthetic_tsv(path: Path, known: dict, n: int | None = None, gpu: str | None = None) -> Path:
    """The real runs' layouts with the step time and memory the model predicts under ``known`` parameters, as
    NVIDIA's recipes would run them (payload nemo2: fused loss and gradient accumulation, whose terms do not blur
    elementwise_scale against gemm_eff_bf16 as recipes.mcore's memory-bound native loss does on these layouts; and
    Transformer Engine's unfused attention, whose fused softmax kernel unfused_scores_scale prices apart from the
    element-wise kernels, where the local spec's step-by-step softmax is element-wise kernels of its own)."""
    from dataclasses import replace
    from types import MappingProxyType

    truth = DEFAULT_PARAMS.with_values(**known)
    runs, _ = runs_from_tsv(REAL, "h200")
    rows = []
    for row, run in list(zip(_rows(), runs))[:n]:
        values = MappingProxyType({**run.trial.values, "attention_backend": "unfused"})
        p = predict(replace(run.trial, payload="nemo2", values=values), params=truth)
        rows.append(
            {
                **row,
                "step_time_ms": p.step_time_s * 1e3,
                "peak_allocated_gib": p.peak_memory_gib,
                "payload": "nemo2",
                "attention_backend": "unfused",
                **({"gpu": gpu} if gpu else {}),
            }
        )
    return _write(path, rows)


def test_recovers_known_parameters_from_synthetic_runs(tmp_path):
    src = synthetic_tsv(tmp_path / "runs.tsv", KNOWN)
    cal, report = calibrate([src], gpu="h200", params=list(KNOWN), loo=False)
    for name, value in KNOWN.items():
        got = cal.params[name]
        prior = CALIBRATION_PRIORS[name]
        # within a tenth of the prior's width (in its own scale) of the truth; the prior is far wider
        assert abs(prior.to_z(got) - prior.to_z(value)) < 0.1 * prior.width, (name, got, value)
    assert cal.fit["after"]["step_time_mape"] < 1.0 < cal.fit["before"]["step_time_mape"]
    assert all(r["moved"] for r in report)


def test_unaltered_runs_leave_the_shipped_values(tmp_path):
    src = synthetic_tsv(tmp_path / "runs.tsv", {})
    cal, report = calibrate([src], gpu="h200", params=list(KNOWN), loo=False)
    assert not any(r["moved"] for r in report), report


def test_calibration_file_round_trip(tmp_path):
    src = synthetic_tsv(tmp_path / "runs.tsv", KNOWN, n=6)
    cal, _ = calibrate([src], gpu="h200")
    back = loads(dumps(cal))
    assert back.params == cal.params and back.gpu == "h200" and back.sources == [str(src)] and back.runs == 6
    assert apply(back) == apply(cal) != DEFAULT_PARAMS
    doc = __import__("tomllib").loads(dumps(cal))
    assert doc["provenance"]["fit_after_step_time_mape"] == pytest.approx(cal.fit["after"]["step_time_mape"], abs=1e-3)
    assert "leave_one_out_step_time_mape" in doc["provenance"]


def test_hostile_strings_in_a_calibration_file_round_trip_and_add_no_key(tmp_path):
    """A source path or date with a newline, quotes or TOML syntax stays one value (tomlkit escapes it)."""
    import tomllib

    from dse.facts.calibration_file import write

    hostile = 'runs"\n[params]\nelementwise_scale = 99.0\n# \\'
    cal = Calibration(
        gpu="h200",
        params={"elementwise_scale": 2.0},
        sources=[hostile, "b.tsv"],
        runs=3,
        date='2026\ngpu = "b200"',
        fit={"after": {"step_time_mape": 1.5}},
        loo=None,
    )
    path = write(cal, tmp_path / "cal.toml")
    doc = tomllib.loads(path.read_text())
    assert doc["params"] == {"elementwise_scale": 2.0}
    assert set(doc["provenance"]) == {"gpu", "sources", "date", "runs", "fit_after_step_time_mape"}
    back = load_calibration(path, gpu="h200")
    assert back.sources == [hostile, "b.tsv"] and back.date == cal.date and back.params == cal.params
    assert path.read_text().startswith("# dse calibration:")
    assert [p.name for p in tmp_path.iterdir()] == ["cal.toml"]


def _cli(*args):
    r = runner.invoke(app, list(map(str, args)))
    return r.exit_code, r.output + (r.stderr if r.stderr_bytes is not None else "")


def test_cli_writes_the_file_and_predict_uses_it(tmp_path):
    src = synthetic_tsv(tmp_path / "runs.tsv", KNOWN)
    out = tmp_path / "cal.toml"
    code, text = _cli("calibrate", src, "--gpu", "h200", "--out", out, "--json")
    assert code == 0, text
    rep = json.loads(text)
    assert {r["name"] for r in rep["params"]} >= {"elementwise_scale", "unfused_scores_scale"}
    assert rep["leave_one_out"]["step_time_mape"] < 5.0
    base = [
        "predict",
        "--model",
        "llama3_8b_4l",
        "--gpu",
        "h200",
        "--gpus-per-node",
        "1",
        "--num-gpus",
        "1",
        "--set",
        "attention_backend=unfused",
        "--mbs",
        "1",
        "--gbs",
        "8",
        "--seq-length",
        "2048",
        "--tp",
        "1",
        "--recompute",
        "none",
        "--payload",
        "nemo2",
        "--json",
    ]  # as synthetic_tsv's rows ran
    code0, shipped = _cli(*base)
    code1, calibrated = _cli(*base, "--calibration", out)
    assert code0 == code1 == 0, calibrated
    s0, s1 = json.loads(shipped)["step_time_s"], json.loads(calibrated)["step_time_s"]
    with open(src, newline="") as fh:  # the known machine's step time for this layout
        truth = next(
            float(r["step_time_ms"]) / 1e3
            for r in csv.DictReader(fh, delimiter="\t")
            if r["name"] == "llama8b4l_mbs1_s2048_none"
        )
    assert abs(s1 - truth) / truth < 0.02 < abs(s0 - truth) / truth
    assert json.loads(calibrated)["calibration"] == str(out)


@pytest.mark.parametrize("case", ["no_runs", "other_gpu", "too_many_params", "unknown_param", "no_gpu", "missing"])
def test_refusals(tmp_path, case):
    rows = _rows()
    out = tmp_path / "cal.toml"
    args: list = []
    if case == "no_runs":
        src = _write(tmp_path / "r.tsv", [{**r, "step_time_ms": ""} for r in rows])
        args, want = [src, "--gpu", "h200"], "no usable runs"
    elif case == "other_gpu":
        src = _write(tmp_path / "r.tsv", [{**r, "gpu": "h100"} for r in rows])
        args, want = [src, "--gpu", "h200"], "not h200"
    elif case == "too_many_params":
        src = _write(tmp_path / "r.tsv", rows[:2])
        args, want = [src, "--gpu", "h200", "--params", "elementwise_scale,gemm_eff_bf16,layer_overhead_s"], "at most"
    elif case == "unknown_param":
        args, want = [REAL, "--gpu", "h200", "--params", "warp_speed"], "unknown parameter"
    elif case == "no_gpu":
        args, want = [REAL], "--gpu"
    else:
        args, want = [tmp_path / "nowhere"], "no such file"
    code, text = _cli("calibrate", *args, "--out", out)
    assert code == 2, text
    assert want in text and "Traceback" not in text
    assert not out.exists()


def test_several_gpus_refused(tmp_path):
    rows = _rows()
    src = _write(tmp_path / "r.tsv", [{**r, "gpu": "h200" if i % 2 else "h100"} for i, r in enumerate(rows)])
    with pytest.raises(UserError, match="several GPUs"):
        calibrate([src], loo=False)


def test_calibration_file_refusals(tmp_path):
    good = dumps(Calibration(gpu="h200", params={"elementwise_scale": 2.0}, sources=["x"], runs=3))
    p = tmp_path / "c.toml"
    p.write_text(good)
    with pytest.raises(UserError, match="not on h100"):
        load_calibration(p, gpu="h100")
    p.write_text(good.replace("elementwise_scale", "warp_speed"))
    with pytest.raises(UserError, match="params.warp_speed"):
        load_calibration(p)
    p.write_text(good.replace("2.0", '"fast"'))
    with pytest.raises(UserError, match="not a number"):
        load_calibration(p)
    p.write_text("[params\n")
    with pytest.raises(UserError, match="malformed TOML"):
        load_calibration(p)


def test_local_study_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the study names its space file relative to where it ran
    out = tmp_path / "cal.toml"
    code, text = _cli("calibrate", "bench/data/h200_local_study", "--out", out, "--json")
    assert code == 0, text
    rep = json.loads(text)
    assert rep["runs"] == 6 and rep["gpu"] == "h200"
    assert rep["fit"]["after"]["step_time_mape"] < rep["fit"]["before"]["step_time_mape"]
    assert load_calibration(out, gpu="h200").runs == 6


def test_a_study_of_a_shipped_space_calibrates_from_any_directory(tmp_path, monkeypatch):
    """``dse run --space conf/spaces/NAME.toml`` runs a shipped space from any directory; ``dse calibrate`` of
    that study finds the same shipped space when no such file is in the working directory or the study."""
    monkeypatch.chdir(tmp_path)
    assert not (tmp_path / "conf").exists()
    code, text = _cli("calibrate", ROOT / "bench/data/h200_local_study", "--out", tmp_path / "cal.toml", "--json")
    assert code == 0, text
    assert json.loads(text)["runs"] == 6


def test_space_calibration_for_the_sim_backend(tmp_path):
    from dse.rules.space import load_space

    cal = tmp_path / "cal.toml"
    cal.write_text(dumps(Calibration(gpu="h200", params={"elementwise_scale": 3.0}, sources=["x"], runs=3)))
    text = (ROOT / "conf/spaces/llama3_8b_4l_h200_local_space.toml").read_text()
    text = text.replace('kind = "local"', 'kind = "sim"\ncalibration = "cal.toml"').replace('"mcore"', '"nemo2"')
    space_p = tmp_path / "space.toml"
    space_p.write_text(text)
    sp = load_space(space_p)
    assert Path(sp.backend.calibration) == cal  # relative to the space file
    from dse.launch import build_plan
    from dse.perfmodel.calibrate import calibrated_params
    from dse.rules.trial import resolve

    trial = resolve(sp, {"mbs": 1, "recompute": "none"})
    plan = build_plan(trial, simulated=True, params=calibrated_params(sp.backend.calibration))
    assert plan.sim_run.step_time_s == pytest.approx(
        predict(trial, params=DEFAULT_PARAMS.with_values(elementwise_scale=3.0)).step_time_s
    )
    assert plan.sim_run.step_time_s > predict(trial).step_time_s
    cal.write_text(cal.read_text().replace('"h200"', '"b200"'))
    with pytest.raises(UserError, match="backend.calibration"):
        load_space(space_p)


def test_the_guided_agents_forecast_starts_from_the_spaces_calibration(tmp_path):
    """A space naming a calibration: the model-guided agent is told the calibrated model, not the shipped one."""
    from dse.forecast import model_forecaster
    from dse.rules.space import load_space
    from dse.rules.trial import resolve

    cal = tmp_path / "cal.toml"
    cal.write_text(dumps(Calibration(gpu="h200", params={"elementwise_scale": 3.0}, sources=["x"], runs=3)))
    text = (ROOT / "conf/spaces/llama3_8b_4l_h200_local_space.toml").read_text()
    plain_p, cal_p = tmp_path / "plain.toml", tmp_path / "cal_space.toml"
    plain_p.write_text(text)
    cal_p.write_text(text.replace('kind = "local"', 'kind = "local"\ncalibration = "cal.toml"'))
    plain, calibrated = load_space(plain_p), load_space(cal_p)
    point = {k: v[0] for k, v in plain.knobs.items()}
    action = {k: 0 for k in plain.knobs}
    trial = resolve(plain, point)
    metric = plain.objective.metric
    expected = getattr(predict(trial, params=DEFAULT_PARAMS.with_values(elementwise_scale=3.0)), metric)
    shipped = getattr(predict(trial), metric)
    sign = 1 if plain.objective.sense == "maximize" else -1
    assert model_forecaster(calibrated)(action).reward == pytest.approx(sign * expected)
    assert model_forecaster(plain)(action).reward == pytest.approx(sign * shipped) != pytest.approx(sign * expected)


@pytest.mark.parametrize("host", [0.006, 0.02])
def test_a_grace_hosts_time_per_layer_is_learnt_from_gb200_runs(tmp_path, host):
    """The real runs' small layouts on GB200 (layers of a few ms: host-bound there) with another host time per
    layer than the shipped one: dse calibrate picks host_layer_s_grace by itself and finds the runs' value; on
    the H200 (an x86 host) the parameter moves nothing and is not picked."""
    from dse.perfmodel.calibrate import STACK_TIME, identifiable

    rows = [{**r, "gpu": "gb200", "payload": "nemo2"} for r in _rows()]
    runs, _ = runs_from_tsv(_write(tmp_path / "layouts.tsv", rows), "gb200")
    truth = DEFAULT_PARAMS.with_values(host_layer_s_grace=host)
    measured = [
        {
            **row,
            "step_time_ms": predict(run.trial, params=truth).step_time_s * 1e3,
            "peak_allocated_gib": predict(run.trial, params=truth).peak_memory_gib,
        }
        for row, run in zip(rows, runs)
    ]
    cal, _ = calibrate([_write(tmp_path / "runs.tsv", measured)], gpu="gb200", loo=False)
    assert cal.params["host_layer_s_grace"] == pytest.approx(host, rel=0.02)
    assert cal.fit["after"]["step_time_mape"] < 0.5 < cal.fit["before"]["step_time_mape"]
    h200, _ = runs_from_tsv(REAL, "h200")
    assert "host_layer_s_grace" not in identifiable(h200, STACK_TIME)


def test_the_prepared_runs_give_predicts_figures_under_any_parameters():
    """A fit evaluates each run prepared once (dse.perfmodel.model.prepare): its step time and peak memory must be
    predict's under the parameters the fit tries, not the ones it was prepared under."""
    from dse.perfmodel.model import prepare

    runs, _ = runs_from_tsv(REAL, "h200")
    moved = DEFAULT_PARAMS.with_values(
        **KNOWN, memory_fragmentation=0.2, logits_bytes_native=9.0, layer_overhead_s=2e-4, step_overhead_s=0.05
    )
    for run in runs:
        prepared = prepare(run.trial)
        for P in (DEFAULT_PARAMS, moved):
            full = predict(run.trial, params=P)
            assert prepared.step_time_s(P) == full.step_time_s
            assert prepared.peak_memory_gib(P) == full.peak_memory_gib
    assert prepare(runs[0].trial).step_time_s(moved) != prepare(runs[0].trial).step_time_s(DEFAULT_PARAMS)


def test_a_leave_one_out_refit_from_the_full_fit_lands_where_a_fit_from_scratch_does(tmp_path):
    """Leave-one-out refits start at the full fit's values with fewer evaluations: the left-out run's predicted step
    time must match that of the full MAP fit on the other runs (the refit the old leave-one-out ran)."""
    from dse.perfmodel.calibrate import (
        _loo_fit,
        _Memo,
        _z_space,
        choose_params,
        fit_runs,
        load_runs,
        memory_loss,
        time_loss,
    )

    runs, _ = load_runs([synthetic_tsv(tmp_path / "runs.tsv", KNOWN)], "h200")
    t_names, m_names = choose_params(runs, None)
    full = fit_runs(runs, t_names, m_names)
    t_loss, m_loss = time_loss(runs), memory_loss(runs)
    memos = (
        (t_loss, _Memo(t_loss, _z_space(t_names, DEFAULT_PARAMS)[3])),
        (m_loss, _Memo(m_loss, _z_space(m_names, full)[3])),
    )
    for i in (0, len(runs) // 2):
        rest = [r for j, r in enumerate(runs) if j != i]
        scratch = predict(runs[i].trial, params=fit_runs(rest, t_names, m_names))
        warm = predict(runs[i].trial, params=_loo_fit(runs, i, t_names, m_names, DEFAULT_PARAMS, full, memos))
        assert warm.step_time_s == pytest.approx(scratch.step_time_s, rel=0.005)
        assert warm.peak_memory_gib == pytest.approx(scratch.peak_memory_gib, rel=0.005)


def test_calibrate_reports_its_progress_fit_then_each_refit(tmp_path):
    src = synthetic_tsv(tmp_path / "runs.tsv", KNOWN, n=5)
    seen: list[tuple[int, int]] = []
    calibrate([src], gpu="h200", progress=lambda done, total: seen.append((done, total)))
    assert seen == [(k, 6) for k in range(1, 7)]  # the fit, then one refit per run with a step time
    seen.clear()
    calibrate([src], gpu="h200", loo=False, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 1)]
    seen.clear()  # one run: no leave-one-out, so the fit is all there is to count
    one = synthetic_tsv(tmp_path / "one.tsv", {"elementwise_scale": 3.0}, n=1)  # what one run's one parameter can say
    calibrate([one], gpu="h200", progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 1)]


def test_cli_prints_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    src = synthetic_tsv(tmp_path / "runs.tsv", KNOWN, n=4)
    res = runner.invoke(app, ["calibrate", str(src), "--gpu", "h200", "--out", str(tmp_path / "c.toml")])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    assert "leave-one-out" in res.stdout


MOE_RUNS = ROOT / "bench" / "data" / "moe_gpu_runs.tsv"


def _moe_rows(ep: int) -> list[dict]:
    """The small MoE's TE-spec runs with grouped GEMMs (16 experts, top-2), laid out on 8 GPUs of one node at
    expert parallelism ``ep`` (the global batch grown with the data-parallel ranks)."""
    with open(MOE_RUNS, newline="") as fh:
        rows = [
            r
            for r in csv.DictReader(fh, delimiter="\t")
            if r["layer_spec"] == "te" and r["num_experts"] == "16" and r["moe_grouped_gemm"] == "True"
        ]
    return [{**r, "gpu": "h200", "num_gpus": 8, "ep": ep, "gbs": 8 * int(r["gbs"])} for r in rows]


@pytest.mark.parametrize("truth", [1.5, 2.2])
def test_a_real_routers_imbalance_is_learnt_from_moe_runs(tmp_path, truth):
    """MoE runs on 8 GPUs at ep=8, measured (made up) under a router whose busiest rank takes ``truth`` times the
    mean token copies: dse calibrate picks moe_imbalance by itself and finds it; the calibrated file carries it and
    predict uses it. Without expert parallelism the imbalance moves nothing (one rank holds every copy), so it is
    not picked."""
    from dse.perfmodel.calibrate import STACK_TIME, identifiable

    rows = _moe_rows(ep=8)
    runs, _ = runs_from_tsv(_write(tmp_path / "layouts.tsv", rows), "h200")
    assert all(r.trial.values["ep"] == 8 and r.trial.recipe.arch.num_experts == 16 for r in runs)
    P = DEFAULT_PARAMS.with_values(moe_imbalance=truth)
    measured = [
        {**row, "step_time_ms": predict(run.trial, params=P).step_time_s * 1e3, "peak_allocated_gib": ""}
        for row, run in zip(rows, runs)
    ]
    assert "moe_imbalance" in identifiable(runs, STACK_TIME)
    cal, report = calibrate([_write(tmp_path / "runs.tsv", measured)], gpu="h200", params=["moe_imbalance"], loo=False)
    assert cal.params["moe_imbalance"] == pytest.approx(truth, rel=0.02)
    assert cal.fit["after"]["step_time_mape"] < 0.5 < cal.fit["before"]["step_time_mape"]
    assert report[0]["moved"]
    assert apply(loads(dumps(cal))).moe_imbalance == pytest.approx(truth, rel=0.02)

    one_rank, _ = runs_from_tsv(_write(tmp_path / "ep1.tsv", _moe_rows(ep=1)), "h200")
    assert "moe_imbalance" not in identifiable(one_rank, STACK_TIME)


def test_a_balanced_moe_run_keeps_the_imbalance_at_one(tmp_path):
    """Runs that match the shipped, balanced model leave moe_imbalance at 1: the prior holds it there and the fit
    never goes below it."""
    rows = _moe_rows(ep=8)
    runs, _ = runs_from_tsv(_write(tmp_path / "layouts.tsv", rows), "h200")
    measured = [
        {**row, "step_time_ms": predict(run.trial).step_time_s * 1e3 * 0.97, "peak_allocated_gib": ""}
        for row, run in zip(rows, runs)
    ]  # 3% faster than the balanced model: an imbalance below 1 would fit it, and is not allowed
    cal, _ = calibrate([_write(tmp_path / "runs.tsv", measured)], gpu="h200", params=["moe_imbalance"], loo=False)
    assert cal.params["moe_imbalance"] == 1.0


def test_a_tsv_may_name_its_gpu_as_the_device_does(tmp_path):
    """The gpu column may hold the device's name as torch prints it (bench/data/moe_gpu_runs.tsv): it is read as
    dse's GPU, and a mismatch with --gpu is still refused. The longest name wins (a GB300 is not a B300); a device
    of no row is not guessed."""
    from dse.facts.hardware import gpu_from_device_name

    assert gpu_from_device_name("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_from_device_name("NVIDIA GB300") == "gb300" and gpu_from_device_name("NVIDIA B300 SXM6") == "b300"
    assert gpu_from_device_name("b200") == "b200" and gpu_from_device_name("NVIDIA L40S") is None
    rows = [{**r, "gpu": "NVIDIA H200"} for r in _moe_rows(ep=8)]
    src = _write(tmp_path / "runs.tsv", rows)
    runs, gpu = runs_from_tsv(src, "h200")
    assert gpu == "h200" and len(runs) == len(rows) and runs[0].trial.system.gpu == "h200"
    with pytest.raises(UserError, match="not h100 as --gpu says"):
        runs_from_tsv(src, "h100")
