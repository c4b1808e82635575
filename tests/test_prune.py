"""Pruning of losing trials (issue 19): the confidence bound, the rule against the study's best, a simulated
study where pruning fires (statuses, rewards, Optuna states), resume, the settings, and the early stop of the
local backend's torchrun path (a real subprocess that writes a log slowly; no GPU)."""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from dse.agents.optuna_agent import OptunaAgent
from dse.backends.local import LocalBackend
from dse.errors import UserError
from dse.execute import run_trial
from dse.logs.parse import ParseContext, RunMetrics, parse_log
from dse.logs.steady import Monitor, Prune, Rule, median_lower_bound
from dse.reward import reward
from dse.rules.space import BackendSettings, EarlyStopSettings, Objective, load_space
from dse.study import loop as study_mod
from tests.helpers import SMALL_SPACE, write_space
from tests.test_early_stop import fake_slurm  # noqa: F401 - the fake sbatch/sacct/scancel fixture
from tests.trials import DATA, system, trial

ROOT = Path(__file__).resolve().parent.parent
REAL_LOG = ROOT / "tests" / "fixtures" / "logs" / "real_h200" / "small_mbs2_s2048_none.log"


# ------------------------------------------------------------------------------------------ the bound
@pytest.mark.parametrize("n", range(1, 40))
def test_the_bound_is_the_largest_order_statistic_with_the_coverage(n):
    k_of = {v: i + 1 for i, v in enumerate(range(n))}
    low = median_lower_bound(list(range(n)))
    cover = lambda k: sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n  # noqa: E731  P(Bin(n,1/2) >= k)
    if low is None:
        assert cover(1) < 0.95 and n < 5
        return
    k = k_of[low]
    assert cover(k) >= 0.95 and (k == n or cover(k + 1) < 0.95)


def test_the_bound_is_below_the_true_median_95_percent_of_the_time_on_skewed_steps():
    rng = random.Random(0)
    true_median = math.log(2)  # of an exponential with mean 1: step times with a long tail of stragglers
    draws = [[rng.expovariate(1.0) for _ in range(12)] for _ in range(4000)]
    covered = statistics.fmean(median_lower_bound(d) <= true_median for d in draws)
    assert 0.95 <= covered <= 0.99  # exact coverage at n = 12 is 98.1 %: conservative, as it must be


def test_prune_compares_the_optimistic_figure_with_the_best_by_the_margin():
    up = Prune(0.1, "tflops_per_gpu", True, lambda: 100.0)
    assert up.loses(89.0, 100.0) and not up.loses(91.0, 100.0)
    down = Prune(0.1, "step_time_s", False, lambda: 10.0)
    assert down.loses(11.5, 10.0) and not down.loses(10.5, 10.0)
    steady = [2.0, 2.1, 2.2, 2.3, 2.4]
    m = RunMetrics("ok", step_time_s=2.2, tflops_per_gpu=440.0)
    assert down.optimistic(m, steady) == 2.0  # the fastest step is the bound at n = 5
    assert up.optimistic(m, steady) == pytest.approx(440.0 * 2.2 / 2.0)
    assert up.optimistic(m, steady[:4]) is None  # too few steps for a 95 % bound


def test_the_pruned_reward_is_its_bound_never_its_estimate():
    m = RunMetrics("pruned", step_time_s=2.2, tflops_per_gpu=440.0, prune_bound=484.0, partial=True)
    assert reward(m, Objective(metric="tflops_per_gpu")) == 484.0
    t = RunMetrics("pruned", step_time_s=2.2, prune_bound=2.0, partial=True)
    assert reward(t, Objective(metric="step_time_s")) == -2.0
    assert reward(RunMetrics("pruned"), Objective(failure_reward=-1.0)) == -1.0  # no bound: a failure's reward


