"""The real one-GPU H100 grid of ``recipes.mcore`` against the performance model; prints figures, asserts nothing.

    python bench/h100_mcore_grid.py     # per trial: measured and predicted step time and peak memory, OOM calls

Data: ``bench/data/h100_mcore_grid/`` (a ``dse run`` of ``conf/spaces/llama3_8b_4l_h100_local_space.toml`` on one
H100 through the local backend: megatron-core's local layer spec, seq 4096, mbs 1 / 2 / 4 x recompute none /
selective / full): its ``leaderboard.csv`` and each trial's ``log.txt``. Each point is predicted as ``dse predict``
predicts it (``dse.rules.trial.resolve`` on the space, the space's payload), uncalibrated. Measured memory: Megatron's
``max allocated`` and ``max reserved`` after the last iteration of a run that finished; for a run that ran out of
memory, PyTorch's OOM message: what PyTorch had allocated and reserved, what the process held outside PyTorch's
allocator (CUDA context, cuBLAS and NCCL workspaces: "in use" less PyTorch's reserved) and the request that
failed. The goals: step time MAPE <= 15% uncalibrated; no run that ran out of memory predicted below 95% of the
GPU's memory.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dse.perfmodel import DEFAULT_PARAMS, predict  # noqa: E402
from dse.rules.space import load_space  # noqa: E402
from dse.rules.trial import resolve  # noqa: E402

DATA = ROOT / "bench" / "data" / "h100_mcore_grid"
SPACE = ROOT / "conf" / "spaces" / "llama3_8b_4l_h100_local_space.toml"
GIB = 1024.0
_MEM = re.compile(r"max allocated: ([0-9.]+) \| reserved: [0-9.]+ \| max reserved: ([0-9.]+)")
_OOM = re.compile(
    r"Tried to allocate ([0-9.]+) GiB.*?this process has ([0-9.]+) GiB memory in use\. Of the allocated memory "
    r"([0-9.]+) GiB is allocated by PyTorch, and ([0-9.]+) GiB is reserved by PyTorch but unallocated"
)


def measured_memory(log: str) -> dict:
    """Megatron's last memory line (MB), or PyTorch's OOM message (GiB), as GiB."""
    oom = _OOM.search(log)
    if oom:
        request, in_use, allocated, free_reserved = map(float, oom.groups())
        return dict(
            oom=True,
            allocated=allocated,
            reserved=allocated + free_reserved,
            outside=in_use - allocated - free_reserved,
            request=request,
        )
    lines = _MEM.findall(log)
    allocated, reserved = (float(x) / GIB for x in lines[-1])
    return dict(oom=False, allocated=allocated, reserved=reserved)


def outside_gib(row: dict) -> float:
    """What the model counts outside PyTorch's allocator for a point of the grid (its reserve and the stack's
    measured extra), GiB."""
    from dse.perfmodel.model import prepare

    space = load_space(SPACE)
    return prepare(resolve(space, {"mbs": int(row["mbs"]), "recompute": row["recompute"]})).memory.outside_gib(
        DEFAULT_PARAMS
    )


def main() -> None:
    space = load_space(SPACE)
    rows = list(csv.DictReader(open(DATA / "leaderboard.csv", newline="")))
    print(
        f"{'mbs':>3s} {'recompute':9s} {'status':6s} {'step s':>7s} {'pred s':>7s} {'err':>7s}  "
        f"{'alloc':>6s} {'resv':>6s} {'pred':>6s} {'pred/HBM':>8s}  note"
    )
    errs, oom_calls, outside, alloc_errs = [], [], [], []
    grown: dict[str, dict[int, tuple[float, float]]] = {}  # recompute -> mbs -> (measured reserved, predicted)
    for r in sorted(rows, key=lambda r: (int(r["mbs"]), r["recompute"])):
        p = predict(resolve(space, {"mbs": int(r["mbs"]), "recompute": r["recompute"]}))
        m = measured_memory((DATA / r["run_dir"] / "log.txt").read_text(errors="replace"))
        share = p.peak_memory_gib / p.gpu_memory_gib
        if r["status"] == "ok":
            step = float(r["step_time_s"])
            err = p.step_time_s / step - 1.0
            errs.append(err)
            grown.setdefault(r["recompute"], {})[int(r["mbs"])] = (m["reserved"], p.peak_memory_gib)
            # the model's peak less what it puts outside PyTorch's allocator, against Megatron's max allocated
            alloc_errs.append((p.peak_memory_gib - outside_gib(r)) / m["allocated"] - 1.0)
            cols = f"{step:7.3f} {p.step_time_s:7.3f} {100 * err:+6.1f}%"
            note = "" if p.fits else "predicted OOM"
        else:
            cols = f"{'-':>7s} {p.step_time_s:7.3f} {'-':>7s}"
            oom_calls.append((r, share, p.fits))
            outside.append(m["outside"])
            note = f"ran out of memory asking {m['request']:.0f} GiB; outside PyTorch {m['outside']:.1f} GiB; " + (
                "predicted OOM" if not p.fits else f"predicted to fit at {100 * share:.0f}% of HBM"
            )
        print(
            f"{int(r['mbs']):3d} {r['recompute']:9s} {r['status']:6s} {cols}  {m['allocated']:6.1f} "
            f"{m['reserved']:6.1f} {p.peak_memory_gib:6.1f} {100 * share:7.0f}%  {note}"
        )
    print(
        f"\nstep time MAPE over the {len(errs)} runs that finished (uncalibrated; goal <= 15%): "
        f"{100 * sum(map(abs, errs)) / len(errs):.1f}%, mean signed {100 * sum(errs) / len(errs):+.1f}% "
        "(negative: the model is faster than the runs)"
    )
    print(
        f"peak memory of the {len(alloc_errs)} runs that finished, the model's peak less what it counts outside "
        f"PyTorch's allocator ({outside_gib(rows[0]):.1f} GiB) against the measured max allocated: MAPE "
        f"{100 * sum(map(abs, alloc_errs)) / len(alloc_errs):.1f}%, from {100 * min(alloc_errs):+.1f}% to "
        f"{100 * max(alloc_errs):+.1f}%"
    )
    low = [r for r, share, fits in oom_calls if fits and share < 0.95]
    print(
        f"runs that ran out of memory: {len(oom_calls)}; predicted not to fit: "
        f"{sum(1 for _, _, fits in oom_calls if not fits)}; predicted below 95% of HBM (goal: none): {len(low)}"
    )
    for rc, by in sorted(grown.items()):
        if 1 in by and 2 in by:
            print(
                f"memory per sample of the micro-batch, {rc} recompute (mbs 1 -> 2): measured reserved "
                f"{by[2][0] - by[1][0]:+.1f} GiB, predicted {by[2][1] - by[1][1]:+.1f} GiB"
            )
    if outside:
        print(
            f"memory the process held outside PyTorch's allocator at the OOM: {min(outside):.1f}-{max(outside):.1f} "
            "GiB (CUDA context, cuBLAS and NCCL workspaces)"
        )


if __name__ == "__main__":
    main()
