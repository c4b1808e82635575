"""Real H200 runs of ``recipes.mcore`` with Transformer Engine's layer spec, against the performance model.

    python bench/h200_te_runs.py                     # table: measured vs predicted, per run
    python bench/h200_te_runs.py --write-tsv LOGDIR  # rebuild bench/data/h200_te_runs.tsv from logs

Same columns as ``bench/data/h200_real_runs.tsv`` plus ``layer_spec``, ``precision``, ``fp8_recipe`` and
``attention_backend``, read from the payload's header lines (``> recipes.mcore: layer spec te``). Logs:
tests/fixtures/logs/real_h200_te/. The prediction is ``dse.perfmodel.predict`` for the same point on an h200
system of one GPU with the run's precision, FP8 recipe and attention backend. Needs no torch.
"""

from __future__ import annotations

import csv
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
import h200_real_runs as base  # noqa: E402

TSV = ROOT / "bench" / "data" / "h200_te_runs.tsv"
LOGS = ROOT / "tests" / "fixtures" / "logs" / "real_h200_te"
EXTRA = ("layer_spec", "precision", "fp8_recipe", "attention_backend", "cpu_offload_layers")
COLUMNS = base.COLUMNS[:-1] + EXTRA + ("log",)
_SPEC = re.compile(r"> recipes\.mcore: layer spec (\w+)")
_PREC = re.compile(
    r"> recipes\.mcore: precision (bf16|fp8 hybrid (\w+)), attention backend (\w+)"
    r"(?:, cpu offload layers (\d+))?"
)


def measure(log: Path) -> dict:
    row = base.measure(log)
    row.update(layer_spec="local", precision="bf16", fp8_recipe="", attention_backend="local", cpu_offload_layers=0)
    for line in log.read_text(errors="replace").splitlines():
        if m := _SPEC.search(line):
            row["layer_spec"] = m.group(1)
        elif m := _PREC.search(line):
            row.update(
                precision="fp8" if m.group(2) else "bf16",
                fp8_recipe=m.group(2) or "",
                attention_backend=m.group(3),
                cpu_offload_layers=int(m.group(4) or 0),
            )
    return row


def write_tsv(logdir: Path, out: Path = TSV) -> list[dict]:
    rows = [measure(p) for p in sorted(logdir.glob("*.log"))]
    rows = [r for r in rows if r.get("step_time_ms") is not None and r["steps"] > base.warmup_steps(r["steps"])]
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, delimiter="\t", extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


def trial(row: dict):
    """The dse TrialConfig of a row: as bench/h200_real_runs.py's, with the run's precision, attention and
    activation offloading (a TSV without the offload column counts as none)."""
    t = base._trial(row)
    values = dict(t.values)
    values.update(
        precision=row["precision"],
        attention_backend=row["attention_backend"],
        cpu_offload_layers=int(row.get("cpu_offload_layers") or 0),
    )
    if row["precision"] == "fp8":
        values["fp8_recipe"] = row["fp8_recipe"]
    return replace(t, values=MappingProxyType(values))


def report(rows: list[dict]) -> list[dict]:
    from dse.perfmodel import predict

    out = []
    head = (
        f"{'run':30} {'spec':5} {'prec':14} {'attn':8} {'step ms':>8} {'pred':>7} {'err':>7} | "
        f"{'TF/s':>6} {'pred':>6} | {'mem GiB':>7} {'pred':>6} {'err':>7}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        st, tf, mem = float(row["step_time_ms"]), float(row["tflops_per_gpu"]), float(row["peak_allocated_gib"])
        p = predict(trial(row))
        pst, ptf, pmem = p.step_time_s * 1e3, p.tflops_per_gpu, p.peak_memory_gib
        prec = row["precision"] + (f" {row['fp8_recipe']}" if row["fp8_recipe"] else "")
        print(
            f"{row['name']:30} {row['layer_spec']:5} {prec:14} {row['attention_backend']:8} {st:8.1f} {pst:7.1f} "
            f"{base._err(pst, st):>7} | {tf:6.1f} {ptf:6.1f} | {mem:7.2f} {pmem:6.2f} {base._err(pmem, mem):>7}"
        )
        out.append(
            {
                "name": row["name"],
                "step_time_ms": st,
                "pred_step_time_ms": pst,
                "peak_allocated_gib": mem,
                "pred_peak_memory_gib": pmem,
                "pred_allocated_gib": pmem - base.outside_gib(trial(row)),
            }
        )
    base.print_mape(out, "1 H200")
    import pandas as pd  # Spearman's rank correlation (pandas is a dependency; scipy is not)

    df = pd.DataFrame(out)
    print(
        f"Spearman step time {df.step_time_ms.corr(df.pred_step_time_ms, method='spearman'):.2f} · "
        f"peak memory {df.peak_allocated_gib.corr(df.pred_peak_memory_gib, method='spearman'):.2f}"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    return base.run_cli(argv, doc=__doc__, tsv=TSV, write=write_tsv, show=report)


if __name__ == "__main__":
    sys.exit(main())
