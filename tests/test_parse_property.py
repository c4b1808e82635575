"""Property test: values formatted exactly as the trainers print them parse back within rounding.

NeMo 2's ProgressPrinter prints ``{:.4}`` (``1.249e+03``) and integers for integral floats; Megatron prints
step time as ``{:.1f}`` ms, TFLOP/s as ``{:.1f}`` and the loss as ``{:.3E}`` (older) or ``{:.6E}``.
Rounding is monotonic, so the median of the printed values is the median of the true ones to within one
rounding step; the same holds for the loss of the last step.
"""

from __future__ import annotations

import math
import statistics

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dse.logs.parse import ParseContext, parse_log

PREFIXES = ["", "0: ", " 12: ", "[rank3]:", "[default0]:", "[1,0]<stdout>:", "job/0 ", "3: [rank3]: "]
NOISE = [
    "node017:2716433:2717902 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/CUMEM/read",
    "[NeMo W 2025-06-11 09:15:41 nemo_logging:405] train_step_timing in s: 0.001 | TFLOPS_per_GPU: 1",
    "UserWarning: Training epoch 0, iteration 3/9 | train_step_timing in s: 0.001",
    "note: iteration 5/ 10 | elapsed time per iteration (ms): 0.1 | (quoted)",
    "Epoch 0:  10%|#         | 1/10 [00:01<00:09]",
    "",
]


def nemo_fmt(x: float) -> str:
    """ProgressPrinter.format_string: an integral float prints as int, anything else as {:.4}."""
    return str(int(x)) if float(x).is_integer() else f"{x:.4}"


def rel_err_4(x: float) -> float:
    """Largest error of {:.4}: half a unit in the fourth significant digit."""
    return 0.5 * 10 ** (math.floor(math.log10(abs(x))) - 3) * 1.0000001


times_st = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
tflops_st = st.floats(min_value=1.0, max_value=5000.0, allow_nan=False, allow_infinity=False)
loss_st = st.floats(min_value=0.5, max_value=20.0, allow_nan=False, allow_infinity=False)
mem_st = st.floats(min_value=1e8, max_value=2e11, allow_nan=False, allow_infinity=False)


@st.composite
def runs(draw, min_ms: float = 0.0):
    n = draw(st.integers(min_value=3, max_value=40))
    ts = draw(st.lists(times_st.filter(lambda t: t * 1000 >= min_ms), min_size=n, max_size=n))
    tf = draw(st.lists(tflops_st, min_size=n, max_size=n))
    loss = draw(st.lists(loss_st, min_size=n, max_size=n))
    mem = draw(st.lists(mem_st, min_size=n, max_size=n))
    prefix = draw(st.sampled_from(PREFIXES))
    noise = draw(st.lists(st.sampled_from(NOISE), min_size=n, max_size=n))
    return ts, tf, loss, mem, prefix, noise


def steady(xs):
    return xs[max(2, math.ceil(0.1 * len(xs))) :]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(runs(), st.randoms(use_true_random=False))
def test_nemo2_values_round_trip(run, rnd):
    ts, tf, loss, mem, prefix, noise = run
    lines = []
    for i, (t, f, lo, me) in enumerate(zip(ts, tf, loss, mem)):
        fields = [
            f"lr: {nemo_fmt(3e-4)}",
            "global_batch_size: 256",
            f"global_step: {i}",
            f"reduced_train_loss: {nemo_fmt(lo)}",
            f"train_step_timing in s: {nemo_fmt(t)}",
            f"TFLOPS_per_GPU: {nemo_fmt(f)}",
            f"max_memory_allocated: {nemo_fmt(me)}",
            f"consumed_samples: {256 * (i + 1)}",
        ]
        rnd.shuffle(fields)  # fields come in any order
        lines.append(f"{prefix}Training epoch 0, iteration {i}/{len(ts) - 1} | " + " | ".join(fields) + "\n")
        lines.append(noise[i] + "\n")
    m = parse_log(lines, exit_code=0, context=ParseContext(gbs=256, seq_length=4096, num_gpus=8))
    assert (m.status, m.steps, m.log_format) == ("ok", len(ts), "nemo2")
    med = statistics.median(steady(ts))
    assert abs(m.step_time_s - med) <= rel_err_4(max(steady(ts)))
    assert abs(m.tflops_per_gpu - statistics.median(steady(tf))) <= rel_err_4(max(steady(tf)))
    assert abs(m.loss - loss[-1]) <= rel_err_4(loss[-1])
    assert abs(m.peak_memory_gib - max(mem) / 2**30) <= rel_err_4(max(mem)) / 2**30
    assert m.tokens_per_s_per_gpu == 256 * 4096 / (m.step_time_s * 8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(runs(min_ms=1.0), st.sampled_from(["{:.3E}", "{:.6E}"]), st.booleans())
def test_megatron_values_round_trip(run, loss_fmt, with_ts):
    ts, tf, loss, _, prefix, noise = run
    lines = []
    for i, (t, f, lo) in enumerate(zip(ts, tf, loss)):
        stamp = "[2025-03-02 11:20:44] " if with_ts else ""
        lines.append(
            f"{prefix} {stamp}iteration {i + 1:8d}/{len(ts):8d} | consumed samples: {512 * (i + 1):12d} | "
            f"elapsed time per iteration (ms): {t * 1000:.1f} | throughput per GPU (TFLOP/s/GPU): {f:.1f} | "
            f"learning rate: {3e-4:.6E} | global batch size: {512:5d} | lm loss: {loss_fmt.format(lo)} | "
            f"loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
        )
        lines.append(noise[i] + "\n")
    m = parse_log(lines, exit_code=0)
    assert (m.status, m.steps, m.log_format, m.last_iteration) == ("ok", len(ts), "megatron", len(ts))
    assert abs(m.step_time_s - statistics.median(steady(ts))) <= 0.05e-3 * 1.0000001 + 1e-12
    assert abs(m.tflops_per_gpu - statistics.median(steady(tf))) <= 0.05 * 1.0000001
    digits = 3 if loss_fmt == "{:.3E}" else 6
    assert abs(m.loss - loss[-1]) <= 0.5 * 10 ** (math.floor(math.log10(loss[-1])) - digits) * 1.0000001


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(min_value=0.01, max_value=500.0), min_size=3, max_size=30),
    st.lists(tflops_st, min_size=30, max_size=30),
)
def test_bridge_summary_values_round_trip(ts, tf):
    lines = [f"Step Time : {t:.2f}s GPU utilization: {f:.1f}MODEL_TFLOP/s/GPU\n" for t, f in zip(ts, tf)]
    m = parse_log(lines)
    assert (m.status, m.steps) == ("ok", len(ts))
    assert abs(m.step_time_s - statistics.median(steady(ts))) <= 0.005 * 1.0000001
    assert abs(m.tflops_per_gpu - statistics.median(steady(tf[: len(ts)]))) <= 0.05 * 1.0000001
