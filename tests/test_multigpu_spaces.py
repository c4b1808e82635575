"""The multi-GPU H200 spaces (for a lent 2- or 8-GPU device): a memory border, and launch scripts for N ranks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dse.dryrun import dry_run
from dse.perfmodel import predict
from dse.rules.constraints import check
from dse.rules.space import load_space
from dse.rules.trial import resolve

SPACES = Path(__file__).resolve().parent.parent / "conf" / "spaces"


@pytest.mark.parametrize(
    "name,gpus,layers",
    [("llama3_70b_16l_h200_x8_local_space.toml", 8, 16), ("llama3_70b_12l_h200_x2_local_space.toml", 2, 12)],
)
def test_the_space_has_a_memory_border_and_scripts_for_every_rank(tmp_path, name, gpus, layers):
    space = load_space(SPACES / name)
    assert space.system.gpus_per_node == gpus and space.backend.payload == "mcore"
    valid = [t for p in space.points() if check(t := resolve(space, p)) is None]
    fits = [predict(t).fits for t in valid]
    assert any(fits) and not all(fits)  # the search meets out-of-memory points
    no_parallelism = resolve(space, {k: v[0] for k, v in space.knobs.items()})
    lay = no_parallelism.layout
    assert (lay.tp, lay.pp, lay.cp) == (1, 1, 1) and not predict(no_parallelism).fits
    assert {t.dp for t in valid} >= {1, 2}  # data parallelism varies too
    written = dry_run(space, "local", tmp_path / "dry").rows
    assert len(written) == len(valid)
    interleaved = next(r for r in written if r.knobs["pp"] == 2 and r.knobs["vp"] == 2 and r.knobs["tp"] == 1)
    text = interleaved.script.read_text()
    assert f"--nproc-per-node {gpus}" in text and "-m recipes.mcore" in text
    assert "model.pipeline_model_parallel_size=2" in text and "model.virtual_pipeline_model_parallel_size=2" in text
    assert re.search(rf"model\.num_layers={layers}\b", text)
