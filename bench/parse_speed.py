"""Measure dse.logs.parse throughput on a generated training log (default 1 GB); prints MB/s and peak memory.

The log mixes what real multi-node logs carry: NCCL INFO noise, srun ``--label`` (``12: ``) and
torchrun (``[rank3]:``) prefixes, NeMo warnings that quote metric names, tqdm refreshes with ``\\r``,
memory reports, and progress lines of NeMo 2 or Megatron format (one in ~40 lines). Not run in CI.

    python bench/parse_speed.py --size-mb 1024 [--format megatron]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dse.logs.parse import ParseContext, parse_log  # noqa: E402

NOISE = [
    "node{n:03d}:{pid}:{tid} [{r}] NCCL INFO Channel {c:02d}/0 : {r}[{r}] -> {r2}[{r2}] via P2P/CUMEM/read",
    "node{n:03d}:{pid}:{tid} [{r}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "node{n:03d}:{pid}:{tid} [{r}] NCCL INFO comm 0x5581c0a2d0 rank {r} nranks 16 cudaDev {r} nvmlDev {r} "
    "busId {c}0000 commId 0x8e4f1a2b3c4d5e6f - Init COMPLETE",
    "[rank{r}]:[W{mmdd} 12:0{c}:11.{tid} ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank {r}]  using GPU {r} "
    "to perform barrier as devices used by this process are currently unknown.",
    "{r}: [NeMo W 2025-01-01 12:00:{c:02d} nemo_logging:405] 'train_step_timing in s: 0.1' reported by "
    "rank {r} is ignored because the FLOPs callback is not configured",
    "{r}: /usr/local/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83: FutureWarning: "
    "`torch.distributed._all_gather_base` is a private function and will be deprecated.",
    "{r}:   warnings.warn(",
    "{r}: Epoch 0:  {c}%|##        | {c}/100 [00:{c:02d}<01:48, reduced_train_loss=10.9, global_step={c}.00]\r",
]


def generate(path: Path, size_bytes: int, fmt: str = "nemo2", seed: int = 0) -> int:
    """Write a log of about ``size_bytes``; return the number of progress steps written."""
    rng = random.Random(seed)
    # A pool of pre-formatted noise lines keeps generation fast; progress lines are formatted per step.
    pool = []
    for _ in range(4000):
        r = rng.randrange(16)
        pool.append(
            rng.choice(NOISE).format(
                n=r // 8,
                pid=rng.randrange(10**5),
                tid=rng.randrange(10**5),
                r=r,
                r2=(r + 1) % 16,
                c=rng.randrange(100),
                mmdd="0101",
            )
            + "\n"
        )
    written, step = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            block = rng.choices(pool, k=40)
            t = 2.5 * (1 + rng.gauss(0, 0.01))
            if fmt == "nemo2":
                block.append(
                    f"0: Training epoch 0, iteration {step}/999999 | lr: 3e-04 | global_batch_size: 256 | "
                    f"global_step: {step} | reduced_train_loss: {8.0:.4} | train_step_timing in s: {t:.4} | "
                    f"TFLOPS_per_GPU: {400.0 / t * 2.5:.4} | max_memory_allocated: {6.4e10:.4} | "
                    f"consumed_samples: {256 * (step + 1)}\n"
                )
            else:
                block.append(
                    f"15:  [2025-01-01 12:00:00] iteration {step:8d}/  999999 | consumed samples: {256 * step:12d} | "
                    f"elapsed time per iteration (ms): {t * 1000:.1f} | throughput per GPU (TFLOP/s/GPU): "
                    f"{400.0 / t * 2.5:.1f} | learning rate: 3.000000E-04 | global batch size:   256 | "
                    f"lm loss: 8.000000E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:"
                    f"   0 | number of nan iterations:   0 |\n"
                )
            s = "".join(block)
            f.write(s)
            written += len(s)
            step += 1
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1024.0, help="size of the generated log in MB (default 1024)")
    ap.add_argument("--format", choices=("nemo2", "megatron"), default="nemo2", help="progress-line format")
    ap.add_argument("--keep", type=Path, default=None, help="write the log here and keep it (default: temp file)")
    args = ap.parse_args()
    size = int(args.size_mb * 2**20)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "train.log"
        t0 = time.perf_counter()
        steps = generate(path, size, args.format)
        gen_s = time.perf_counter() - t0
        nbytes = os.path.getsize(path)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        m = parse_log(path, exit_code=0, context=ParseContext(gbs=256, seq_length=8192, num_gpus=16))
        dt = time.perf_counter() - t0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"log: {nbytes / 2**20:.0f} MiB, {steps} progress steps (generated in {gen_s:.1f} s)")
    print(f"parse: {dt:.2f} s = {nbytes / 2**20 / dt:.1f} MB/s (MiB/s) on one core")
    print(f"peak RSS growth while parsing: {(rss1 - rss0) / 1024:.1f} MiB")
    print(f"result: status={m.status} steps={m.steps} step_time_s={m.step_time_s} tflops={m.tflops_per_gpu}")


if __name__ == "__main__":
    main()