# --------------------------------------------------------------------------- the monitor on a growing log
def test_monitor_asks_the_callable_while_the_run_goes_on(tmp_path):
    lines = REAL_LOG.read_text().splitlines(keepends=True)
    full = parse_log(REAL_LOG).tflops_per_gpu
    best = {"v": None}
    prune = Prune(0.05, "tflops_per_gpu", True, lambda: best["v"])
    mon = Monitor(
        Rule(min_steps=5, window=1000, tolerance=0.01), prune=prune, context=ParseContext()
    )  # never converges
    log = tmp_path / "log.txt"
    with open(log, "w") as fh:
        for i, ln in enumerate(lines):
            fh.write(ln)
            fh.flush()
            if i == len(lines) // 2:
                best["v"] = full * 2  # another trial (or worker) measured twice as much meanwhile
            if mon(log):
                break
    assert mon.decided and mon.outcome == "pruned"
    assert mon.best == full * 2 and mon.bound < full * 2 * 0.95
    assert mon.metrics(ParseContext()).steps < parse_log(REAL_LOG).steps  # stopped before the end


def test_monitor_does_not_prune_a_trial_close_to_the_best(tmp_path):
    full = parse_log(REAL_LOG).tflops_per_gpu
    mon = Monitor(
        Rule(min_steps=5, window=1000, tolerance=0.01),
        prune=Prune(0.05, "tflops_per_gpu", True, lambda: full),
        context=ParseContext(),
    )
    assert not mon(REAL_LOG) and mon.outcome is None


# ------------------------------------------------------------------------------------------ simulated studies
def prune_space(tmp_path, margin=None, name="space.toml", agent="grid"):
    extra = "\n[backend.early_stop]\nenabled = true\n" + (f"prune_margin = {margin}\n" if margin else "")
    text = SMALL_SPACE.replace("max_steps = 20", "max_steps = 100").replace('agent = "grid"', f'agent = "{agent}"')
    return load_space(write_space(tmp_path, text + extra, name=name))


