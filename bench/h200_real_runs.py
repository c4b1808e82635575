"""Real H200 runs of ``recipes.mcore`` against the performance model: measured vs predicted, per run.

    python bench/h200_real_runs.py                      # table: measured, predicted, error %
    python bench/h200_real_runs.py --write-tsv LOGDIR   # rebuild bench/data/h200_real_runs.tsv from logs

The TSV holds one row per real run (one H200, bf16, mock data; logs in tests/fixtures/logs/real_h200/):
model dimensions, layout, batch, recompute, and the measured median step time after warm-up (the first
max(2, ceil(10 %)) logged iterations dropped, as dse.logs.parse does), the median logged TFLOP/s/GPU (causal
convention) and the peak allocated / reserved memory from Megatron's memory lines. The prediction is
``dse.perfmodel.predict`` for the same configuration on an ``h200`` system of one GPU, with
``attention_backend=local`` (the local spec's unfused core attention). Needs no torch.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TSV = ROOT / "bench" / "data" / "h200_real_runs.tsv"
COLUMNS = (
    "name",
    "model",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "ffn_hidden_size",
    "vocab_size",
    "gated",
    "tp",
    "pp",
    "mbs",
    "gbs",
    "seq_length",
    "recompute",
    "distributed_optimizer",
    "steps",
    "step_time_ms",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "peak_allocated_gib",
    "peak_reserved_gib",
    "loss_first",
    "loss_last",
    # the stack that ran (dse.perfmodel.stack, which dse calibrate reads too): "mcore:torch-adamw" where neither
    # Transformer Engine nor Apex imported (Megatron-Core's fallback warning, or the payload's "optimizer
    # torch.optim..." header), else "mcore" (their FusedAdam)
    "payload",
    "log",
)
# what the optimizer's class says in the log: Megatron-Core's warning when it falls back to torch's optimizers (logs of
# every version), or the payload's own header line (logs since it prints one)
_TORCH_ADAMW = re.compile(r"Falling back to Torch optimizers|> recipes\.mcore: optimizer torch\.optim\.")

_RUN = re.compile(
    r"> recipes\.mcore: world size (\d+), tp (\d+), pp (\d+), vp (\d+), dp (\d+), mbs (\d+), "
    r"gbs (\d+) \(\d+ micro-batches\), seq (\d+), recompute (\w+), distributed optimizer (\w+)"
)
_MODEL = re.compile(
    r"> model (\S+): layers (\d+), hidden (\d+), heads (\d+), query groups (\d+), ffn (\d+), "
    r"vocab (\d+), (swiglu|gelu)"
)
_ITER = re.compile(
    r"iteration\s+(\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): ([\d.]+) \|"
    r"(?:.*throughput per GPU \(TFLOP/s/GPU\): ([\d.]+) \|)?(?:.*lm loss: ([\d.E+-]+) \|)?"
)
_MEM = re.compile(
    r"memory \(MB\) \| allocated: [\d.]+ \| max allocated: ([\d.]+) \| reserved: [\d.]+ \| "
    r"max reserved: ([\d.]+)"
)


def warmup_steps(n: int) -> int:
    """Logged steps treated as warm-up: max(2, ceil(10 % of n)), the rule of dse.logs.parse and issue 4."""
    return max(2, math.ceil(n / 10))


def measure(log: Path) -> dict:
    """One TSV row from a log of recipes.mcore (configuration from its header lines, figures as printed)."""
    row: dict = {"name": log.stem, "log": log.name, "payload": "mcore"}
    times, tflops, losses, alloc, reserved = [], [], [], [], []
    for line in log.read_text(errors="replace").splitlines():
        if _TORCH_ADAMW.search(line):
            row["payload"] = "mcore:torch-adamw"
        if m := _RUN.search(line):
            world, tp, pp, _vp, _dp, mbs, gbs, seq = (int(x) for x in m.groups()[:8])
            row.update(
                num_gpus=world,
                tp=tp,
                pp=pp,
                mbs=mbs,
                gbs=gbs,
                seq_length=seq,
                recompute=m.group(9),
                distributed_optimizer=m.group(10) == "True",
            )
        elif m := _MODEL.search(line):
            row.update(
                model=m.group(1),
                num_layers=int(m.group(2)),
                hidden_size=int(m.group(3)),
                num_attention_heads=int(m.group(4)),
                num_query_groups=int(m.group(5)),
                ffn_hidden_size=int(m.group(6)),
                vocab_size=int(m.group(7)),
                gated=m.group(8) == "swiglu",
            )
        elif m := _ITER.search(line):
            times.append(float(m.group(2)))
            tflops.append(float(m.group(3)) if m.group(3) else None)
            if m.group(4):
                losses.append(float(m.group(4)))
        elif m := _MEM.search(line):
            alloc.append(float(m.group(1)))
            reserved.append(float(m.group(2)))
    drop = warmup_steps(len(times))
    steady = times[drop:]
    row["steps"] = len(times)
    row["step_time_ms"] = round(statistics.median(steady), 2) if steady else None
    tf = [x for x in tflops[drop:] if x is not None]
    row["tflops_per_gpu"] = round(statistics.median(tf), 2) if tf else None
    if row["step_time_ms"] and "gbs" in row:
        row["tokens_per_s_per_gpu"] = round(
            row["gbs"] * row["seq_length"] / (row["step_time_ms"] / 1e3) / row["num_gpus"], 1
        )
    row["peak_allocated_gib"] = round(max(alloc) / 1024, 3) if alloc else None
    row["peak_reserved_gib"] = round(max(reserved) / 1024, 3) if reserved else None
    row["loss_first"] = losses[0] if losses else None
    row["loss_last"] = losses[-1] if losses else None
    return row


def write_tsv(logdir: Path, out: Path = TSV) -> list[dict]:
    rows = [measure(p) for p in sorted(logdir.glob("*.log"))]
    rows = [r for r in rows if r.get("step_time_ms") is not None and r["steps"] > warmup_steps(r["steps"])]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, delimiter="\t", extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return rows


def read_tsv(path: Path = TSV) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _trial(row: dict):
    """A dse TrialConfig for one row: a one-off recipe with the row's architecture, an h200 system of one GPU."""
    from types import MappingProxyType

    from dse.facts import knobs
    from dse.recipes.models import ModelArch, Recipe
    from dse.rules.space import load_system
    from dse.rules.trial import TrialConfig

    arch = ModelArch(
        row["model"],
        int(row["num_layers"]),
        int(row["hidden_size"]),
        int(row["num_attention_heads"]),
        int(row["num_query_groups"]),
        int(row["ffn_hidden_size"]),
        int(row["vocab_size"]),
        row["gated"] == "True",
    )
    recipe = Recipe(
        arch.name, arch, nemo2_recipe="", mbridge_recipe=None, seq_length=int(row["seq_length"]), num_gpus_default=1
    )
    system = load_system({"gpu": "h200", "gpus_per_node": 1, "nvlink_domain": 1})
    values = {name: k.default for name, k in knobs.CATALOGUE.items()}
    values.update(
        tp=int(row["tp"]),
        pp=int(row["pp"]),
        mbs=int(row["mbs"]),
        gbs=int(row["gbs"]),
        seq_length=int(row["seq_length"]),
        recompute=row["recompute"],
        num_nodes=1,
        precision="bf16",
        attention_backend="local",
    )  # recipes.mcore's local layer spec: Megatron's unfused attention
    # payload mcore: Megatron's native loss and recipes.mcore's FP8 settings (dse.perfmodel.stack), with torch's AdamW
    # where the run had neither Transformer Engine nor Apex (the payload column)
    from dse.perfmodel.calibrate import payload_from_row  # the same reading, and refusal, as dse calibrate's

    return TrialConfig(recipe=recipe, system=system, values=MappingProxyType(values), payload=payload_from_row(row))


