"""dse.logs.parse against golden fixture logs (tests/fixtures/logs) and small hand-written logs.

Expected figures are written out from the values the fixtures were made with, not read back from the
parser: a median here is the median of the listed step times after dropping the warm-up.
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics
from pathlib import Path

import pytest

from dse.logs.parse import STATUSES, ParseContext, RunMetrics, parse_log, parse_run
from dse.recipes.sim.logwriter import OOM_EXIT_CODE, SimRun, write_log

LOGS = Path(__file__).parent / "fixtures" / "logs"
GIB = 2**30


def steady(values: list[float]) -> list[float]:
    warm = max(2, math.ceil(0.1 * len(values)))
    return values[warm:]


def log(*lines: str) -> list[str]:
    return [line + "\n" for line in lines]


# The NeMo 2 fixture (nemo2_ok.log and its relatives) was written from these values.
NEMO_TIMES = [31.42, 9.874, 4.215, 4.198, 4.207, 4.231, 4.189, 4.202, 4.219, 4.193, 4.211, 4.205]
NEMO_TFLOPS = [139.2, 443.0, 1038.0, 1042.0, 1040.0, 1034.0, 1044.0, 1041.0, 1037.0, 1043.0, 1039.0, 1040.0]
NEMO_LOSS = [12.08, 11.93, 11.71, 11.32, 10.94, 10.61, 10.22, 9.874, 9.541, 9.207, 8.933, 8.702]
NEMO_ALLOC_B, NEMO_RESERVED_B = 6.443e10, 6.872e10


# ---------------------------------------------------------------------------------- every fixture
# (file, status, steps, partial, a piece of the reason)
FIXTURES = [
    ("nemo2_ok.log", "ok", 12, False, None),
    ("nemo2_nan_values.log", "ok", 10, False, None),
    ("interleaved_ranks.log", "ok", 12, False, None),
    ("exception_ignored.log", "ok", 12, False, None),
    ("megatron_lm_ok.log", "ok", 10, False, None),
    ("megatron_bridge_ok.log", "ok", 20, False, None),
    ("bridge_summary_only.log", "ok", 13, False, None),
    ("lightning_tqdm.log", "ok", 8, False, None),
    ("oom_torch.log", "oom", 4, True, "torch.OutOfMemoryError: CUDA out of memory"),
    ("oom_cuda_runtime.log", "oom", 0, False, "RuntimeError: CUDA out of memory"),
    ("oom_cuda_alloc.log", "oom", 1, True, "cudaErrorMemoryAllocation"),
    ("oom_host_kill.log", "oom", 3, True, "oom_kill event"),
    ("nccl_error.log", "nccl_error", 0, False, "NCCL error in:"),
    ("nccl_watchdog.log", "nccl_error", 4, True, "Watchdog caught collective operation timeout"),
    ("slurm_time_limit.log", "timeout", 6, True, "DUE TO TIME LIMIT"),
    ("traceback.log", "failed", 0, False, "ValueError: num_layers (80) must be divisible"),
    ("exited_exit_code.log", "failed", 6, True, "Exited with exit code 134"),
    ("cancelled.log", "failed", 5, True, "CANCELLED AT"),
    ("no_metrics.log", "no_metrics", 0, False, "no progress line"),
]


def test_every_fixture_is_listed():
    assert {f for f, *_ in FIXTURES} == {p.name for p in LOGS.glob("*.log")}


@pytest.mark.parametrize(("name", "status", "steps", "partial", "reason"), FIXTURES)
def test_fixture_status(name, status, steps, partial, reason):
    m = parse_log(LOGS / name)
    assert (m.status, m.steps, m.partial) == (status, steps, partial)
    if reason is None:
        assert m.reason is None
    else:
        assert reason in m.reason
    assert m.ok == (status == "ok")
    if status != "ok":  # a failed run is never a reward, whatever it printed
        assert not m.ok


@pytest.mark.parametrize(("name", "status", "steps", "partial", "reason"), FIXTURES)
def test_fixture_to_dict_is_json(name, status, steps, partial, reason):
    d = parse_log(LOGS / name).to_dict()
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert d["status"] == status


# ---------------------------------------------------------------------------------- NeMo 2
def test_nemo2_steady_state_figures():
    m = parse_log(LOGS / "nemo2_ok.log", context=ParseContext(gbs=128, seq_length=8192, num_gpus=16))
    times = steady(NEMO_TIMES)
    assert m.warmup_steps == 2
    assert m.step_time_s == pytest.approx(statistics.median(times))
    assert m.step_time_s == pytest.approx(4.206)
    assert m.step_time_mean_s == pytest.approx(statistics.fmean(times))
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    assert (m.step_time_p10_s, m.step_time_p90_s) == pytest.approx((deciles[0], deciles[-1]))
    assert m.tflops_per_gpu == pytest.approx(statistics.median(steady(NEMO_TFLOPS)))
    assert m.tflops_source == "log"
    assert m.tokens_per_s_per_gpu == pytest.approx(128 * 8192 / (4.206 * 16))
    assert m.peak_memory_gib == pytest.approx(NEMO_ALLOC_B / GIB)
    assert m.peak_memory_reserved_gib == pytest.approx(NEMO_RESERVED_B / GIB)
    assert m.loss == pytest.approx(NEMO_LOSS[-1])
    assert (m.log_format, m.last_iteration) == ("nemo2", 11)


def test_nemo2_exponent_format_is_read():
    m = parse_log(LOGS / "nemo2_ok.log")  # TFLOPS_per_GPU printed as 1.04e+03
    assert "TFLOPS_per_GPU: 1.04e+03" in (LOGS / "nemo2_ok.log").read_text()
    assert m.tflops_per_gpu == pytest.approx(1040.0)


def test_non_numeric_values_are_ignored_not_zero():
    m = parse_log(LOGS / "nemo2_nan_values.log")
    # iteration 3 prints nan and iteration 5 xxx: they drop out of the steady window, they are not 0
    assert m.step_time_s == pytest.approx(statistics.median([3.302, 3.297, 3.311, 3.289, 3.305, 3.299]))
    # TFLOPS_per_GPU 0.0, xxx and absent fields are ignored
    assert m.tflops_per_gpu == pytest.approx(statistics.median([741.0, 742.9, 740.7]))
    assert m.loss == pytest.approx(9.5)  # the last step's loss is nan; the last finite one is reported


def test_duplicate_progress_lines_of_several_ranks_count_once():
    a, b = parse_log(LOGS / "interleaved_ranks.log"), parse_log(LOGS / "nemo2_ok.log")
    assert a.steps == b.steps == 12
    assert a.step_time_s == b.step_time_s


def test_harmless_shutdown_traceback_is_not_a_failure():
    m = parse_log(LOGS / "exception_ignored.log", exit_code=0)
    assert m.status == "ok"
    assert m.step_time_s == pytest.approx(4.206)


# ---------------------------------------------------------------------------------- Megatron
MEG_MS = [18430.6, 6342.7, 6011.4, 6008.9, 6013.2, 6004.8, 6019.5, 6009.1, 6007.3, 6012.6]
MEG_TF = [133.4, 387.5, 408.9, 409.1, 408.8, 409.4, 408.4, 409.0, 409.2, 408.8]


def test_megatron_lm_figures():
    m = parse_log(LOGS / "megatron_lm_ok.log", context=ParseContext(gbs=512, seq_length=4096, num_gpus=16))
    assert m.step_time_s == pytest.approx(statistics.median(steady(MEG_MS)) / 1000)
    assert m.tflops_per_gpu == pytest.approx(statistics.median(steady(MEG_TF)))
    assert m.tokens_per_s_per_gpu == pytest.approx(512 * 4096 / (m.step_time_s * 16))
    # report_memory prints MiB; the largest rank's "max allocated" is the peak
    assert m.peak_memory_gib == pytest.approx(61877.36474609375 / 1024)
    assert m.peak_memory_reserved_gib == pytest.approx(66300.0 / 1024)
    assert m.loss == pytest.approx(6.110842)
    assert (m.log_format, m.last_iteration, m.steps) == ("megatron", 100, 10)


BR_MS = [
    96123.4,
    7312.8,
    6893.1,
    6882.4,
    6890.7,
    6875.9,
    6888.2,
    6901.3,
    6879.6,
    6884.0,
    6886.5,
    6893.8,
    6880.2,
    6887.7,
    6891.1,
    6878.3,
    6884.9,
    6889.5,
    6883.3,
    6886.1,
]
BR_TF = [
    71.6,
    941.3,
    998.6,
    1000.2,
    999.0,
    1001.1,
    999.3,
    997.4,
    1000.6,
    999.9,
    999.6,
    998.5,
    1000.5,
    999.4,
    998.9,
    1000.7,
    999.7,
    999.1,
    1000.0,
    999.6,
]


def test_megatron_bridge_takes_tflops_from_step_time_lines():
    m = parse_log(LOGS / "megatron_bridge_ok.log")
    assert m.step_time_s == pytest.approx(statistics.median(steady(BR_MS)) / 1000)  # ms from the iteration lines
    assert m.tflops_per_gpu == pytest.approx(statistics.median(steady(BR_TF)))
    # two memory reports glued on one line: rank 4's 61.208 GB (10^9 bytes) is the largest
    assert m.peak_memory_gib == pytest.approx(61.208e9 / GIB)
    assert m.peak_memory_reserved_gib == pytest.approx(66.7e9 / GIB)
    assert m.steps == 20


def test_bridge_summary_lines_alone():
    sm = [125.37, 6.13, 4.66, 10.69, 2.26, 3.54, 2.24, 2.22, 2.22, 2.22, 3.47, 2.23, 2.23]
    st = [20.9, 426.6, 561.8, 244.7, 1156.2, 738.3, 1165.6, 1179.6, 1177.2, 1178.7, 753.3, 1175.2, 1176.4]
    m = parse_log(LOGS / "bridge_summary_only.log")
    assert m.log_format == "megatron_bridge_summary"
    assert m.step_time_s == pytest.approx(statistics.median(steady(sm)))
    assert m.tflops_per_gpu == pytest.approx(statistics.median(steady(st)))
    assert m.peak_memory_gib == pytest.approx(61.2e9 / GIB)


def test_tqdm_refreshes_count_once_per_global_step():
    tq = [14.92, 3.181, 3.127, 3.133, 3.121, 3.129, 3.124, 3.136]
    m = parse_log(LOGS / "lightning_tqdm.log")
    assert (m.log_format, m.steps) == ("lightning_tqdm", 8)
    assert m.step_time_s == pytest.approx(statistics.median(steady(tq)))
    assert m.tflops_per_gpu is None  # the log has none and no model FLOPs were given


def test_tflops_computed_from_model_flops_when_the_log_has_none():
    ctx = ParseContext(num_gpus=8, model_flops_per_step=2.0e16)
    m = parse_log(LOGS / "lightning_tqdm.log", context=ctx)
    assert m.tflops_source == "model"
    assert m.tflops_per_gpu == pytest.approx(2.0e16 / (m.step_time_s * 8) / 1e12)
    # printed figures win over the model
    assert parse_log(LOGS / "nemo2_ok.log", context=ctx).tflops_source == "log"


# ---------------------------------------------------------------------------------- anchoring
NEMO_LINE = "Training epoch 0, iteration {i}/9 | global_step: {i} | train_step_timing in s: 2.5 | TFLOPS_per_GPU: 400"
MEG_LINE = " [2025-01-01 12:00:00] iteration {i:8d}/      10 | elapsed time per iteration (ms): 2500.0 |"


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "0: ",
        " 12: ",
        "[rank3]:",
        "[rank3]: ",
        "[default0]:",
        "[1,0]<stdout>:",
        "pretrain_llama3_8b/0 ",
        "0: [rank0]: ",
    ],
)
@pytest.mark.parametrize("template", [NEMO_LINE, MEG_LINE])
def test_launcher_prefixes_are_accepted(prefix, template):
    m = parse_log([prefix + template.format(i=i) + "\n" for i in range(5)])
    assert (m.status, m.steps, m.step_time_s) == ("ok", 5, pytest.approx(2.5))


@pytest.mark.parametrize(
    "prefix",
    [
        "[NeMo W 2025-01-01 12:00:00 nemo_logging:405] ",
        "WARNING: ",
        "quoted: '",
        "UserWarning: expected ",
        "INFO:root:",
    ],
)
@pytest.mark.parametrize("template", [NEMO_LINE, MEG_LINE])
def test_progress_text_mid_line_is_not_a_metric(prefix, template):
    m = parse_log([prefix + template.format(i=i) + "\n" for i in range(5)])
    assert (m.status, m.steps, m.step_time_s) == ("no_metrics", 0, None)


def test_carriage_returns_in_iterable_sources_split_lines():
    bar = "".join(f"\rEpoch 0: {i}/5 [00:0{i}, global_step={i}.000, train_step_timing in s=2.5]" for i in range(5))
    m = parse_log([bar + "\n"])
    assert (m.steps, m.step_time_s) == (5, pytest.approx(2.5))


def test_tqdm_bar_without_global_step_is_not_counted():
    bar = "".join(f"\rEpoch 0: {i}/5 [00:0{i}, train_step_timing in s=2.5]" for i in range(5))
    assert parse_log([bar + "\n"]).status == "no_metrics"


def test_validation_lines_are_not_training_steps():
    m = parse_log(
        log(
            "Validation: iteration 1/10",
            " validation loss at iteration 10 | lm loss value: 6.09E+00 |",
            "Sanity checking Validation: iteration 1/2",
        )
    )
    assert m.steps == 0


# ---------------------------------------------------------------------------------- warm-up rule
@pytest.mark.parametrize("n", [1, 2])
def test_all_warmup_gives_no_step_time(n):
    m = parse_log([NEMO_LINE.format(i=i) + "\n" for i in range(n)])
    assert (m.status, m.step_time_s, m.steps, m.warmup_steps) == ("no_metrics", None, n, n)
    assert "warm-up" in m.reason


@pytest.mark.parametrize(("n", "dropped"), [(3, 2), (20, 2), (21, 3), (25, 3), (100, 10)])
def test_warmup_drops_max_of_2_and_10_percent(n, dropped):
    times = [10.0 + i for i in range(n)]  # strictly increasing: the median shows which steps were dropped
    lines = [
        f"Training epoch 0, iteration {i}/{n} | global_step: {i} | train_step_timing in s: {t}\n"
        for i, t in enumerate(times)
    ]
    m = parse_log(lines)
    assert m.warmup_steps == dropped
    assert m.step_time_s == pytest.approx(statistics.median(times[dropped:]))


# ---------------------------------------------------------------------------------- status rules
OK_LINES = [NEMO_LINE.format(i=i) + "\n" for i in range(6)]


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("COMPLETED", "ok"),
        ("TIMEOUT", "timeout"),
        ("DEADLINE", "timeout"),
        ("OUT_OF_MEMORY", "oom"),
        ("CANCELLED", "failed"),
        ("CANCELLED by 4242", "failed"),
        ("CANCELLED+", "failed"),
        ("FAILED", "failed"),
        ("NODE_FAIL", "failed"),
        ("PREEMPTED", "failed"),
        ("BOOT_FAIL", "failed"),
        ("RUNNING", "ok"),
        ("completed", "ok"),
        # torchx AppState names, as nemo-run's LocalExecutor reports them (the local backend)
        ("SUCCEEDED", "ok"),
        ("UNKNOWN", "failed"),
    ],
)
def test_scheduler_states(state, status):
    m = parse_log(OK_LINES, exit_code=0 if status == "ok" else None, scheduler_state=state)
    assert m.status == status
    if status != "ok":
        assert state.split()[0].rstrip("+").upper() in m.reason
        assert m.partial and m.step_time_s == pytest.approx(2.5)  # kept, flagged, never the reward


@pytest.mark.parametrize("code", [1, 2, 134, 137, -9])
def test_nonzero_exit_code_fails(code):
    m = parse_log(OK_LINES, exit_code=code, scheduler_state="COMPLETED")
    assert (m.status, m.partial, m.exit_code) == ("failed", True, code)
    assert str(code) in m.reason


def test_completed_with_exit_0_and_no_progress_is_no_metrics():
    m = parse_log(log("GPU available: True (cuda), used: True"), exit_code=0, scheduler_state="COMPLETED")
    assert (m.status, m.partial) == ("no_metrics", False)


def test_traceback_fails_even_with_exit_code_0():
    m = parse_log(
        OK_LINES
        + log(
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in <module>',
            "    raise KeyError('lr')",
            "KeyError: 'lr'",
        ),
        exit_code=0,
    )
    assert (m.status, m.reason, m.partial) == ("failed", "KeyError: 'lr'", True)


def test_more_specific_class_beats_exit_code_and_scheduler():
    m = parse_log(LOGS / "oom_torch.log", exit_code=1, scheduler_state="FAILED")
    assert m.status == "oom"
    m = parse_log(LOGS / "nccl_error.log", exit_code=1, scheduler_state="FAILED")
    assert m.status == "nccl_error"


@pytest.mark.parametrize(
    ("lines", "status"),
    [
        # OOM on one rank, the others time out in NCCL: the OOM is the cause
        (
            [
                "[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1) ran for 600000 ms",
                "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            ],
            "oom",
        ),
        # a time limit kills all ranks; the survivors' aborted communicators are collateral
        (
            [
                "[rank9]: NCCL communicator was aborted on rank 9.",
                "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2025-01-01T00:00:00 DUE TO TIME LIMIT ***",
            ],
            "timeout",
        ),
        (
            ["Traceback (most recent call last):", "torch.distributed.DistBackendError: NCCL error in: x.cpp:1"],
            "nccl_error",
        ),
        (["srun: error: n1: task 0: Exited with exit code 1", "Segmentation fault (core dumped)"], "failed"),
    ],
)
def test_precedence(lines, status):
    assert parse_log(OK_LINES + log(*lines)).status == status


def test_oom_scheduler_state_with_clean_log():
    assert parse_log(OK_LINES, scheduler_state="OUT_OF_MEMORY").status == "oom"


def test_statuses_and_rejected():
    assert STATUSES == (
        "ok",
        "oom",
        "nccl_error",
        "timeout",
        "failed",
        "no_metrics",
        "rejected",
        "pruned",
        "screened",
    )
    r = RunMetrics.rejected("tp * pp * cp does not divide the GPU count")
    assert (r.status, r.step_time_s, r.steps, r.ok) == ("rejected", None, 0, False)
    s = RunMetrics.screened("predicted peak memory 90.0 GiB > 80 GiB GPU memory + 5% margin")
    assert (s.status, s.step_time_s, s.steps, s.ok, s.reason) == ("screened", None, 0, False, s.reason)
    with pytest.raises(ValueError, match="unknown status"):
        RunMetrics(status="success")


def test_missing_file_raises():
    with pytest.raises(FileNotFoundError):
        parse_log("/nonexistent/run/log.txt")


def test_parse_run_reads_a_run_result(tmp_path):
    from dse.backends.base import RunResult

    p = tmp_path / "log.txt"
    p.write_text("".join(OK_LINES))
    r = RunResult(run_dir=tmp_path, log_path=p, exit_code=0, scheduler_state="TIMEOUT")
    assert parse_run(r).status == "timeout"


def test_metrics_are_never_invented():
    m = parse_log(log("Training epoch 0, iteration 0/9 | global_step: 0 | reduced_train_loss: 11.2"))
    assert (m.step_time_s, m.tflops_per_gpu, m.tokens_per_s_per_gpu, m.peak_memory_gib) == (None,) * 4
    assert m.to_dict()["step_time_mean_s"] is None


# ---------------------------------------------------------------------------------- stall
MEG_TS = " [2025-01-01 12:{mm:02d}:00] iteration {i:8d}/     100 | elapsed time per iteration (ms): 60000.0 |\n"
STALL_LINES = [MEG_TS.format(mm=i, i=i + 1) for i in range(6)]  # last progress at 12:05:00
LAST = __import__("datetime").datetime(2025, 1, 1, 12, 5, 0).timestamp()


def test_stall_uses_last_progress_timestamp():
    ctx = ParseContext(stall_timeout_s=1800, now=LAST + 3600)
    m = parse_log(STALL_LINES, context=ctx)
    assert (m.status, m.partial) == ("timeout", True)
    assert "3600 s" in m.reason
    assert parse_log(STALL_LINES, context=ParseContext(stall_timeout_s=1800, now=LAST + 600)).status == "ok"
    assert parse_log(STALL_LINES, context=ParseContext(now=LAST + 3600)).status == "ok"  # no limit set


def test_stall_of_a_finished_run_is_judged_by_its_own_clock():
    killed = STALL_LINES + log("[2025-01-01 13:10:00] watchdog: killing the job (no progress)")
    m = parse_log(killed, exit_code=143, context=ParseContext(stall_timeout_s=1800))
    assert m.status == "timeout"
    m = parse_log(
        STALL_LINES + log("[2025-01-01 12:06:00] done"), exit_code=0, context=ParseContext(stall_timeout_s=1800)
    )
    assert m.status == "ok"


def test_stall_without_timestamps_uses_file_mtime(tmp_path):
    p = tmp_path / "log.txt"
    p.write_text("".join(OK_LINES))
    os.utime(p, (1_000_000, 1_000_000))
    ctx = ParseContext(stall_timeout_s=600, now=1_000_000 + 601)
    assert parse_log(p, context=ctx).status == "timeout"
    assert parse_log(p, context=ParseContext(stall_timeout_s=600, now=1_000_000 + 599)).status == "ok"


def test_nccl_watchdog_explains_a_stall():
    lines = STALL_LINES + log(
        "[rank7]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8) ran for "
        "600018 milliseconds before timing out."
    )
    assert parse_log(lines, context=ParseContext(stall_timeout_s=60, now=LAST + 3600)).status == "nccl_error"


# ---------------------------------------------------------------------------------- simulated trainer's log
def _sim(run: SimRun) -> tuple[int, list[str]]:
    buf = io.StringIO()
    code = write_log(run, buf)
    return code, buf.getvalue().splitlines(True)


def test_logwriter_log_parses_back_exactly_within_rounding():
    run = SimRun(step_time_s=3.217, tflops_per_gpu=612.4, gbs=512, max_steps=40, peak_memory_gib=71.3, jitter=0.0)
    code, lines = _sim(run)
    ctx = ParseContext(gbs=512, seq_length=8192, num_gpus=64)
    m = parse_log(lines, exit_code=code, context=ctx)
    assert (m.status, m.steps, m.partial, m.log_format) == ("ok", 40, False, "nemo2")
    rel = 5e-4  # {:.4} keeps four significant digits
    assert m.step_time_s == pytest.approx(run.step_time_s, rel=rel)
    assert m.tflops_per_gpu == pytest.approx(run.tflops_per_gpu, rel=rel)
    assert m.peak_memory_gib == pytest.approx(run.peak_memory_gib, rel=rel)
    assert m.peak_memory_reserved_gib == pytest.approx(run.peak_memory_gib * 1.05, rel=rel)
    assert m.tokens_per_s_per_gpu == pytest.approx(512 * 8192 / (run.step_time_s * 64), rel=rel)
    assert m.loss == pytest.approx(run.loss_start * math.exp(-0.02 * 39), abs=0.2)


def test_logwriter_with_jitter_parses_near_the_model_figure():
    run = SimRun(step_time_s=1.5, tflops_per_gpu=450.0, gbs=256, max_steps=60, peak_memory_gib=40.0, seed=7)
    code, lines = _sim(run)
    m = parse_log(lines, exit_code=code)
    assert m.status == "ok"
    assert m.step_time_s == pytest.approx(1.5, rel=3 * run.jitter)


def test_logwriter_oom_ending_is_oom_with_partial_metrics():
    run = SimRun(
        step_time_s=2.0, tflops_per_gpu=300.0, gbs=128, peak_memory_gib=95.0, gpu_memory_gib=80.0, oom=True, oom_after=5
    )
    code, lines = _sim(run)
    assert code == OOM_EXIT_CODE
    m = parse_log(lines, exit_code=code)
    assert (m.status, m.steps, m.partial, m.exit_code) == ("oom", 5, True, OOM_EXIT_CODE)
    assert "CUDA out of memory" in m.reason
    m0 = parse_log(_sim(SimRun(step_time_s=2.0, tflops_per_gpu=1.0, gbs=1, oom=True, oom_after=0))[1], exit_code=1)
    assert (m0.status, m0.steps, m0.partial) == ("oom", 0, False)


# ---------------------------------------------------------------------------------- robustness
def test_failure_gate_covers_every_marker():
    from dse.logs.parse import _FAIL_GATE, _NCCL_LINE_MARKS, _NCCL_MARKS, _OOM_EXC_MARKS, _OOM_MARKS, _SIGNAL_MARKS

    fixed = ("CANCELLED AT", "Traceback (most recent call last)", "Exited with exit code")
    for marker in _OOM_MARKS + _OOM_EXC_MARKS + _NCCL_MARKS + _NCCL_LINE_MARKS + _SIGNAL_MARKS + fixed:
        assert any(g in marker for g in _FAIL_GATE), marker


def test_benign_lines_of_healthy_runs_are_not_failures():
    benign = log(
        "[rank0]:[W611 09:14:40.1 ProcessGroupNCCL.cpp:1168] Warning: TORCH_NCCL_ASYNC_ERROR_HANDLING is deprecated "
        "in favor of TORCH_NCCL_ASYNC_ERROR_HANDLING (function operator())",
        "  check_for_nan_in_loss_and_grad .................. True",
        "  exit_on_missing_checkpoint ...................... False",
        "node017:2716433:2717902 [0] NCCL INFO NCCL_IB_TIMEOUT set by environment to 22; error retries 7",
        "node017:2716433:2717902 [0] NCCL WARN NET/IB : Got async event : GID table change",
        "[NeMo W 2025-06-11 09:14:02 nemo_logging:405] Could not import fused kernels; falling back (error: none)",
        "fault_tolerance: FaultToleranceConfig(enable=False)",
        "0: [rank0]:[W611 09:16:20.1 ProcessGroupNCCL.cpp:1496] Warning: process group has NOT been destroyed",
    )
    m = parse_log(OK_LINES + benign, exit_code=0, scheduler_state="COMPLETED")
    assert (m.status, m.reason) == ("ok", None)


def test_undecodable_bytes_do_not_stop_the_parse(tmp_path):
    p = tmp_path / "log.txt"
    p.write_bytes(b"\xff\xfe garbage \x80\n" + "".join(OK_LINES).encode() + b"\xc3\x28 more\n")
    m = parse_log(p)
    assert (m.status, m.steps) == ("ok", 6)


def test_nemo_lines_with_and_without_global_step_mix():
    lines = log(
        *(f"Training epoch 0, iteration {i}/9 | train_step_timing in s: 2.5" for i in range(4)),
        *(f"Training epoch 0, iteration {i}/9 | global_step: {i} | train_step_timing in s: 2.5" for i in range(4, 8)),
    )
    m = parse_log(lines)
    assert (m.status, m.steps, m.step_time_s) == ("ok", 8, pytest.approx(2.5))
