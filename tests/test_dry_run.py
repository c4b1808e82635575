"""``dse dry-run``: scripts for each valid trial, a summary, nothing submitted."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from typer.testing import CliRunner

from dse.cli import app
from tests.helpers import write_space
from tests.trials import DATA

SPACE = DATA / "spaces" / "llama3_70b_16l_dryrun.toml"


@pytest.fixture
def runner():
    return CliRunner()


def test_slurm_dry_run_writes_sbatch_scripts_and_rejects_untuned_overlap(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # nothing may be submitted: sbatch must not even be reachable
    out = tmp_path / "out"
    r = runner.invoke(app, ["dry-run", "--space", str(SPACE), "--backend", "slurm", "--out", str(out)])
    assert r.exit_code == 0, r.output
    scripts = sorted(out.glob("*/launch.sbatch"))
    # 8 points; tp_comm_overlap with tp 2 (2 points) has no userbuffer config on H100 for hidden 8192
    assert len(scripts) == 6
    assert "rejected 2 x tp_comm_overlap_supported" in r.output.replace("\n", " ")
    assert "6 slurm script(s) written" in r.output and "nothing submitted" in r.output
    text = scripts[0].read_text()
    assert "#SBATCH --nodes=2" in text and "--container-image nvcr.io#nvidia/nemo:25.09" in text
    assert "srun --ntasks=2 --output=vboost.out --error=vboost.err" in text
    overlap = [s.read_text() for s in scripts if "tp_comm_overlap=True" in s.read_text()]
    assert len(overlap) == 2  # the factory gets the tuned config by name
    assert all('tp_comm_overlap_cfg="userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"' in t for t in overlap)
    assert not list(out.glob("*/log.txt"))
    # each folder runs as written: the payload its script runs (the container's workdir) is beside it, hard links
    # to the one staged copy
    staged = out / "code" / "recipes" / "contract.py"
    for s in scripts:
        payload = s.parent / "code" / "recipes" / "contract.py"
        assert payload.read_bytes() == staged.read_bytes() and os.path.samefile(payload, staged)
        assert "--container-workdir /nemo_run/code" in s.read_text()
    index = pd.read_csv(out / "index.csv", dtype={"folder": str})
    assert sorted(index.folder) == sorted(s.parent.name for s in scripts)
    assert {"tp", "predicted_peak_memory_gib", "predicted_step_time_s", "predicted_fits", "screened"} <= set(index)
    assert all((out / f / "launch.sbatch").exists() for f in index.folder)
    assert "index.csv" in r.output.replace("\n", "")


def test_only_fitting_leaves_out_the_points_predicted_beyond_memory(runner, tmp_path):
    every, fitting = tmp_path / "every", tmp_path / "fitting"
    args = ["dry-run", "--space", str(write_space(tmp_path)), "--backend", "local"]
    assert runner.invoke(app, [*args, "--out", str(every)]).exit_code == 0
    index = pd.read_csv(every / "index.csv", dtype={"folder": str})
    assert not index.predicted_fits.all() and index.predicted_fits.any()  # the fixture has both
    r = runner.invoke(app, [*args, "--out", str(fitting), "--only-fitting"])
    assert r.exit_code == 0, r.output
    kept = pd.read_csv(fitting / "index.csv", dtype={"folder": str})
    assert list(kept.folder) == list(index.folder[index.predicted_fits])
    assert sorted(p.parent.name for p in fitting.glob("*/launch.sh")) == list(kept.folder)
    left = int((~index.predicted_fits).sum())
    assert f"{left} valid point(s) predicted beyond the GPU's memory left out" in r.output


def test_local_dry_run_with_limit(runner, tmp_path):
    out = tmp_path / "out"
    r = runner.invoke(app, ["dry-run", "--space", str(SPACE), "--backend", "local", "--out", str(out), "--limit", "3"])
    assert r.exit_code == 0, r.output
    scripts = sorted(out.glob("*/launch.sh"))
    assert len(scripts) == 3
    text = scripts[0].read_text()
    assert "torchrun --nnodes 1 --nproc-per-node 8" in text and "-m recipes.nemo2 --factory llama3_70b_recipe" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend", "kubernetes"], "unknown backend"),
        (["--limit", "0"], "positive number"),
    ],
)
def test_bad_arguments_are_one_line_errors(runner, tmp_path, args, message):
    r = runner.invoke(app, ["dry-run", "--space", str(SPACE), "--out", str(tmp_path), *args])
    assert r.exit_code == 2 and message in r.output