def _predictor():
    try:
        from dse.perfmodel import predict
    except ImportError:
        return None
    return predict


def _err(pred: float | None, meas: float | None) -> str:
    if pred is None or meas in (None, 0):
        return "-"
    return f"{(pred - meas) / meas * 100:+.1f}%"


def report(rows: list[dict]) -> list[dict]:
    """Print measured vs predicted per row; return the printed figures (for callers and tests)."""
    predict = _predictor()
    out = []
    head = (
        f"{'run':34} {'step ms':>8} {'pred':>8} {'err':>7} | {'TF/s':>6} {'pred':>6} {'err':>7} | "
        f"{'mem GiB':>7} {'pred':>6} {'err':>7}"
    )
    print(head)
    print("-" * len(head))

    def fmt(v, w, d):
        return f"{v:{w}.{d}f}" if v is not None else f"{'-':>{w}}"

    for row in rows:
        st, tf, mem = float(row["step_time_ms"]), float(row["tflops_per_gpu"]), float(row["peak_allocated_gib"])
        p = predict(_trial(row)) if predict else None
        pst = p.step_time_s * 1e3 if p else None
        ptf = p.tflops_per_gpu if p else None
        pmem = p.peak_memory_gib if p else None
        palloc = pmem - outside_gib(_trial(row)) if p else None
        print(
            f"{row['name']:34} {st:8.1f} {fmt(pst, 8, 1)} {_err(pst, st):>7} | {tf:6.1f} {fmt(ptf, 6, 1)} "
            f"{_err(ptf, tf):>7} | {mem:7.2f} {fmt(pmem, 6, 2)} {_err(pmem, mem):>7}"
        )
        out.append(
            {
                "name": row["name"],
                "step_time_ms": st,
                "pred_step_time_ms": pst,
                "tflops_per_gpu": tf,
                "pred_tflops_per_gpu": ptf,
                "peak_allocated_gib": mem,
                "pred_peak_memory_gib": pmem,
                "pred_allocated_gib": palloc,
            }
        )
    if predict is None:
        print("(dse.perfmodel.predict not found: measured figures only)")
    else:
        print_mape(out, "1 H200, bf16, local layer spec without Transformer Engine")
    return out