def test_sim_study_prunes_losers_records_them_pruned_and_optuna_prunes_them(tmp_path):
    margin = 0.05
    on = study_mod.run_study(prune_space(tmp_path, margin, "on.toml"), study_mod.Request(out_dir=tmp_path / "on"))
    off = study_mod.run_study(prune_space(tmp_path, None, "off.toml"), study_mod.Request(out_dir=tmp_path / "off"))
    full = {tuple(r.knobs.values()): r for r in off.records}
    pruned = [r for r in on.records if r.status == "pruned"]
    ok = [r for r in on.records if r.ok]
    assert pruned and ok
    best_ok = max(r.metrics["tflops_per_gpu"] for r in ok)
    for r in pruned:
        m = r.metrics
        assert m["partial"] and not m["early_stopped"] and m["steps"] < 100
        assert r.reward == m["prune_bound"] < m["prune_best"] * (1 - margin)  # the bound, lost by the margin
        assert m["prune_best"] <= best_ok
        assert m["gpu_hours_saved"] == pytest.approx(r.num_gpus * (100 - m["steps"]) * m["step_time_s"] / 3600)
        assert (Path(r.run_dir) / "log.txt").read_text().count("Training epoch") == m["steps"]
        # run to its end, it would indeed have lost: pruning never removed a layout that wins
        assert full[tuple(r.knobs.values())].metrics["tflops_per_gpu"] < m["prune_best"]
        assert r.gpu_hours < full[tuple(r.knobs.values())].gpu_hours
    best = lambda res: max((r for r in res.records if r.ok), key=lambda r: r.reward).knobs  # noqa: E731
    assert best(on) == best(off)
    # Optuna's record: PRUNED for pruned, COMPLETE for ok; the pruned ones carry no value
    from dse.results.export import to_optuna

    to_optuna(tmp_path / "on", f"sqlite:///{tmp_path / 'optuna.db'}")
    st = optuna.load_study(study_name="small", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    states = {t.number: t.state for t in st.trials}
    assert {states[r.number] for r in pruned} == {TrialState.PRUNED}
    assert {states[r.number] for r in ok} == {TrialState.COMPLETE}
    assert all(st.trials[r.number].value is None for r in pruned)
    # the leaderboard: pruned after the ok trials, metrics empty, the savings counted
    lb = pd.read_csv(on.leaderboard)
    assert list(lb.status[: len(ok)]) == ["ok"] * len(ok) and lb.status.iloc[len(ok)] == "pruned"
    assert lb[lb.status == "pruned"].tflops_per_gpu.isna().all()
    assert (lb[lb.status == "pruned"].steps < 100).all()
    total = sum(r.metrics.get("gpu_hours_saved") or 0 for r in ok + pruned)
    assert lb.gpu_hours_saved.sum() == pytest.approx(total)


def test_summary_and_report_show_pruned_trials_and_the_savings(tmp_path):
    from rich.console import Console

    from dse.cli.render import print_summary
    from dse.results.report import render
    from dse.study.leaderboard import savings_line

    res = study_mod.run_study(prune_space(tmp_path, 0.05), study_mod.Request(out_dir=tmp_path / "out"))
    n_pruned = sum(r.status == "pruned" for r in res.records)
    n_early = sum(bool(r.metrics.get("early_stopped")) for r in res.records)
    line = savings_line(res.records)
    assert f"early stop: {n_early} trials, {n_pruned} pruned," in line and "GPU-hours saved" in line
    console = Console(width=80, record=True, force_terminal=False)
    print_summary(res.records, ["tp", "pp", "vp", "mbs"], top=40, objective="tflops_per_gpu", out=console)
    text = console.export_text()
    assert all(len(ln) <= 80 for ln in text.splitlines())
    assert f"pruned {n_pruned}" in text and line.lstrip("; ") in " ".join(text.split())
    assert "prune_margin" in text  # the reason's short form: the setting that stopped the trial
    page = render(res.records, study_mod.read_meta(tmp_path / "out"))
    assert "pruned (bound)" in page and line.lstrip("; ") in page
    failures = page.split("<h2>Failures by class</h2>")[1].split("<h2>")[0]
    assert ">pruned<" not in failures  # a pruned trial is no failure


def test_resume_keeps_early_stopped_and_pruned_trials(tmp_path):
    space = prune_space(tmp_path, 0.02, agent="optuna")
    out = tmp_path / "out"
    first = study_mod.run_study(space, study_mod.Request(out_dir=out, trials=8, seed=3))
    res = study_mod.run_study(space, study_mod.Request(out_dir=out, trials=24, seed=3, resume=True))
    n = len(first.records)
    assert res.records[:n] == first.records
    for status in ("pruned",):
        assert any(r.status == status for r in res.records[:n]) and any(r.status == status for r in res.records[n:])
    assert any(r.metrics.get("early_stopped") for r in res.records[:n])
    assert any(r.metrics.get("early_stopped") for r in res.records[n:])
    # after resume the pruning compares with the best of the whole study, old trials included
    best_before = max(r.metrics["tflops_per_gpu"] for r in first.records if r.ok)
    for r in res.records[n:]:
        if r.status == "pruned":
            assert r.metrics["prune_best"] >= best_before
    # the agent replays the pruned trials as PRUNED with their bound, not as failures without one
    agent = OptunaAgent(study_mod.RecipeEnv(space, None, out).action_space, seed=0)
    env = study_mod.RecipeEnv(space, None, out)
    agent.warm_start((env.encode(r.knobs), r.reward, r.ok, r.status, r.metrics) for r in res.records)
    pruned = [t for t in agent.study.trials if t.state == TrialState.PRUNED and t.intermediate_values]
    assert len(pruned) == sum(r.status == "pruned" for r in res.records)


# ------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    "lines, allowed",
    [
        ("enabled = true\nprune_margin = 0", "greater than 0"),
        ("enabled = true\nprune_margin = -0.1", "greater than 0"),
        ('enabled = true\nprune_margin = "ten per cent"', "number"),
        ("enabled = true\nprune_margin = 11", "less than or equal to 10"),
        ("prune_margin = 0.1", "enabled = true"),
    ],
)
def test_bad_prune_margin_is_one_line_naming_the_field(tmp_path, lines, allowed):
    path = write_space(tmp_path, SMALL_SPACE + f"\n[backend.early_stop]\n{lines}\n")
    with pytest.raises(UserError) as e:
        load_space(path)
    assert "\n" not in str(e.value) and e.value.field == "backend.early_stop.prune_margin", str(e.value)
    assert allowed in str(e.value) and str(path) in str(e.value)


