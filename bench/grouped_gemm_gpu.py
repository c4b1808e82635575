"""Grouped expert GEMMs against one dense GEMM of the same FLOPs, on one GPU; prints figures, asserts nothing.

    python bench/grouped_gemm_gpu.py --run OUT.csv      # on the GPU machine (needs torch with CUDA): time them
    python bench/grouped_gemm_gpu.py                    # here: read bench/data/grouped_gemm_h200.csv, print each
                                                        # shape's efficiency per rows per expert and the rows per
                                                        # expert at half the dense rate that fit it best

What the model's ``grouped_gemm_efficiency(m, moe_gemm_m_half) = m / (m + m_half)`` claims, measured without the
host in the way: for MoE layer shapes of the shipped models (hidden size, expert FFN, the experts a GPU holds at
NVIDIA's expert parallelism), the forward GEMMs of the routed experts (fc1 with its gated double width, fc2) at
``m`` rows per expert, in bf16, several ways: one dense GEMM of ``E·m`` rows against one weight (the reference: the
same FLOPs in one launch), PyTorch's grouped GEMM (``torch._grouped_mm``, CUTLASS, what torchtitan's MoE runs),
one GEMM per expert in a loop (Megatron-Core's ``SequentialMLP``), and, where Transformer Engine is installed,
its ``GroupedLinear`` (what Megatron-Core's ``TEGroupedMLP`` and so NVIDIA's presets run; on Hopper it issues one
cuBLAS GEMM per expert over several streams), forward alone and forward with backward (data and weight
gradients: three times the forward's FLOPs). Times are CUDA events around ``reps`` calls after a warm-up, so a
launch-bound loop shows its launch gaps. ``--precision fp8`` times TE's layers under FP8 with current scaling
(NVIDIA's H100 FP8 presets' recipe; the dense reference is TE's ``Linear`` under the same recipe, and the
PyTorch columns stay empty).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "grouped_gemm_h200.csv"
# (name, hidden, expert FFN, experts a GPU holds): the shipped MoE models at NVIDIA's published EP, and the small
# MoE of the one-GPU runs
SHAPES = (
    ("qwen3_30b_a3b ep8", 2048, 768, 16),
    ("qwen3_235b_a22b ep8", 4096, 1536, 16),
    ("deepseek_v3 ep32", 7168, 2048, 8),
    ("gpt_oss_120b ep8", 2880, 2880, 16),
    ("small_moe ep1", 2048, 1408, 16),
)
ROWS_PER_EXPERT = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
COLUMNS = (
    "device",
    "precision",
    "shape",
    "hidden",
    "expert_ffn",
    "experts",
    "gemm",
    "m",
    "dense_ms",
    "grouped_ms",
    "loop_ms",
    "te_ms",
    "te_fwd_bwd_ms",
    "gflop",
)


def _time_ms(fn, reps: int) -> float:
    """Mean milliseconds of ``fn()`` over ``reps`` calls, CUDA events around all of them, after three warm-ups."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def _te_layer(e: int, k: int, n: int):
    """Transformer Engine's ``GroupedLinear`` of ``e`` experts ``k -> n`` in bf16, or None without TE."""
    try:
        import torch
        import transformer_engine.pytorch as te
    except ImportError:
        return None
    return te.GroupedLinear(e, k, n, bias=False, params_dtype=torch.bfloat16, device="cuda")


def _autocast(precision: str):
    """TE's FP8 autocast with current scaling for ``fp8``; no context for ``bf16``."""
    import contextlib

    if precision != "fp8":
        return contextlib.nullcontext()
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import Float8CurrentScaling

    return te.fp8_autocast(enabled=True, fp8_recipe=Float8CurrentScaling())


