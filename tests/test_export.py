"""`dse export optuna`: a study written into an Optuna storage through Optuna's public API, read back by
optuna-dashboard's own WSGI app (called in-process: no server, no browser)."""

from __future__ import annotations

import json
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
from typer.testing import CliRunner

from dse.cli import app
from dse.rules.space import load_space
from dse.study.loop import Request, run_study
from tests.helpers import write_space

runner = CliRunner()


def _get(wsgi_app, path: str) -> dict:
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update(REQUEST_METHOD="GET", PATH_INFO=path, QUERY_STRING="")
    status: list[str] = []
    body = b"".join(wsgi_app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), (status, body[:500])
    return json.loads(body)


@pytest.mark.parametrize("target", ["sqlite", "journal"])
def test_an_exported_study_opens_in_optuna_dashboard(tmp_path, target):
    import optuna_dashboard

    space = load_space(write_space(tmp_path))
    out = tmp_path / "out"
    res = run_study(space, Request(out_dir=out, agent="random", trials=4, seed=2))
    recs = res.records
    assert {r.status for r in recs} >= {"ok"} and any(not r.ok for r in recs)
    url = f"sqlite:///{tmp_path / 'optuna.db'}" if target == "sqlite" else str(tmp_path / "optuna.log")
    r = runner.invoke(app, ["export", "optuna", str(out), "--storage", url])
    assert r.exit_code == 0, r.output
    assert f"wrote study 'small' ({len(recs)} trials)" in r.output
    if target == "journal":
        from optuna.storages.journal import JournalFileBackend

        storage = optuna.storages.JournalStorage(JournalFileBackend(url))
    else:
        storage = optuna.storages.RDBStorage(url)
    try:
        dashboard = optuna_dashboard.wsgi(storage)
        studies = _get(dashboard, "/api/studies")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["small"]
        detail = _get(dashboard, f"/api/studies/{studies[0]['study_id']}")
    finally:
        if isinstance(storage, optuna.storages.RDBStorage):
            storage.remove_session()
            storage.engine.dispose()
    assert detail["objective_names"] == ["tflops_per_gpu"]  # the dashboard labels the value by the objective
    trials = detail["trials"]
    assert [t["number"] for t in trials] == [r.number for r in recs]
    for t, rec in zip(trials, recs):
        assert t["state"] == ("Complete" if rec.ok else "Fail")  # a failure is FAIL, never a sentinel value
        assert {p["name"]: p["param_external_value"] for p in t["params"]} == {k: str(v) for k, v in rec.knobs.items()}
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        assert attrs["status"] == rec.status and ("reason" in attrs) == (rec.reason is not None)
        if rec.ok:
            assert t["values"] == [rec.reward] and "tflops_per_gpu" in attrs["metrics"]
    best = max((r for r in recs if r.ok), key=lambda r: r.reward)
    assert detail["best_trials"][0]["number"] == best.number
    again = runner.invoke(app, ["export", "optuna", str(out), "--storage", url])
    assert again.exit_code == 2 and "already holds a study 'small'" in again.output


def test_export_refuses_a_bad_storage_in_one_line(tmp_path):
    space = load_space(write_space(tmp_path))
    run_study(space, Request(out_dir=tmp_path / "out", agent="random", trials=1))
    r = runner.invoke(app, ["export", "optuna", str(tmp_path / "out"), "--storage", "nosuch://x"])
    assert r.exit_code == 2 and "--storage" in r.output and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(app, ["export", "optuna", str(tmp_path / "nothere"), "--storage", "x.log"])
    assert r.exit_code == 2 and "not a dse output directory" in r.output


def test_a_minimised_objective_is_named_as_the_negated_metric(tmp_path):
    """The exported value is the reward (higher is better), so a step_time_s study's is named for what it is."""
    text = (write_space(tmp_path).read_text()).replace('metric = "tflops_per_gpu"', 'metric = "step_time_s"')
    space = load_space(write_space(tmp_path, text))
    out = tmp_path / "out"
    run_study(space, Request(out_dir=out, agent="random", trials=2, seed=2))
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert runner.invoke(app, ["export", "optuna", str(out), "--storage", url]).exit_code == 0
    storage = optuna.storages.RDBStorage(url)
    try:
        assert optuna.load_study(study_name="small", storage=storage).metric_names == ["reward = -step_time_s"]
    finally:
        storage.remove_session()
        storage.engine.dispose()
