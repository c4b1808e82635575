"""The terminal summary (``dse run``, ``dse leaderboard``) fitted to the console width: at 80 and 120
columns no line is wider than the console, no value is cut, and failed rows show a short reason."""

from __future__ import annotations

import pytest
from rich.console import Console

from dse.cli.render import print_summary
from dse.study.store import TrialRecord

KNOBS = ["tp", "pp", "vp", "cp", "mbs", "recompute", "precision"]


def records() -> list[TrialRecord]:
    ok = [
        TrialRecord(
            number=i,
            knobs={"tp": 8, "pp": 16, "vp": 4, "cp": 2, "mbs": 2, "recompute": "selective", "precision": "fp8"},
            status="ok",
            reward=771.9 - i,
            metrics={
                "step_time_s": 13.41 + i,
                "tflops_per_gpu": 771.9 - i,
                "tokens_per_s_per_gpu": 12345.6,
                "peak_memory_gib": 76.45,
            },
        )
        for i in range(3)
    ]
    bad = [
        TrialRecord(
            number=3,
            knobs={"tp": 1, "pp": 1, "vp": 1, "cp": 1, "mbs": 4, "recompute": "none", "precision": "bf16"},
            status="oom",
            reward=0.0,
            reason="CUDA out of memory. Tried to allocate 2.00 GiB on device 0 with 79.1 GiB in use",
        ),
        TrialRecord(
            number=4,
            knobs={"tp": 2, "pp": 1, "vp": 8, "cp": 1, "mbs": 1, "recompute": "full", "precision": "bf16"},
            status="rejected",
            reward=0.0,
            reason="layers_divisible: pp*vp = 1*8 does not divide the 126 layers",
        ),
    ]
    return ok + bad


def render(width: int, objective: str | None = "tflops_per_gpu") -> str:
    c = Console(width=width, record=True, color_system=None)
    print_summary(records(), KNOBS, top=10, objective=objective, out=c)
    return c.export_text()


@pytest.mark.parametrize("width", [80, 120])
def test_summary_fits_the_width_and_cuts_no_value(width):
    text = render(width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    table = [line for line in lines if line.startswith("│")]
    assert len(table) == 5
    for line in table:
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert not any(c.endswith("…") for c in cells[:-1])  # only the reason may be shortened
    assert "771.9" in text and "769.9" in text  # the objective is never dropped nor cut


def test_failed_rows_show_a_short_reason():
    text = render(120)
    row = {line.split("│")[1].strip(): line for line in text.splitlines() if line.startswith("│")}
    assert "layers_divisible" in row["4"] and "does not divide" not in row["4"]  # a rejection: its rule
    assert "CUDA out of memory" in row["3"]
    assert row["0"].rstrip("│ ").endswith("fp8")  # an ok row: empty reason


def test_narrow_console_drops_columns_and_says_which():
    wide, narrow = render(300), render(80)
    assert "not shown" not in wide and "tokens_per_s_per_gpu" in wide  # full headers when they fit
    assert "12346" in wide  # 12345.6, not 1.235e+04
    shown_narrow = narrow.split("not shown:")[0]
    dropped = narrow.split("not shown:")[1].split("(")[0].replace("\n", " ")
    assert "tok/s/GPU" not in shown_narrow and "tokens_per_s_per_gpu" in dropped
    assert "TFLOP/s" in shown_narrow  # the objective stays
    for knob in ("tp", "pp"):
        assert f" {knob} " in shown_narrow


def test_objective_outlives_other_metrics():
    narrow = render(80, objective="peak_memory_gib")
    shown = narrow.split("not shown:")[0]
    assert "mem GiB" in shown and "76.45" in shown
