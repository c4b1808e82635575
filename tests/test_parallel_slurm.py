"""``--parallel 2`` on the real local Slurm cluster (.ci/slurm/up.sh): two 1-node trials run side by side."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest

from dse import study as study_mod
from dse.space import load_space
from tests.helpers import write_space

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

ONE_NODE = """
name = "par_slurm"
recipe = "llama3_8b"
system = { gpu = "gb300", gpus_per_node = 1, nvlink_domain = 72, slurm = { partition = "debug", time_limit = "00:05:00", use_container = false, gpus_per_node_flag = false, exclusive = false } }
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
"""


def spans(records) -> list[tuple[dt.datetime, dt.datetime]]:
    out = []
    for r in records:
        job = (study_mod.Path(r.run_dir) / "job_id").read_text().strip()
        row = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "Start,End"], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[0]
        start, end = (dt.datetime.fromisoformat(t) for t in row.split("|"))
        out.append((start, end))
    return out


def test_parallel_2_runs_two_one_node_slurm_trials_at_the_same_time(tmp_path):
    space = load_space(write_space(tmp_path, ONE_NODE))
    res = study_mod.run_study(space, out_dir=tmp_path / "out", parallel=2)
    assert len(res.records) == 4 and all(r.status == "ok" for r in res.records), [r.reason for r in res.records]
    s = spans(res.records)
    overlapping = [(i, j) for i in range(4) for j in range(i + 1, 4) if s[i][0] < s[j][1] and s[j][0] < s[i][1]]
    assert overlapping, s  # sacct: some two jobs were running at the same time
    # never more than two at once
    for i in range(4):
        t = s[i][0]
        assert sum(a <= t < b for a, b in s) <= 2, s
