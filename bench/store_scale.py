"""Reading a large study: a store of N trials (default 50,000) written in batches, then read back as
one list (open the store, every record, the leaderboard frame), then streamed as ``dse leaderboard`` reads
it now (batches, the top rows kept). Prints seconds and the peak RSS growth of each phase.

    python bench/store_scale.py [--trials 50000] [--knobs 7] [--values 8]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from dse.study.leaderboard import Summary, frame
from dse.study.store import Store, TrialRecord


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    """CPU seconds of this process so far: a figure a loaded machine changes less than wall time."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=50_000)
    ap.add_argument("--knobs", type=int, default=7)
    ap.add_argument("--values", type=int, default=8)
    args = ap.parse_args()
    knobs = {f"k{i}": list(range(1, args.values + 1)) for i in range(args.knobs)}
    url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='dse-store-')) / 'study.db'}"
    t0, r0, c0 = time.perf_counter(), _rss_mib(), _cpu_s()
    store = Store(url, "scale", knobs, batch_size=512)
    for n in range(args.trials):
        point = {k: v[(n // (i + 1)) % len(v)] for i, (k, v) in enumerate(knobs.items())}
        ok = n % 3 != 0
        store.record(
            TrialRecord(
                number=n,
                knobs=point,
                status="ok" if ok else "oom",
                reward=float(n % 997) if ok else 0.0,
                reason=None if ok else "CUDA out of memory",
                run_dir=f"/runs/trials/{n:05d}",
                gpu="h100",
                num_gpus=1024,
                metrics={"step_time_s": 1.0 + n % 7, "tflops_per_gpu": 400.0, "peak_memory_gib": 60.0},
            )
        )
    store.close()
    t1, r1, c1 = time.perf_counter(), _rss_mib(), _cpu_s()
    print(
        f"write {args.trials:,} trials: {t1 - t0:.1f} s ({args.trials / (t1 - t0):,.0f}/s; CPU {c1 - c0:.1f} s), "
        f"RSS +{r1 - r0:.0f} MiB"
    )
    store = Store(url, "scale", knobs, create=False)
    t2 = time.perf_counter()
    records = store.records()
    store.close()
    t3, r3 = time.perf_counter(), _rss_mib()
    df = frame(records, list(knobs))
    t4, r4, c4 = time.perf_counter(), _rss_mib(), _cpu_s()
    print(
        f"open the store: {t2 - t1:.2f} s; records(): {t3 - t2:.2f} s, RSS +{r3 - r1:.0f} MiB; "
        f"leaderboard frame: {t4 - t3:.2f} s, RSS +{r4 - r3:.0f} MiB; rows {len(df):,}"
    )
    print(f"read back in all: {t4 - t1:.2f} s (CPU {c4 - c1:.1f} s) for {len(records):,} trials")
    del records, df
    store = Store(url, "scale", knobs, create=False)
    summary = Summary(20)
    t5, c5 = time.perf_counter(), _cpu_s()
    for r in store.iter_records():  # as dse leaderboard reads it: one streamed pass, the top rows kept
        summary.add(r)
    store.close()
    print(
        f"streamed (iter_records + Summary, as dse leaderboard): {time.perf_counter() - t5:.2f} s "
        f"(CPU {_cpu_s() - c5:.1f} s), "
        f"{store.batches_read} batches, {summary.rows_held} rows held"
    )


if __name__ == "__main__":
    main()
