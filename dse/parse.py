"""Log parsing (first cut: NeMo 2 progress lines; replaced by the hardened parser)."""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Iterable

STATUSES = ("ok", "oom", "nccl_error", "timeout", "failed", "no_metrics", "rejected")
_LINE = re.compile(r"^(?:\d+: )?Training epoch \d+, iteration \d+/\d+ \|(.*)$")


@dataclass(frozen=True)
class ParseContext:
    gbs: int | None = None
    seq_length: int | None = None
    num_gpus: int | None = None
    model_flops_per_step: float | None = None
    stall_timeout_s: float | None = None


@dataclass(frozen=True)
class RunMetrics:
    status: str
    reason: str | None = None
    step_time_s: float | None = None
    step_time_mean_s: float | None = None
    step_time_p10_s: float | None = None
    step_time_p90_s: float | None = None
    tflops_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    peak_memory_gib: float | None = None
    loss: float | None = None
    steps: int = 0
    partial: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)


def _num(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return v if v == v else None


def parse_log(source: str | os.PathLike | Iterable[str], *, exit_code: int | None = None,
              scheduler_state: str | None = None, context: ParseContext = ParseContext()) -> RunMetrics:
    lines = open(source, errors="replace") if isinstance(source, (str, os.PathLike)) else source
    times, tflops, mem, loss, oom = [], [], None, None, False
    try:
        for line in lines:
            if "OutOfMemoryError" in line or "CUDA out of memory" in line:
                oom = True
            m = _LINE.match(line.rstrip("\n"))
            if not m:
                continue
            fields = dict(p.split(": ", 1) for p in m.group(1).split(" | ") if ": " in p)
            fields = {k.strip(): v.strip() for k, v in fields.items()}
            if (t := _num(fields.get("train_step_timing in s", ""))) is not None:
                times.append(t)
                tflops.append(_num(fields.get("TFLOPS_per_GPU", "")))
            if (a := _num(fields.get("max_memory_allocated", ""))) is not None:
                mem = max(mem or 0.0, a / 2**30)
            loss = _num(fields.get("reduced_train_loss", "")) or loss
    finally:
        if hasattr(lines, "close"):
            lines.close()
    drop = max(2, -(-len(times) // 10))
    steady = times[drop:]
    st = statistics.median(steady) if steady else None
    tf = [x for x in tflops[drop:] if x is not None]
    c = context
    tok = c.gbs * c.seq_length / (st * c.num_gpus) if st and c.gbs and c.seq_length and c.num_gpus else None
    status, reason = "ok", None
    if oom:
        status, reason = "oom", "CUDA out of memory"
    elif exit_code not in (0, None):
        status, reason = "failed", f"exit code {exit_code}"
    elif st is None:
        status, reason = "no_metrics", "no progress line with a step time"
    return RunMetrics(status, reason, st, statistics.fmean(steady) if steady else None, None, None,
                      statistics.median(tf) if tf else None, tok, mem, loss, len(times),
                      partial=status != "ok" and bool(times))