def outside_gib(trial) -> float:
    """What the model counts outside PyTorch's allocator for ``trial`` (GiB): its reserve and the payload's
    measured extra (dse.perfmodel.memory.MemoryCounts.outside_gib); Megatron's max allocated leaves it out."""
    from dse.perfmodel import DEFAULT_PARAMS
    from dse.perfmodel.model import prepare

    return prepare(trial).memory.outside_gib(DEFAULT_PARAMS)


def print_mape(out: list[dict], what: str) -> None:
    """The step-time and peak-memory MAPE of ``report``'s rows, in one line; with each row's ``pred_allocated_gib``
    (the model's peak less what it counts outside PyTorch's allocator) also that against the max allocated."""
    errs = [abs(r["pred_step_time_ms"] - r["step_time_ms"]) / r["step_time_ms"] for r in out]
    merrs = [abs(r["pred_peak_memory_gib"] - r["peak_allocated_gib"]) / r["peak_allocated_gib"] for r in out]
    line = f"MAPE step time {100 * statistics.fmean(errs):.1f}% · peak memory {100 * statistics.fmean(merrs):.1f}%"
    if all(r.get("pred_allocated_gib") is not None for r in out):
        aerrs = [abs(r["pred_allocated_gib"] - r["peak_allocated_gib"]) / r["peak_allocated_gib"] for r in out]
        line += f" ({100 * statistics.fmean(aerrs):.1f}% less what the model counts outside PyTorch's allocator)"
    print(f"{line} over {len(out)} runs ({what})")


def run_cli(argv, *, doc: str, tsv: Path, write, show) -> int:
    """The command line both H200 benches share: ``--write-tsv LOGDIR`` rebuilds the TSV, then ``show`` it."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--write-tsv", metavar="LOGDIR", type=Path, help="rebuild the TSV from recipes.mcore logs")
    ap.add_argument("--tsv", type=Path, default=tsv)
    args = ap.parse_args(argv)
    if args.write_tsv:
        rows = write(args.write_tsv, args.tsv)
        print(f"wrote {len(rows)} rows to {args.tsv}")
    show(read_tsv(args.tsv))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, doc=__doc__, tsv=TSV, write=write_tsv, show=report)


if __name__ == "__main__":
    sys.exit(main())
