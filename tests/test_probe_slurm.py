"""``dse probe --backend slurm`` on the test Slurm cluster (.ci/slurm/up.sh): each probed rank of a 64-GPU layout is
its own one-node, one-task job through sbatch, its world size and rank reach the job's process through sbatch and
srun, and the probe's log comes back through srun's output and is parsed into probes.csv.

The cluster has no GPU and the CI machine no Megatron-Core, so the job's payload is a stand-in: the staged
``recipes/mcore/__main__.py`` prints the H100 log of the rank its environment names (bench/data/h100_probes), after
checking the probe's flag and world size. The fake process group itself runs on CPU tensors in
tests/test_probe.py (the NeMo environment)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from dse import probe
from dse.backends.scripts import CODE_DIR
from tests.helpers import dse

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "bench/data/h100_probes"
LOGS = {"0": PROBES / "l70b_w64_tp8pp8_r0.log", "56": PROBES / "l70b_w64_tp8pp8_r56.log"}

SPACE = """
name = "l70b_probe_slurm"
recipe = "llama3_70b"
num_nodes = 8

[system]
gpu = "h100"
gpus_per_node = 8
nvlink_domain = 8

[system.slurm]
partition = "debug"
account = ""
time_limit = "00:05:00"
use_container = false
gpus_per_node_flag = false
exclusive = false

[settings]
tp = 8
pp = 8
cp = 1
vp = 1
mbs = 1
gbs = 16
seq_length = 4096
attention_backend = "local"

[knobs]
recompute = ["selective"]

[backend]
kind = "slurm"
payload = "mcore"
"""

STAND_IN = """
import os, sys
logs = {logs!r}
if "--fake-process-group" not in sys.argv or os.environ.get("WORLD_SIZE") != "64":
    sys.exit("not a probe of a 64-GPU layout: " + " ".join(sys.argv) + " WORLD_SIZE=" + str(os.environ.get("WORLD_SIZE")))
sys.stdout.write(open(logs[os.environ["RANK"]]).read())
"""


def _max_allocated_gib(log: Path) -> float:
    return max(float(x) for x in re.findall(r"\| max allocated: ([0-9.]+)", log.read_text())) / 1024


def test_dse_probe_runs_each_rank_as_a_one_gpu_slurm_job(tmp_path, monkeypatch):
    staged = probe.stage_code

    def stage(run_dir: Path) -> Path:
        code = staged(run_dir)
        (Path(run_dir) / CODE_DIR / "recipes" / "mcore" / "__main__.py").write_text(
            STAND_IN.format(logs={k: str(v) for k, v in LOGS.items()})
        )
        return code

    monkeypatch.setattr(probe, "stage_code", stage)
    (tmp_path / "space.toml").write_text(SPACE)
    out = tmp_path / "probes"
    r = dse("probe", tmp_path / "space.toml", "--backend", "slurm", "--out", out)
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader((out / "probes.csv").read_text().splitlines()))
    assert [(row["rank"], row["stage"], row["status"]) for row in rows] == [("0", "0", "ok"), ("56", "7", "ok")]
    for row in rows:
        run_dir = out / "00000" / f"rank{int(row['rank']):05d}"
        script = (run_dir / "launch.sbatch").read_text()
        assert "#SBATCH --nodes=1" in script and "#SBATCH --ntasks-per-node=1" in script
        assert float(row["peak_memory_gib"]) == pytest.approx(_max_allocated_gib(LOGS[row["rank"]]), rel=1e-6)
        assert float(row["step_time_s"]) > 1.0 and float(row["model_peak_memory_gib"]) > 0
        assert float(row["gpu_minutes"]) > 0
