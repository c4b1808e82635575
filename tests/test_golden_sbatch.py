"""Golden files: the sbatch script of a fixed trial per recipe on H100, B200 and GB200.

Volatile bits are normalised (the run directory becomes /RUN_DIR). ``DSE_UPDATE_GOLDEN=1`` rewrites the
files; review the diff by eye before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dse.backends.slurm import render_sbatch
from dse.launch import build_plan
from tests.trials import system, trial

GOLDEN = Path(__file__).parent / "golden" / "sbatch"
RECIPES = ("llama3_8b", "llama3_70b", "llama3_405b", "nemotron3_8b", "nemotron4_15b", "nemotron4_340b")
GPUS = ("h100", "b200", "gb200")
RUN_DIR = Path("/tmp/dse-golden/trials/00007")

# a fixed trial per recipe: its default layout for the GPU, FP8 where NVIDIA's recipes use it, vboost on,
# and the allocator setting NVIDIA's performance scripts use, on the recipe's default GPU count
SETTINGS = {"max_steps": 50, "env.ENABLE_VBOOST": "1", "env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def golden_script(recipe: str, gpu: str) -> str:
    from dse.recipes.models import RECIPES

    r = RECIPES[recipe]
    sys_ = system(gpu, slurm={"account": "perf", "partition": "batch", "container_mounts": ["/lustre/data:/data"]})
    precision = "bf16" if gpu == "h100" or recipe in ("nemotron3_8b", "nemotron4_340b") else "fp8"
    num_nodes = max(1, r.num_gpus_default // sys_.gpus_per_node)
    t = trial(
        recipe,
        sys=sys_,
        num_nodes=num_nodes,
        precision=precision,
        **{k.replace("env.", "env_"): v for k, v in SETTINGS.items()},
    )
    plan = build_plan(t, payload="nemo2")
    return render_sbatch(plan, RUN_DIR).replace(str(RUN_DIR), "/RUN_DIR").rstrip("\n") + "\n"


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_sbatch_matches_golden(recipe, gpu):
    path = GOLDEN / f"{recipe}_{gpu}.sbatch"
    text = golden_script(recipe, gpu)
    if os.environ.get("DSE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with DSE_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text()
