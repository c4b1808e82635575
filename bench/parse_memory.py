"""Peak memory of parsing two hostile logs: a dense log of progress lines (every line a new step) and a small
pack of logs holding one huge log (a high compression ratio). Each parse runs in a child process whose peak
resident set (``resource.getrusage``: the child's own, the parent never holds a log) is printed with the
log's size and the parse's time. The logs are
written under the temporary directory and removed afterwards. Prints figures; asserts nothing.

    python bench/parse_memory.py [--dense-mb 300] [--packed-mb 256]
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

# The child: parse one log the way `dse parse` reads it, then print its own peak RSS (KiB on Linux).
CHILD = """
import resource, sys
from pathlib import Path
from dse.logs.parse import parse_log
from dse.logs import logpack
src = Path(sys.argv[1])
if src.exists():
    m = parse_log(src)
else:  # a packed trial: streamed where this dse can (logpack.lines), else read whole as before
    lines = getattr(logpack, "lines", None)
    m = parse_log(lines(src) if lines else logpack.read(src).splitlines())
print(m.status, m.steps, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def dense_log(path: Path, size_mb: int) -> None:
    """Megatron progress lines, each a new iteration: the parser's per-step state is all that grows."""
    target = size_mb << 20
    with open(path, "w") as fh:
        it, written = 1, 0
        while written < target:
            block = "".join(
                f"iteration {i:>9}/ 900000000 | elapsed time per iteration (ms): {1000 + i % 97:.1f} | "
                f"throughput per GPU (TFLOP/s/GPU): {400 + i % 13:.1f} | lm loss: 2.0 |\n"
                for i in range(it, it + 10_000)
            )
            fh.write(block)
            written += len(block)
            it += 10_000


def packed_log(trials: Path, size_mb: int) -> Path:
    """A pack (``logs-00000-00000.tar.xz``) whose one member is a ``size_mb`` log of repeated NCCL lines and
    a few progress lines: xz shrinks it a thousandfold."""
    trials.mkdir(parents=True, exist_ok=True)
    line = b"node001:1234:5678 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
    progress = b"".join(
        f"iteration {i}/ 100 | elapsed time per iteration (ms): 1500.0 | lm loss: 2.0 |\n".encode()
        for i in range(1, 21)
    )
    body = line * ((size_mb << 20) // len(line)) + progress
    pack = trials / "logs-00000-00000.tar.xz"
    with tarfile.open(pack, "w:xz", preset=1) as tar:
        info = tarfile.TarInfo("00000/log.txt")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return pack


def make_pack(trials: Path, size_mb: int) -> Path:
    """:func:`packed_log` in a child process: Linux carries a process's peak RSS over fork and exec, so the
    parent that forks the measured children must never hold the log itself."""
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import parse_memory as m; "
    code += f"m.packed_log(__import__('pathlib').Path({str(trials)!r}), {size_mb})"
    subprocess.run([sys.executable, "-c", code], check=True)
    return trials / "logs-00000-00000.tar.xz"


def measure(source: Path) -> tuple[str, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, str(source)], check=True, capture_output=True, text=True)
    return out.stdout.strip(), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense-mb", type=int, default=300)
    ap.add_argument("--packed-mb", type=int, default=256)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dse-parse-memory-") as tmp:
        dense = Path(tmp) / "dense.log"
        dense_log(dense, args.dense_mb)
        got, s = measure(dense)
        status, steps, rss = got.split()
        print(
            f"dense log   {dense.stat().st_size / 2**20:7.0f} MB  {int(steps):>10,} steps  "
            f"peak RSS {int(rss) / 1024:7.0f} MiB  {s:6.1f} s  ({status})"
        )
        pack = make_pack(Path(tmp) / "trials", args.packed_mb)
        got, s = measure(Path(tmp) / "trials" / "00000")
        status, steps, rss = got.split()
        print(
            f"packed log  {args.packed_mb:7d} MB in a {pack.stat().st_size / 1024:.0f} KB pack  {int(steps):>4} steps  "
            f"peak RSS {int(rss) / 1024:7.0f} MiB  {s:6.1f} s  ({status})"
        )


if __name__ == "__main__":
    main()
