"""The held-out published-performance table (bench/data/published_perf_heldout.tsv) is well-formed: typed
columns, unique ids, layouts that dse.rules.constraints accepts, architectures that load, no copy of a calibration
row, and published TFLOP/s consistent with tokens/s under the row's FLOPs convention (which catches
transcription slips and wrong architectures). Accuracy is a bench figure (bench/model_heldout.py), not a test.
"""

from __future__ import annotations

import pytest

from bench import model_accuracy, model_heldout
from dse.facts.hardware import HARDWARE
from dse.perfmodel.flops import model_flops_per_step

ROWS = model_heldout.load_rows()
CAL_COLUMNS = list(model_accuracy.load_rows()[0])
INTS = ("num_gpus", "seq_length", "gbs", "mbs", "tp", "pp", "cp", "vp")


def test_columns_extend_the_calibration_table():
    """Same leading columns, the held-out table's own before ``source``; columns added since (the CUDA graph
    knobs) follow ``source`` in both tables, in the same order."""
    cols = list(ROWS[0])
    cal_src, src = CAL_COLUMNS.index("source"), cols.index("source")
    assert cols[:cal_src] == CAL_COLUMNS[:cal_src]
    # after source: the calibration table's columns added since (the graph knobs), then the held-out table's own
    # (system: a system file of the row's fabric)
    assert cols[src + 1 : src + len(CAL_COLUMNS) - cal_src] == CAL_COLUMNS[cal_src + 1 :]
    assert {"cuda_graph", "cuda_graph_scope", "system"} <= set(cols[src + 1 :])
    assert {"recompute", "sp", "tp_comm_overlap", "fp8_recipe", "model_file", "cross_entropy"} <= set(cols)


def test_ids_unique_and_enough_rows():
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))
    assert len(ROWS) >= 20


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_row_is_typed_and_valid(row):
    for k in INTS:
        assert int(row[k]) >= 1, k
    assert float(row["tokens_per_s_per_gpu"]) > 0 and float(row["tflops_per_gpu"]) > 0
    assert row["gpu"] in HARDWARE
    assert row["precision"] in ("bf16", "fp8", "nvfp4")
    assert row["fsdp"] in ("0", "1") and row["sp"] in ("0", "1") and row["tp_comm_overlap"] in ("0", "1")
    assert row["recompute"] in ("none", "selective", "full")
    assert row["flops_convention"] in model_heldout.PREDICT_CONVENTION
    assert row["source"].strip()
    assert (row["model_file"] == "") == (row["model"] in model_heldout.RECIPES)
    assert int(row["num_gpus"]) % HARDWARE[row["gpu"]].gpus_per_node == 0
    assert model_heldout.validity(row) is None


def test_no_row_copies_a_calibration_row():
    cal = {tuple(r[k] for k in CAL_COLUMNS[1:-1]) for r in model_accuracy.load_rows()}
    for r in ROWS:
        assert tuple(r[k] for k in CAL_COLUMNS[1:-1]) not in cal, r["id"]


def test_validity_check_rejects_a_broken_layout():
    row = dict(ROWS[0], tp="3")  # 3 divides neither the heads of GPT-3 5B nor the 64 GPUs
    assert model_heldout.validity(row) is not None


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_published_tflops_match_tokens_under_the_rows_convention(row):
    arch = model_heldout.recipe_for(row).arch
    s = int(row["seq_length"])
    conv = row["flops_convention"]
    if conv == "noncausal_hw_full_recompute":  # Narayanan et al. 2021, Eq. 3 (counts the recompute forward)
        L, h, V = arch.num_layers, arch.hidden_size, arch.vocab_size
        per_token = 96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    else:
        per_token = model_flops_per_step(arch, 1, s, conv) / s
    implied = float(row["tokens_per_s_per_gpu"]) * per_token / 1e12
    assert implied == pytest.approx(float(row["tflops_per_gpu"]), rel=0.02)
