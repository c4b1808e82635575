"""The parser's verdict by precedence, over a corpus of small logs built from real line formats
(tests/fixtures/logs/verdict): exit code and scheduler state first, then what ended the run, then the progress.

Each row is one log under one (exit code, scheduler state): a completed run that quoted OOM or NCCL words in
warnings, advice or reports is ``ok``; a failure is classified by what ended it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dse.logs.parse import parse_log

CORPUS = Path(__file__).parent / "fixtures" / "logs" / "verdict"
README = Path(__file__).parents[1] / "README.md"

# (file, exit code, scheduler state, status, a piece of the reason or None)
VERDICTS = [
    # NCCL's NVLS set-up prints "NCCL WARN Cuda failure 'out of memory'" and falls back: harmless
    ("nvls_warn_ok.log", 0, "COMPLETED", "ok", None),
    ("nvls_warn_ok.log", None, None, "ok", None),
    ("nvls_warn_ok.log", 0, "SUCCEEDED", "ok", None),
    # the allocator's advice, as a NeMo warning and as a plain print
    ("alloc_advice_ok.log", 0, "COMPLETED", "ok", None),
    ("alloc_advice_ok.log", None, None, "ok", None),
    # TE and torch warnings that quote "CUDA error: out of memory" and "torch.OutOfMemoryError"
    ("te_warning_ok.log", 0, "COMPLETED", "ok", None),
    ("te_warning_ok.log", None, None, "ok", None),
    # Megatron's theoretical-memory and memory-report lines
    ("megatron_memory_ok.log", 0, "COMPLETED", "ok", None),
    ("megatron_memory_ok.log", None, None, "ok", None),
    # an OOM a rank survived, before steps that went on: a clean end is ok; unknown, the OOM counts
    ("oom_survived_ok.log", 0, "COMPLETED", "ok", None),
    ("oom_survived_ok.log", None, None, "oom", "torch.OutOfMemoryError"),
    # the exit code and the scheduler's state come first
    ("nvls_warn_ok.log", 1, "FAILED", "failed", "scheduler state FAILED"),
    ("nvls_warn_ok.log", 137, None, "failed", "exit code 137"),
    ("nvls_warn_ok.log", None, "OUT_OF_MEMORY", "oom", "scheduler state OUT_OF_MEMORY"),
    ("nvls_warn_ok.log", None, "TIMEOUT", "timeout", "scheduler state TIMEOUT"),
    # failures, classified by what ended them
    ("slurm_oom_kill.log", 137, "OUT_OF_MEMORY", "oom", "oom-kill event"),
    ("slurm_oom_kill.log", None, None, "oom", "oom-kill event"),
    ("torch_oom_traceback.log", 1, "FAILED", "oom", "torch.OutOfMemoryError: CUDA out of memory. Tried"),
    ("torch_oom_traceback.log", None, None, "oom", "torch.OutOfMemoryError: CUDA out of memory. Tried"),
    ("cuda_error_oom.log", 134, "FAILED", "oom", "what():  CUDA error: out of memory"),
    ("cuda_error_oom.log", None, None, "oom", "CUDA error: out of memory"),
    ("nccl_watchdog_timeout.log", 1, "FAILED", "nccl_error", "Watchdog caught collective operation timeout"),
    ("nccl_watchdog_timeout.log", None, None, "nccl_error", "Watchdog caught collective operation timeout"),
    ("nccl_internal_error.log", 1, "FAILED", "nccl_error", "DistBackendError: NCCL error in:"),
    ("nccl_internal_error.log", None, None, "nccl_error", "DistBackendError"),
    # a missing file after the OOM advice and the NVLS warning: the exception that ended it
    ("missing_file_after_advice.log", 1, "FAILED", "failed", "FileNotFoundError: [Errno 2]"),
    ("missing_file_after_advice.log", None, None, "failed", "FileNotFoundError: [Errno 2]"),
    ("missing_file_after_advice.log", 0, "COMPLETED", "failed", "FileNotFoundError"),
]


def test_every_corpus_log_has_a_verdict():
    assert {f for f, *_ in VERDICTS} == {p.name for p in CORPUS.glob("*.log")}


@pytest.mark.parametrize(("name", "exit_code", "state", "status", "reason"), VERDICTS)
def test_verdict(name, exit_code, state, status, reason):
    m = parse_log(CORPUS / name, exit_code=exit_code, scheduler_state=state)
    assert m.status == status, m.reason
    if reason is None:
        assert m.reason is None
    else:
        assert reason in m.reason
    assert m.partial == (status != "ok" and m.steps > 0)


def test_completed_runs_keep_their_figures():
    m = parse_log(CORPUS / "nvls_warn_ok.log", exit_code=0, scheduler_state="COMPLETED")
    assert (m.steps, m.warmup_steps) == (8, 2)
    assert m.step_time_s == pytest.approx(4.2045)  # median of 4.215 4.198 4.207 4.231 4.189 4.202


def test_readme_is_not_a_failed_run():
    m = parse_log(README)
    assert m.status not in ("oom", "nccl_error"), m.reason