# ------------------------------------------------------------------------- the local backend's torchrun path
# stand-in for torchrun: copies a real Megatron-LM log line by line, slowly, and keeps a child of its own
# running (as torchrun keeps its ranks), whose pid it writes down; it would take 40 s to end by itself
FAKE_TORCHRUN = """#!/bin/bash
sleep 300 & echo $! > "$FAKE_CHILD"
while IFS= read -r line; do echo "$line"; case "$line" in *iteration*) sleep 0.15;; esac; done < "$FAKE_LOG"
sleep 40
"""


def test_local_torchrun_run_is_stopped_by_sigterm_to_its_process_group(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(REAL_LOG))
    monkeypatch.setenv("FAKE_CHILD", str(tmp_path / "child.pid"))
    t = trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml"),
        num_nodes=1,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=20,
    )
    settings = BackendSettings(kind="local", payload="nemo2", early_stop=EarlyStopSettings(enabled=True, poll_s=0.1))
    t0 = time.monotonic()
    m = run_trial(t, tmp_path / "run", LocalBackend(), settings)
    assert time.monotonic() - t0 < 20
    assert m.status == "ok" and m.early_stopped and m.steps < parse_log(REAL_LOG).steps, m
    assert "torchrun --nnodes 1" in (tmp_path / "run" / "launch.sh").read_text()
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)  # the whole process group got the signal, not only torchrun
    assert abs(m.step_time_s / parse_log(REAL_LOG).step_time_s - 1) < 0.01


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped by init) is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------- Slurm, with fake commands
def test_slurm_job_that_loses_is_scancelled_and_recorded_pruned(fake_slurm, monkeypatch):  # noqa: F811 - the fixture
    from dse.backends.slurm import SlurmBackend

    tmp_path = fake_slurm
    monkeypatch.setenv("FAKE_LOG", str(REAL_LOG))
    t = trial(
        "llama3_70b_16l",
        sys=system(DATA / "systems" / "local_slurm.toml"),
        num_nodes=1,
        tp=1,
        pp=1,
        cp=1,
        vp=1,
        gbs=4,
        max_steps=20,
    )
    # a window longer than the log: the convergence rule cannot hold, only the pruning can stop it
    es = EarlyStopSettings(enabled=True, poll_s=0.01, window=100, prune_margin=0.1)
    settings = BackendSettings(kind="slurm", payload="sim", early_stop=es)
    full = parse_log(REAL_LOG)
    asked = []

    def best():
        asked.append(1)
        return full.tflops_per_gpu * 1.5

    m = run_trial(
        t,
        tmp_path / "run",
        SlurmBackend(poll_s=0.01, settle_s=1),
        settings,
        objective=Objective(metric="tflops_per_gpu"),
        best=best,
    )
    assert (tmp_path / "scancel.calls").read_text().split() == ["4242"]
    assert m.status == "pruned" and not m.early_stopped and m.partial and asked, m
    assert m.prune_best == full.tflops_per_gpu * 1.5 and m.prune_bound < m.prune_best * 0.9
    assert m.reason.startswith("prune_margin: after ")
    assert m.step_time_s == full.step_time_s  # the whole log was there at the first look


def test_the_environment_alone_prunes_against_the_best_of_its_own_steps(tmp_path):
    from dse.backends.sim import SimBackend
    from dse.envs.recipe_env import RecipeEnv

    space = prune_space(tmp_path, 0.05)
    env = RecipeEnv(space, SimBackend.from_space(space), tmp_path / "out")
    env.reset(seed=0)
    best, seen_pruned = None, 0
    for tp in range(4):
        for pp in range(3):
            _, r, _, _, info = env.step({"tp": tp, "pp": pp, "vp": 0, "mbs": 1})
            if info["status"] == "pruned":
                seen_pruned += 1
                assert info["metrics"]["prune_best"] == best and r == info["metrics"]["prune_bound"]
            elif info["status"] == "ok":
                best = max(best or 0.0, info["metrics"]["tflops_per_gpu"])
    assert seen_pruned
