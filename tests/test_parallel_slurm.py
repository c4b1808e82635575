"""``--parallel 2`` on the real local Slurm cluster (.ci/slurm/up.sh): two 1-node trials run side by side."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest

from dse.rules.space import load_space
from dse.study import loop as study_mod
from tests.helpers import write_space

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

ONE_NODE = """
name = "par_slurm"
recipe = "llama3_8b"
system = { gpu = "gb300", gpus_per_node = 1, nvlink_domain = 72, slurm = { partition = "debug", time_limit = "00:05:00", use_container = false, gpus_per_node_flag = false, exclusive = false, sbatch_options = { segment = 0 } } }
num_nodes = 1

[settings]
seq_length = 2048
gbs = 8
max_steps = 8
tp = 1
pp = 1
cp = 1
vp = 1
"env.DSE_SIM_STEP_S" = "0.5"

[knobs]
mbs = [1, 2]
recompute = ["none", "full"]

[backend]
kind = "slurm"
payload = "sim"

[search]
agent = "grid"
baseline = "predict"  # the jobs start two at once from the first: no baseline run alone before them
"""


def spans(records) -> list[tuple[dt.datetime, dt.datetime]]:
    out = []
    for r in records:
        job = (study_mod.Path(r.run_dir) / "job_id").read_text().strip()
        row = (
            subprocess.run(
                ["sacct", "-j", job, "-X", "-n", "-P", "-o", "Start,End"], capture_output=True, text=True, check=True
            )
            .stdout.strip()
            .splitlines()[0]
        )
        start, end = (dt.datetime.fromisoformat(t) for t in row.split("|"))
        out.append((start, end))
    return out


def test_parallel_2_runs_two_one_node_slurm_trials_at_the_same_time(tmp_path):
    space = load_space(write_space(tmp_path, ONE_NODE))
    res = study_mod.run_study(space, study_mod.Request(out_dir=tmp_path / "out", parallel=2))
    assert len(res.records) == 4 and all(r.status == "ok" for r in res.records), [r.reason for r in res.records]
    s = spans(res.records)
    overlapping = [(i, j) for i in range(4) for j in range(i + 1, 4) if s[i][0] < s[j][1] and s[j][0] < s[i][1]]
    assert overlapping, s  # sacct: some two jobs were running at the same time
    # never more than two at once
    for i in range(4):
        t = s[i][0]
        assert sum(a <= t < b for a, b in s) <= 2, s


def test_ctrl_c_scancels_every_running_job_and_records_them_interrupted(tmp_path):
    import os
    import signal
    import sys
    import time

    from dse.backends.slurm import query_state

    text = ONE_NODE.replace('"env.DSE_SIM_STEP_S" = "0.5"', '"env.DSE_SIM_STEP_S" = "30"')
    space = write_space(tmp_path, text)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse", "run", "--space", str(space), "--out", str(out), "--parallel", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    jobs: list[str] = []
    while time.monotonic() < deadline:  # both jobs RUNNING
        jobs = [p.read_text().strip() for p in out.glob("trials/*/job_id")]
        states = [query_state(j) for j in jobs]
        if len(jobs) == 2 and all(s is not None and s.state == "RUNNING" for s in states):
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"the two jobs did not start: {jobs}")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert [query_state(j).state for j in jobs] == ["CANCELLED", "CANCELLED"]  # scancel, each of them
    assert "2 trials saved" in err and "2 interrupted" in err and err.rstrip().endswith("--resume")
    store, _ = study_mod.open_store(out)
    recs = store.records()
    store.close()
    assert len(recs) == 2 and all(r.interrupted for r in recs)


def test_a_completed_job_is_collected_after_an_interrupt_and_a_running_one_is_cancelled(tmp_path):
    import threading

    from dse.backends.slurm import SlurmBackend
    from dse.launch import build_plan
    from dse.rules.trial import resolve

    space = load_space(write_space(tmp_path, ONE_NODE.replace('"0.5"', '"0"')))
    t = resolve(space, {"mbs": 1, "recompute": "full"})
    be = SlurmBackend(poll_s=0.5)
    done_dir = tmp_path / "done"
    done_dir.mkdir()
    r = be.run(build_plan(t, payload="sim", simulated=True), done_dir)
    assert r.scheduler_state == "COMPLETED"
    got = be.finished_after_interrupt(t, done_dir)
    assert got is not None and got.scheduler_state == "COMPLETED" and got.log_path == done_dir / "log.txt"
    slow = resolve(
        load_space(write_space(tmp_path, ONE_NODE.replace('"0.5"', '"30"'), "slow.toml")),
        {"mbs": 1, "recompute": "full"},
    )
    cancel_dir = tmp_path / "cancelled"
    cancel_dir.mkdir()
    waiter = threading.Thread(
        target=be.run, args=(build_plan(slow, payload="sim", simulated=True), cancel_dir), daemon=True
    )
    waiter.start()
    import time

    from dse.backends.slurm import query_state

    deadline = time.monotonic() + 60
    while not (cancel_dir / "job_id").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    job = (cancel_dir / "job_id").read_text().strip()
    while (st := query_state(job)) is None or st.state != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    # a job still running with nobody waiting for it (its dse gone): cancelled, since the trial runs again
    assert be.finished_after_interrupt(slow, cancel_dir) is None
    while (st := query_state(job)) is None or st.state != "CANCELLED":
        assert time.monotonic() < deadline, st
        time.sleep(0.5)
    assert be.finished_after_interrupt(slow, cancel_dir) is None
    waiter.join(timeout=60)  # its wait ends with the cancelled job: no thread polls on into the next test
    assert not waiter.is_alive()