def _measure_te(layer, x, m: int, reps: int, label: str, precision: str = "bf16") -> tuple[float, float]:
    """Milliseconds of TE's ``GroupedLinear`` on ``x`` split ``m`` rows an expert: forward, forward + backward."""
    import torch

    if layer is None:
        return float("nan"), float("nan")
    splits = [m] * (x.shape[0] // m)
    xg = x.detach().requires_grad_(True)
    grad = torch.randn(x.shape[0], layer.out_features, device=x.device, dtype=x.dtype)

    def fwd_bwd():
        layer(xg, splits).backward(grad)

    # the autocast is entered once around all the calls, as a training step enters it once around its forward
    # (entered per call, FP8's context alone cost about 0.35 ms a call on an H100's host)
    try:
        with _autocast(precision):
            with torch.no_grad():
                t_fwd = _time_ms(lambda: layer(x, splits), reps)
            return t_fwd, _time_ms(fwd_bwd, max(3, reps // 3))
    except (RuntimeError, TypeError, ValueError) as exc:  # a shape this build refuses: record none
        print(f"  {label}: te.GroupedLinear failed: {str(exc).splitlines()[0]}")
        return float("nan"), float("nan")


def _measure(x, w, m: int, gflop: float, grouped, label: str) -> tuple[float, float, float]:
    """Milliseconds of three ways for input ``x`` (``E·m`` rows) and expert weights ``w`` (experts, out, in):
    one dense GEMM against the first expert's weight, ``torch._grouped_mm`` (NaN where it refuses), a loop."""
    import torch

    reps = max(5, min(200, int(2000 / max(gflop, 1e-3))))
    w0 = w[0]
    dense = _time_ms(lambda: x @ w0.t(), reps)
    g_ms = float("nan")
    if grouped is not None:
        offs = torch.arange(m, x.shape[0] + 1, m, device=x.device, dtype=torch.int32)
        wt = w.transpose(-2, -1)  # (experts, in, out), column-major as the kernel wants
        try:
            g_ms = _time_ms(lambda: grouped(x, wt, offs=offs), reps)
        except (RuntimeError, TypeError) as exc:  # an unsupported shape or build: record none
            print(f"  {label}: torch._grouped_mm failed: {str(exc).splitlines()[0]}")
    xs = x.split(m)
    loop = _time_ms(lambda: [xi @ w[i].t() for i, xi in enumerate(xs)], max(3, reps // 4))
    return dense, g_ms, loop


def _dense_fp8_ms(x, k: int, n: int, reps: int) -> float:
    """Milliseconds of TE's ``Linear`` ``k -> n`` on all of ``x`` under FP8 current scaling: the dense reference."""
    import torch
    import transformer_engine.pytorch as te

    dense = te.Linear(k, n, bias=False, params_dtype=torch.bfloat16, device="cuda")

    with _autocast("fp8"), torch.no_grad():
        return _time_ms(lambda: dense(x), reps)


def run(out: Path, precision: str = "bf16") -> None:
    """Time every shape, GEMM and rows per expert on the current CUDA device; write the CSV."""
    import torch

    dev = torch.device("cuda")
    grouped = getattr(torch, "_grouped_mm", None)
    device = torch.cuda.get_device_name(0)
    print(f"device {device}, torch {torch.__version__}, torch._grouped_mm: {bool(grouped)}")
    rows = []
    for name, h, f, e in SHAPES:
        for gemm, k, n in (("fc1", h, 2 * f), ("fc2", f, h)):
            w = torch.randn(e, n, k, device=dev, dtype=torch.bfloat16) * 0.02  # (experts, out, in), as nn.Linear
            layer = _te_layer(e, k, n)
            for m in ROWS_PER_EXPERT:
                total = e * m
                if total * max(k, n) * 2 > 8 * 2**30:  # keep each input under 8 GiB
                    continue
                x = torch.randn(total, k, device=dev, dtype=torch.bfloat16)
                gflop = 2.0 * total * k * n / 1e9
                label = f"{name} {gemm} m={m}"
                reps = max(5, min(200, int(2000 / max(gflop, 1e-3))))
                if precision == "fp8":
                    dense, g_ms, loop = _dense_fp8_ms(x, k, n, reps), float("nan"), float("nan")
                else:
                    dense, g_ms, loop = _measure(x, w, m, gflop, grouped, label)
                te_ms, te_fb = _measure_te(layer, x, m, reps, label, precision)
                values = (device, precision, name, h, f, e, gemm, m, dense, g_ms, loop, te_ms, te_fb, gflop)
                rows.append(dict(zip(COLUMNS, values, strict=True)))
                tf = gflop / 1e3
                print(
                    f"{name:22s} {gemm} m={m:5d}: dense {tf / dense * 1e3:7.1f} TFLOP/s, grouped "
                    f"{tf / g_ms * 1e3:7.1f}, loop {tf / loop * 1e3:7.1f}, TE {tf / te_ms * 1e3:7.1f}, "
                    f"TE fwd+bwd {3 * tf / te_fb * 1e3:7.1f}",
                    flush=True,
                )
                _write(out, rows)  # after every row: a call cut off by its time limit keeps what it measured
        torch.cuda.empty_cache()
    print(f"wrote {len(rows)} rows to {out}")


def _write(out: Path, rows: list[dict]) -> None:
    with open(out, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=COLUMNS)
        wr.writeheader()
        wr.writerows(rows)


def load(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        r["precision"] = r.get("precision") or "bf16"  # a CSV from before the precision column: bf16
        for k in ("hidden", "expert_ffn", "experts", "m"):
            r[k] = int(r[k])
        for k in ("dense_ms", "grouped_ms", "loop_ms", "te_ms", "te_fwd_bwd_ms", "gflop"):
            r[k] = float(r.get(k) or "nan")  # a CSV from before the TE columns: none measured
    return rows


def fit_m_half(ms: list[float], effs: list[float]) -> float:
    """The ``m_half`` of ``m / (m + m_half)`` that fits the efficiencies best (least squares in log efficiency;
    SciPy's bounded scalar minimiser)."""
    from scipy.optimize import minimize_scalar

    def cost(log_half: float) -> float:
        half = math.exp(log_half)
        return sum((math.log(m / (m + half)) - math.log(e)) ** 2 for m, e in zip(ms, effs, strict=True))

    return math.exp(minimize_scalar(cost, bounds=(0.0, math.log(1e5)), method="bounded").x)


def report(rows: list[dict]) -> dict[tuple[str, str, str], float]:
    """Per shape, GEMM, precision and kind (grouped, loop, te, te_fwd_bwd): the efficiency against the dense GEMM
    of the largest ``E·m`` measured for that shape's GEMM in that precision (the rate a dense GEMM reaches), per
    rows per expert, and the fitted ``m_half``; keyed ``(shape, gemm, kind)``, the kind suffixed ``_fp8`` for FP8."""
    fits: dict[tuple[str, str, str], float] = {}
    for prec, name, gemm in dict.fromkeys((r["precision"], r["shape"], r["gemm"]) for r in rows):
        sub = [r for r in rows if (r["precision"], r["shape"], r["gemm"]) == (prec, name, gemm)]
        peak = max(r["gflop"] / r["dense_ms"] for r in sub)  # GFLOP per ms = TFLOP/s
        print(f"{name} {gemm} {prec} (dense peak {peak:.0f} TFLOP/s): rows per expert -> efficiency of each way")
        for kind, flops in (("grouped", 1), ("loop", 1), ("te", 1), ("te_fwd_bwd", 3)):
            pts = [(r["m"], flops * r["gflop"] / r[f"{kind}_ms"] / peak) for r in sub if r[f"{kind}_ms"] > 0]
            pts = [(m, e) for m, e in pts if math.isfinite(e) and e > 0]
            if len(pts) < 3:
                continue
            half = fit_m_half([m for m, _ in pts], [min(e, 0.999) for _, e in pts])
            fits[(name, gemm, kind if prec == "bf16" else f"{kind}_{prec}")] = half
            cells = " ".join(f"{m}:{e:.2f}" for m, e in pts)
            print(f"  {kind:10s} {cells}  -> m_half {half:.0f}")
    return fits


def host_floor(rows: list[dict], precision: str = "bf16") -> tuple[float, float] | None:
    """The median over shapes and GEMMs of TE's ``GroupedLinear`` seconds per expert at the fewest rows per expert,
    forward and forward + backward: there the GPU's work is a few microseconds and the time is the host's launches
    (the floor a MoE layer pays per local expert and GEMM without a CUDA graph). None without TE timings."""
    rows = [r for r in rows if r["precision"] == precision]
    least = min((r["m"] for r in rows), default=None)
    sub = [r for r in rows if r["m"] == least and math.isfinite(r["te_ms"]) and math.isfinite(r["te_fwd_bwd_ms"])]
    if not sub:
        return None
    fwd = sorted(r["te_ms"] / r["experts"] / 1e3 for r in sub)
    fwd_bwd = sorted(r["te_fwd_bwd_ms"] / r["experts"] / 1e3 for r in sub)
    return fwd[len(fwd) // 2], fwd_bwd[len(fwd_bwd) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", metavar="OUT.csv", type=Path, help="time the GEMMs on this machine's GPU")
    ap.add_argument("--data", type=Path, default=DATA, help="the recorded CSV to read (default: %(default)s)")
    ap.add_argument(
        "--precision",
        choices=("bf16", "fp8"),
        default="bf16",
        help="with --run: bf16 (every way) or fp8 (TE's layers under FP8 current scaling; default %(default)s)",
    )
    args = ap.parse_args(argv)
    if args.run:
        run(args.run, args.precision)
        return 0
    if not args.data.is_file():
        print(f"bench/grouped_gemm_gpu.py: no recorded timings at {args.data}", file=sys.stderr)
        return 2
    rows = load(args.data)
    fits = report(rows)
    from dse.perfmodel import DEFAULT_PARAMS

    names = {"grouped": "torch._grouped_mm", "loop": "one GEMM per expert", "te": "TE GroupedLinear forward"}
    names["te_fwd_bwd"] = "TE GroupedLinear forward + backward"
    names["te_fp8"] = "TE GroupedLinear forward, FP8 current scaling (against TE's FP8 Linear)"
    names["te_fwd_bwd_fp8"] = "TE GroupedLinear forward + backward, FP8 current scaling"
    for kind, label in names.items():
        halves = sorted(v for (_, _, k), v in fits.items() if k == kind)
        if halves:
            print(
                f"{label}: rows per expert at half the dense rate {halves[0]:.0f}-{halves[-1]:.0f} "
                f"(median {halves[len(halves) // 2]:.0f})"
            )
    print(f"the model's fitted moe_gemm_m_half: {DEFAULT_PARAMS.moe_gemm_m_half:.0f}")
    for precision in ("bf16", "fp8"):
        floor = host_floor(rows, precision)
        if floor:
            fwd, fwd_bwd = floor
            print(
                f"TE GroupedLinear, {precision}, at {min(ROWS_PER_EXPERT)} rows per expert (launch-bound), per expert "
                f"and GEMM: forward {fwd * 1e6:.0f} us, forward + backward {fwd_bwd * 1e6:.0f} us"
            )
    print(f"the model's host time per expert, forward (fc1 + fc2): {DEFAULT_PARAMS.moe_host_expert_fwd_s * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
