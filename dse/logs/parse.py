"""Read one training log into :class:`RunMetrics`: how the run ended, and its steady-state performance.

The reward is only as good as this parser, so it is strict about what counts:

* **Progress lines** are recognised only when the line *starts* with one (after launcher prefixes such as
  ``0: ``, `` 12: ``, ``[rank3]:``, ``[default0]:``, ``[1,0]<stdout>:`` or a ``name/0 `` task label).
  A warning that quotes ``train_step_timing in s:`` mid-line is not a metric. Formats:

  - NeMo 2 ``ProgressPrinter``: ``Training epoch E, iteration i/N | lr: ... | reduced_train_loss: ... |
    train_step_timing in s: ... | TFLOPS_per_GPU: ... | max_memory_allocated: ...`` (values in ``{:.4}``
    format, fields in any order, any of them absent; memory in bytes).
  - Megatron-LM / Megatron-Bridge ``training_log``: ``[ts] iteration i/ N | consumed samples: ... |
    elapsed time per iteration (ms): x | throughput per GPU (TFLOP/s/GPU): y | ... | lm loss: z |``.
  - Megatron-Bridge summary lines ``Step Time : 1.23s GPU utilization: 456.7MODEL_TFLOP/s/GPU`` (used for
    step time only when a log has no iteration lines, and for TFLOP/s when the iteration lines lack it).
  - Lightning tqdm bars (``Epoch 0: 10%|... [..., global_step=9.000, train_step_timing in s=1.23]``), the
    last resort, one step per distinct ``global_step``.
  - Memory: ``[Rank 0] (after 10 iterations) memory (MB) | ... | max allocated: ... | max reserved: ...``
    (MiB), ``... memory (GB) | mem-max-allocated-gigabytes: ... | mem-max-reserved-gigabytes: ...`` (GB,
    10^9 bytes) and stand-alone ``mem-max-allocated-gigabytes: 61.2`` lines.

* **Values** that are not finite positive numbers (``xxx``, ``nan``, ``inf``, ``0``) are ignored, never
  read as zero. Duplicate progress lines (several ranks printing the same iteration) count once.
  A figure beyond :data:`PLAUSIBLE_MAX` (a step time of more than a week, ``1e308``) is a broken log or a
  wrong unit: the run is ``no_metrics`` with that figure in its reason (the study goes on).

* **Steady state**: the first ``max(2, ceil(10 % of steps))`` logged steps are warm-up and dropped; the
  reward uses the median step time of the rest (mean, p10 and p90 are reported too). A run whose logged
  steps are all warm-up has no step time.

* **Peak memory** is the largest *allocated* peak seen on any rank and step (``max_memory_allocated``,
  ``max allocated``, ``mem-max-allocated-gigabytes``), in GiB: that is the tensors' demand, which is what
  decides whether a layout fits and what the performance model predicts; the allocator's reserved peak
  (caching, fragmentation) is reported separately as ``peak_memory_reserved_gib``. When a log gives only
  reserved figures, ``peak_memory_gib`` is None.

* **Status**, by precedence: how the run ended, then what ended it, then its progress.

  1. **Exit code and scheduler state.** A clean end is exit code 0 (or an unknown one with ``COMPLETED``,
     Slurm's, or ``SUCCEEDED``, torchx's as nemo-run's local executor reports it). After a clean end only
     the evidence *after the last progress line* counts: a run that stepped on past an error survived it.
     Otherwise (a non-zero exit code, a failing state, or neither known, as in a bare ``dse parse FILE``)
     all the evidence counts. The state ``OUT_OF_MEMORY`` is oom evidence and ``TIMEOUT``/``DEADLINE``
     time-limit evidence (ranked in the chain below); ``CANCELLED``, ``FAILED``, ``NODE_FAIL``, ``PREEMPTED``,
     ``BOOT_FAIL``, any other final state and a non-zero exit code make the run failed when the evidence
     names nothing more specific.
  2. **What ended the run** (evidence), root cause first::

         oom > timeout (time limit, scheduler) > nccl_error > timeout (stall) > failed

     Evidence is only what ends a run: an exception line (the last traceback's is the ``failed`` reason;
     ``torch.OutOfMemoryError``, ``... out of memory``, ``cudaErrorMemoryAllocation`` -> oom; ``NCCL error``,
     ``ncclInternalError``, ``ncclSystemError``, ``DistBackendError`` -> nccl_error), C++'s ``what():`` line,
     the scheduler's OOM kill (``oom-kill event``, ``Out Of Memory``), ``CUDA error: out of memory``, NCCL's
     watchdog timeout and aborted communicators, ``DUE TO TIME LIMIT``, ``CANCELLED AT``, ``Exited with exit
     code N``, signals. Warnings (``NCCL WARN``, such as NVLS set-up's harmless ``Cuda failure 'out of
     memory'``; ``UserWarning``; torch's ``[W...]``; ``[NeMo W``), the allocator's advice and memory reports
     are never evidence, whatever words they quote. An OOM on one rank makes the others hang or fail in
     NCCL, so OOM wins; a Slurm time limit kills every rank and the survivors report aborted communicators,
     so the time limit wins over NCCL errors; a stall that ended in an NCCL watchdog timeout is explained by
     the watchdog, so NCCL wins over the stall. A traceback announced by ``Exception ignored in`` (printed at
     shutdown for harmless errors) is no evidence.
  3. **Progress**: ``ok`` with a steady-state step time, else ``no_metrics``.

  A failed run is never ``ok``; its metrics are kept with ``partial=True``. ``rejected`` is never produced
  here: it is for configurations the constraint checker refused before launch (:meth:`RunMetrics.rejected`).

* **Stall** (``ParseContext.stall_timeout_s``): the run is a ``timeout`` when the time since its last
  progress exceeds the limit. "Last progress" is the timestamp of the last progress line when the lines
  carry one (Megatron's ``[2025-01-01 12:00:00]``), else the log file's mtime (any output counts as life
  then). "Now" is ``ParseContext.now`` when given; else the clock for a run not known to have ended
  (no exit code, no final scheduler state); else the last timestamp printed anywhere in the log (so a run
  that hung and was then killed with a timestamped message is judged by its own clock). Timestamps in a
  log are read as local time.

Parsing streams line by line, and memory is bounded: each line is read to at most :data:`MAX_LINE`
characters, each log format keeps its last :data:`MAX_STEPS` steps (a longer log is judged on those, the
warm-up still counted over all of its steps), and integers are read from at most 12 digits.
"""

from __future__ import annotations

import codecs
import gzip
import math
import os
import re
import statistics
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from enum import StrEnum

from dse.recipes import contract


class Status(StrEnum):
    """A trial's status. All but ``INTERRUPTED`` are outcomes (:data:`STATUSES`: a :class:`RunMetrics`' status):
    how its run ended, or why none was launched (``REJECTED`` by a rule or the backend, ``SCREENED``: a valid point
    the memory screen kept from launch, neither ok nor a launched failure). ``INTERRUPTED`` is a trial with no
    outcome: the row of a launched trial until its result comes (what a Ctrl-C or a killed dse leaves; a resume
    runs it again); a study's store holds it, no run ends with it."""

    OK = "ok"
    OOM = "oom"
    NCCL_ERROR = "nccl_error"
    TIMEOUT = "timeout"
    FAILED = "failed"
    NO_METRICS = "no_metrics"
    REJECTED = "rejected"
    PRUNED = "pruned"
    SCREENED = "screened"
    INTERRUPTED = "interrupted"


#: The outcomes of a trial (a run's status), as text.
STATUSES = tuple(s.value for s in Status if s is not Status.INTERRUPTED)
#: Statuses of points never launched: they cost nothing and count for no launched run.
UNLAUNCHED_STATUSES = (Status.REJECTED.value, Status.SCREENED.value)

#: Statuses of runs that ended badly; their metrics are partial and never a reward.
FAILURE_STATUSES = (Status.OOM.value, Status.TIMEOUT.value, Status.NCCL_ERROR.value, Status.FAILED.value)

_GIB = float(2**30)
_REASON_MAX = 240

# --------------------------------------------------------------------------------------------- regexes
# Compiled once. Each is applied only to lines that passed a cheap substring test.

# Launcher prefixes, possibly stacked: srun --label ("0: ", " 12: "), torchrun ("[rank3]:", "[default0]:"),
# mpirun --tag-output ("[1,0]<stdout>:"), task labels ("pretrain_llama/0 ").
_PREFIX = r"(?:\s*(?:\d{1,12}:|\[(?:rank|default)\d{1,12}\]:|\[\d{1,12},\d{1,12}\]<std(?:out|err)>:|[\w.\-]+/\d{1,12}(?=\s)))*\s*"
_TS = r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{1,12})?\]\s*"

_MEGATRON_RE = re.compile(
    _PREFIX + r"(?:" + _TS + r")?iteration\s+(?P<it>\d{1,12})/\s*(?P<total>\d{1,12})\s*\|(?P<rest>.*)"
)
_NEMO_RE = re.compile(
    _PREFIX + r"Training epoch (?P<epoch>\d{1,12}), iteration (?P<it>\d{1,12})/(?P<total>\d{1,12})(?P<rest>.*)"
)
_STEP_TIME_RE = re.compile(
    _PREFIX + r"Step Time\s*:\s*(?P<t>\S+?)s\s+GPU utilization:\s*(?P<tf>[^\sM]+)\s*MODEL_TFLOP/s/GPU"
)
_TQDM_RE = re.compile(_PREFIX + r"Epoch \d{1,12}:.*\[(?P<post>[^\[\]]*train_step_timing in s=[^\[\]]*)\]")
_MEM_HEADER_RE = re.compile(r"\[Rank \d{1,12}\] \(after \d{1,12} iterations\) memory \((?P<unit>MB|GB)\)")
_MEM_STANDALONE_RE = re.compile(_PREFIX + r"mem-")
_ANY_TS_RE = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")
# The exception line that ends a traceback: "RuntimeError: ...", "torch.OutOfMemoryError: ...", "KeyboardInterrupt".
_EXC_LINE_RE = re.compile(
    _PREFIX + r"(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)(?::.*)?)$"
)
_PREFIX_RE = re.compile(_PREFIX)


@dataclass(frozen=True)
class LogFormat:
    """One log format's scanner: lines that contain ``gate`` and match ``pattern`` are progress lines, read by
    the ``_Scan`` method named ``reader`` into that format's step series. ``primary`` formats print one line per
    iteration (the longest series wins); the others are fallbacks, taken in table order when no primary one
    printed. A new format is one row here, its reader, and its fixtures."""

    name: str  # RunMetrics.log_format
    gate: str  # a cheap substring test before the regex
    pattern: re.Pattern
    reader: str
    primary: bool = True


LOG_FORMATS: tuple[LogFormat, ...] = (
    LogFormat("megatron", "iteration", _MEGATRON_RE, "_megatron"),  # Megatron-LM / Megatron-Bridge
    LogFormat("nemo2", "iteration", _NEMO_RE, "_nemo"),  # NeMo 2 / Lightning progress lines
    LogFormat("megatron_bridge_summary", "Step Time", _STEP_TIME_RE, "_step_time", primary=False),
    LogFormat("lightning_tqdm", "train_step_timing in s=", _TQDM_RE, "_tqdm", primary=False),
)

# Failure markers, checked by substring (a regex alternation over them costs ~15 us a line, these ~1 us). Only
# what ends a run counts: an exception line (``torch.OutOfMemoryError: ...``) or an error line of the scheduler,
# the CUDA runtime or NCCL's watchdog; advice, warnings and reports that quote the words never do.
# On an exception line (``_EXC_LINE_RE``): these make the exception an OOM.
_OOM_EXC_MARKS = ("out of memory", "OutOfMemoryError", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED")
# On any line that is not a warning: the scheduler's OOM kill, the CUDA runtime's own error message.
_OOM_MARKS = (
    "CUDA error: out of memory",
    "CUDA Error: out of memory",
    "oom_kill event",
    "oom-kill event",
    "oom-kill:",
    ": Out Of Memory",
)
# Warnings (NCCL's ``NCCL WARN`` such as the NVLS set-up's harmless ``Cuda failure 'out of memory'``, torch's
# ``[W...]``, Python's ``UserWarning``, NeMo's ``[NeMo W``): never evidence of how a run ended.
_WARN_MARKS = ("WARN", "Warning", "warn(", "[W", "[NeMo W")
_NCCL_MARKS = (
    "NCCL error",
    "ncclSystemError",
    "ncclInternalError",
    "ncclUnhandledCudaError",
    "ncclRemoteError",
    "ncclInvalidUsage",
    "ncclInvalidArgument",
    "Watchdog caught collective operation timeout",
    "NCCL communicator was aborted",
    "DistBackendError",
)
# On any line that is not a warning: NCCL's watchdog and aborted communicators (the others only on exception lines).
_NCCL_LINE_MARKS = ("Watchdog caught collective operation timeout", "NCCL communicator was aborted")
_SIGNAL_MARKS = ("Segmentation fault", "(core dumped)", "Fatal Python error")
_EXITED_RE = re.compile(r"Exited with exit code (\d{1,12})")
# Gate in front of the markers: every marker contains one of these substrings.
_FAIL_GATE = (
    "rror",
    "out of memory",
    "ALLOC_FAILED",
    "oom_kill",
    "oom-kill",
    "Out Of Memory",
    "nccl",
    "Watchdog",
    "aborted",
    "CANCELLED",
    "Traceback",
    "xit code",
    "fault",
    "core dumped",
    "Fatal Python",
)

_NEMO_STEP_KEYS = ("train_step_timing in s",)
_NEMO_TFLOPS_KEYS = ("TFLOPS_per_GPU", "tflops_per_sec_per_gpu")
_NEMO_LOSS_KEYS = ("reduced_train_loss", "lm loss", "loss")
_MEG_STEP_KEY = "elapsed time per iteration (ms)"
_MEG_TFLOPS_KEY = "throughput per GPU (TFLOP/s/GPU)"
_MEG_LOSS_KEYS = ("lm loss", "loss")

# Scheduler end states from the controller-payload contract (one table with the Slurm backend's)
_SCHED_TIMEOUT = {s for s, st in contract.SCHEDULER_END_STATES.items() if st == "timeout"}
_SCHED_OOM = {s for s, st in contract.SCHEDULER_END_STATES.items() if st == "oom"}
# A clean end: Slurm's COMPLETED, and torchx's SUCCEEDED (the AppState nemo-run's local executor reports)
_SCHED_DONE = set(contract.CLEAN_END_STATES)
_SCHED_RUNNING = {"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


# ------------------------------------------------------------------------------------------ public types
@dataclass(frozen=True)
class ParseContext:
    """What the log cannot say but the trial knows: batch, sequence, GPUs, model FLOPs, stall limit.

    ``now`` (seconds since the epoch) fixes the reference time of the stall check, for tests and replays.
    """

    gbs: int | None = None
    seq_length: int | None = None
    num_gpus: int | None = None
    model_flops_per_step: float | None = None
    stall_timeout_s: float | None = None
    now: float | None = None


@dataclass(frozen=True)
class RunMetrics:
    """The outcome of one run. Invariants: ``status`` is one of :data:`STATUSES`; a metric the log did
    not give is None (never 0); ``partial`` is True exactly when a failed or pruned run printed some steps."""

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
    # Beyond the core interface: provenance, for the report and for debugging a surprising figure.
    log_format: str | None = None
    warmup_steps: int = 0
    last_iteration: int | None = None
    peak_memory_reserved_gib: float | None = None
    tflops_source: str | None = None  # "log" (as printed) or "model" (context.model_flops_per_step)
    exit_code: int | None = None
    # the run's wall time (set by dse.execute.run_trial, not by the parser): the backend's own figure where it
    # simulates one, else the clock around the run; the trial's GPU-hours come from it
    wall_s: float | None = None
    # early stop (dse.logs.steady, set by dse.execute.run_trial): the run was stopped once its steady-state step
    # time had converged; ``steps`` is then the steps it ran, and ``gpu_hours_saved`` what running on to
    # ``max_steps`` at the measured step time would have cost more
    early_stopped: bool = False
    gpu_hours_saved: float | None = None
    # pruned runs (status "pruned", dse.logs.steady.Prune): the objective's metric at the bound on the median step
    # time that is best for the trial, worse than the study's best (``prune_best``) by more than the margin;
    # the agents' reward comes from it (dse.reward), never from the partial estimate as if it were complete
    prune_bound: float | None = None
    prune_best: float | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {STATUSES}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        """JSON-ready: plain str/int/float/bool/None, non-finite floats as None."""
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, float) and not math.isfinite(v):
                out[k] = None
        return out

    @classmethod
    def rejected(cls, reason: str) -> RunMetrics:
        """The metrics of a configuration refused before launch (nothing ran)."""
        return cls(status="rejected", reason=reason)

    @classmethod
    def screened(cls, reason: str) -> RunMetrics:
        """The metrics of a valid point the memory screen kept from launch (nothing ran)."""
        return cls(status="screened", reason=reason)


# ------------------------------------------------------------------------------------------ helpers
def _num(text: str | None) -> float | None:
    """A finite float from ``text``, or None for anything else (``xxx``, ``nan``, ``inf``, empty)."""
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _pos(text: str | None) -> float | None:
    v = _num(text)
    return v if v is not None and v > 0 else None


#: The largest figure a log may print for each metric, far beyond any real run (a week-long step, 100 PFLOP/s on
#: one GPU, 100 TiB of memory on one GPU, a batch of 2**40 sequences): a larger one is a broken log or a wrong
#: unit, and the run's figures are not trusted (status ``no_metrics``, the value in the reason), so statistics
#: over them cannot overflow either.
PLAUSIBLE_MAX = {
    "step time (s)": 7 * 86400.0,
    "TFLOP/s per GPU": 1e5,
    "memory (GiB)": 1e5,
    "global batch size": float(2**40),
}
#: A ``global_step`` above this is not a step (integers are read from at most 12 digits elsewhere too).
_MAX_STEP = 10**12


def _fields(rest: str, sep: str = "|", kv: str = ":") -> dict[str, str]:
    out: dict[str, str] = {}
    for part in rest.split(sep):
        k, found, v = part.partition(kv)
        if found:
            out[k.strip()] = v.strip()
    return out


def _first(d: dict[str, str], keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if k in d:
            return d[k]
    return None


# Control characters (C0 but tab, DEL, C1): a log's BEL, ANSI escape or carriage return must never reach a terminal
# or a CSV cell raw from a reason; they are written as \xNN.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with its control characters written as ``\\xNN`` escapes (a reason is shown as it was logged,
    never as a terminal would act on it)."""
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def _clip(line: str) -> str:
    s = printable(line.strip())
    return s if len(s) <= _REASON_MAX else s[: _REASON_MAX - 3] + "..."


def _strip_prefix(line: str) -> str:
    return _PREFIX_RE.sub("", line, count=1)  # _PREFIX matches at the start, the empty prefix included


def _parse_ts(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        return None


def _lines(source: str | os.PathLike | Iterable[str]) -> tuple[Iterable[str], str | None]:
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        # Universal newlines turn each tqdm '\r' refresh into its own line; bad bytes never stop a parse.
        if path.endswith(".gz") and _is_gzip(path):  # compressed (the simulated backend keeps its runs small)
            fh = gzip.open(path, "rt", encoding="utf-8", errors="replace", newline=None)  # noqa: SIM115
        else:  # a log, or a file named .gz that is not gzip: read as the text it is
            fh = open(path, encoding="utf-8", errors="replace", newline=None)  # noqa: SIM115 - closed in _FileLines
        return _FileLines(fh, path), path
    return _split_cr(source), None


def _is_gzip(path: str) -> bool:
    """Whether ``path`` starts with gzip's magic bytes (a missing file: True, so the open says it is missing)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"\x1f\x8b"
    except FileNotFoundError:
        return True


MAX_LINE = 1 << 20  # characters of one line that are read; the rest of a longer line is skipped unread


class _FileLines:
    """The file's lines, each at most :data:`MAX_LINE` characters: a log with no newline (a binary dump, a runaway
    progress bar) is read in bounded chunks, so memory stays bounded whatever the file. A compressed log that is
    truncated or corrupt ends where it breaks, and :attr:`error` says so (the parse reports it)."""

    def __init__(self, fh, path: str):
        self.fh, self.path = fh, path
        self.error: str | None = None
        self.lines = 0

    def __iter__(self) -> Iterator[str]:
        with self.fh as fh:
            readline = fh.readline
            try:
                while line := readline(MAX_LINE):
                    self.lines += 1
                    yield line
                    if len(line) == MAX_LINE and not line.endswith("\n"):
                        while (rest := readline(MAX_LINE)) and not rest.endswith("\n"):
                            pass  # the tail of an overlong line: no progress record is that long
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                self.error = (
                    f"corrupt log: {printable(os.path.basename(self.path))} breaks after {self.lines} line(s) "
                    f"({str(e)[:120] or type(e).__name__}); the run's figures are not trusted"
                )


def _split_cr(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        if "\r" in line:
            yield from line.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        else:
            yield line


def _steady(values: list[float | None], before: int = 0) -> tuple[int, list[float]]:
    """Drop the warm-up (first max(2, ceil(10 %)) logged steps); return (dropped, valid steady values).
    ``before``: logged steps that preceded ``values`` and were not kept (a log longer than :data:`MAX_STEPS`)."""
    n = len(values) + before
    warm = min(n, max(2, math.ceil(0.1 * n)))
    return warm, [v for v in values[max(0, warm - before) :] if v is not None]


#: Logged steps kept per log format: the last ones (the steady-state window); a longer log's earlier steps are
#: counted, not kept, so a log of millions of progress lines is parsed in bounded memory.
MAX_STEPS = 50_000


class _Steps(dict):
    """One format's steps by key (in the order logged), holding at most ``2 * MAX_STEPS`` of them: past that,
    the earliest keys are dropped (counted in :attr:`dropped`) and a later line repeating one is ignored."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self.floor: object = None  # the largest key dropped

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (self.floor is not None and key <= self.floor)  # type: ignore[operator]

    @property
    def total(self) -> int:
        return len(self) + self.dropped

    def __setitem__(self, key: object, value: object) -> None:
        dict.__setitem__(self, key, value)
        if len(self) > 2 * MAX_STEPS:
            self.trim(MAX_STEPS)

    def trim(self, keep: int) -> None:
        """Keep the ``keep`` largest keys."""
        keys = sorted(self)
        for k in keys[: len(keys) - keep]:
            dict.__delitem__(self, k)
            self.dropped += 1
            self.floor = k


class _Series(list):
    """A format's step records in step order: the last :data:`MAX_STEPS` logged, after ``dropped`` earlier ones."""

    dropped = 0

    @property
    def total(self) -> int:
        return len(self) + self.dropped


def _quantiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) == 1:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return q[0], q[-1]


# ------------------------------------------------------------------------------------------ the scan
class _Scan:
    """Everything one pass over the log collects (kept small: per-step values, first evidence lines)."""

    def __init__(self, want_ts: bool):
        self.want_ts = want_ts
        # per log format: step key -> (step_time_s, tflops, loss, timestamp, gbs); None where a line gave nothing
        self.steps: dict[str, _Steps] = {f.name: _Steps() for f in LOG_FORMATS}
        self.last_iteration: int | None = None
        self.mem_alloc: float | None = None
        self.mem_reserved: float | None = None
        self.evidence: dict[str, str] = {}  # class -> first line (reason)
        self.progress_lines = 0  # progress lines read so far
        self.evidence_at: dict[str, int] = {}  # class -> progress lines read when it was last seen
        self.exit_code_seen: int | None = None
        self.pending_trace = False  # a traceback was seen; its exception line is the reason
        self.ignore_next_trace = False
        self.last_ts: float | None = None
        self.implausible: str | None = None  # the first figure past PLAUSIBLE_MAX, as the reason
        # per log format, in order: (substring gate, pattern's match, reader method, that format's steps)
        self._scanners = [(f.gate, f.pattern.match, getattr(self, f.reader), self.steps[f.name]) for f in LOG_FORMATS]

    def _bound(self, value: float | None, what: str) -> float | None:
        """``value`` if it is within :data:`PLAUSIBLE_MAX` for ``what``; else None, the first such noted."""
        if value is None or value <= PLAUSIBLE_MAX[what]:
            return value
        if self.implausible is None:
            self.implausible = (
                f"implausible {what} {value:.6g} in the log (more than {PLAUSIBLE_MAX[what]:g}): "
                "the log's figures are not trusted"
            )
        return None

    # -- memory ------------------------------------------------------------------------------------
    def _mem(self, alloc_gib: float | None, reserved_gib: float | None) -> None:
        alloc_gib, reserved_gib = self._bound(alloc_gib, "memory (GiB)"), self._bound(reserved_gib, "memory (GiB)")
        if alloc_gib is not None and (self.mem_alloc is None or alloc_gib > self.mem_alloc):
            self.mem_alloc = alloc_gib
        if reserved_gib is not None and (self.mem_reserved is None or reserved_gib > self.mem_reserved):
            self.mem_reserved = reserved_gib

    def _mem_line(self, line: str) -> bool:
        headers = list(_MEM_HEADER_RE.finditer(line))
        if headers:
            for i, h in enumerate(headers):
                end = headers[i + 1].start() if i + 1 < len(headers) else len(line)
                d = _fields(line[h.end() : end])
                if h["unit"] == "MB":  # Megatron-LM report_memory: MiB (bytes / 2**20)
                    a, r = _pos(d.get("max allocated")), _pos(d.get("max reserved"))
                    self._mem(a / 1024 if a else None, r / 1024 if r else None)
                else:  # Megatron-Bridge report_memory: GB (bytes / 1e9)
                    self._gb_fields(d)
            return True
        if _MEM_STANDALONE_RE.match(line):
            self._gb_fields(_fields(_strip_prefix(line)))
            return True
        return False

    def _gb_fields(self, d: dict[str, str]) -> None:
        a, r = _pos(d.get("mem-max-allocated-gigabytes")), _pos(d.get("mem-max-reserved-gigabytes"))
        self._mem(a * 1e9 / _GIB if a else None, r * 1e9 / _GIB if r else None)

    # -- progress ----------------------------------------------------------------------------------
    def _megatron(self, m: re.Match, steps: dict) -> None:
        it = int(m["it"])
        self._iteration(it)
        if it in steps:
            return
        d = _fields(m["rest"])
        ms = _pos(d.get(_MEG_STEP_KEY))
        ts = _parse_ts(m["ts"]) if (self.want_ts and m["ts"]) else None
        steps[it] = self._record(
            ms / 1000.0 if ms is not None else None,
            _pos(d.get(_MEG_TFLOPS_KEY)),
            _num(_first(d, _MEG_LOSS_KEYS)),
            ts,
            _pos(d.get("global batch size")),
        )

    def _record(self, step_s, tflops, loss, ts, gbs) -> tuple:
        """One step's record, each figure checked against :data:`PLAUSIBLE_MAX`."""
        return (
            self._bound(step_s, "step time (s)"),
            self._bound(tflops, "TFLOP/s per GPU"),
            loss,
            ts,
            self._bound(gbs, "global batch size"),
        )

    def _nemo(self, m: re.Match, steps: dict) -> None:
        d = _fields(m["rest"])
        gs = _num(d.get("global_step"))
        it = int(m["it"])
        # global_step identifies a step across epochs; without it, (epoch, iteration) does
        if gs is not None and 0 <= gs <= _MAX_STEP:
            key: tuple[int, ...] = (0, int(gs))
            self._iteration(int(gs))
        else:
            key = (1, int(m["epoch"]), it)
            self._iteration(it)
        if key in steps:
            return
        alloc, res = _pos(d.get("max_memory_allocated")), _pos(d.get("max_memory_reserved"))
        self._mem(alloc / _GIB if alloc else None, res / _GIB if res else None)
        steps[key] = self._record(
            _pos(_first(d, _NEMO_STEP_KEYS)),
            _pos(_first(d, _NEMO_TFLOPS_KEYS)),
            _num(_first(d, _NEMO_LOSS_KEYS)),
            None,
            _pos(d.get("global_batch_size")),
        )

    def _step_time(self, m: re.Match, steps: _Steps) -> None:
        steps[steps.total] = self._record(_pos(m["t"]), _pos(m["tf"]), None, None, None)

    def _tqdm(self, m: re.Match, steps: dict) -> None:
        d = _fields(m["post"], sep=",", kv="=")
        gs = _num(d.get("global_step"))
        if gs is None or not 0 <= gs <= _MAX_STEP or int(gs) in steps:
            return  # without a global_step, refreshes of one step cannot be told from new steps
        self._iteration(int(gs))
        steps[int(gs)] = self._record(
            _pos(d.get("train_step_timing in s")),
            _pos(_first(d, _NEMO_TFLOPS_KEYS)),
            _num(_first(d, _NEMO_LOSS_KEYS)),
            None,
            None,
        )

    def _iteration(self, it: int) -> None:
        if self.last_iteration is None or it > self.last_iteration:
            self.last_iteration = it

    # -- failures ----------------------------------------------------------------------------------
    def _note(self, cls: str, line: str) -> None:
        if cls not in self.evidence:
            self.evidence[cls] = _clip(_strip_prefix(line))
        self.evidence_at[cls] = self.progress_lines

    def _failure(self, line: str) -> None:
        if ("Error" in line or "Exception" in line) and (e := _EXC_LINE_RE.match(line.rstrip("\n"))) is not None:
            self._exception(e["exc"], line)
        elif "what():" in line:  # C++'s "terminate called after throwing ...  what():  <the exception>"
            self._exception(line, line)
        elif not any(w in line for w in _WARN_MARKS):
            self._marker(line)

    def _exception(self, exc: str, line: str) -> None:
        """An exception line: an OOM or NCCL error when its text says so (the traceback's reason is set by
        :meth:`_exception_line`)."""
        if any(k in exc for k in _OOM_EXC_MARKS):
            self._note("oom", line)
        elif any(k in exc for k in _NCCL_MARKS):
            self._note("nccl_error", line)

    def _marker(self, line: str) -> None:
        """A line that is not a warning: the scheduler's, the runtime's and NCCL's error lines, tracebacks,
        exit codes, signals."""
        for k in _OOM_MARKS:
            if k in line:
                self._note("oom", line)
                break
        for k in _NCCL_LINE_MARKS:
            if k in line:
                self._note("nccl_error", line)
                break
        if "CANCELLED AT" in line:
            self._note("time_limit" if "DUE TO TIME LIMIT" in line else "failed", line)
        if "Traceback (most recent call last)" in line:
            if self.ignore_next_trace:
                self.ignore_next_trace = False
            else:
                self.pending_trace = True
                self._note("traceback", line)
        if "Exited with exit code" in line:
            m = _EXITED_RE.search(line)
            if m is not None and int(m[1]) != 0:
                self.exit_code_seen = self.exit_code_seen or int(m[1])
                self._note("exited", line)
        for k in _SIGNAL_MARKS:
            if k in line:
                self._note("failed", line)
                break

    # -- the loop ----------------------------------------------------------------------------------
    def _progress(self, line: str) -> bool:
        """Read ``line`` as a progress line of the first log format whose gate and pattern it matches."""
        for fgate, match, read, steps in self._scanners:
            if fgate in line:
                m = match(line)
                if m is not None:
                    read(m, steps)
                    self.progress_lines += 1
                    return True
        return False

    def _timestamp(self, line: str) -> None:
        """Keep the latest timestamp any line carries (the log's own clock, for the stall rule)."""
        t = _ANY_TS_RE.search(line)
        if t is not None:
            ts = _parse_ts(f"{t[1]} {t[2]}")
            if ts is not None and (self.last_ts is None or ts > self.last_ts):
                self.last_ts = ts

    def _exception_line(self, line: str) -> None:
        """After a traceback, its exception line (``ValueError: ...``) becomes the traceback's reason."""
        e = _EXC_LINE_RE.match(line.rstrip("\n"))
        if e is not None:
            self.evidence["traceback"] = _clip(e["exc"])
            self.evidence_at["traceback"] = self.progress_lines
            self.pending_trace = False

    def feed(self, lines: Iterator[str]) -> None:
        """Scan ``lines``: progress, memory, timestamps and failure markers, each found by a cheap substring
        test before its regex runs (this loop is the parser's hot path)."""
        gate = _FAIL_GATE
        want_ts = self.want_ts
        for line in lines:
            if "NCCL INFO" in line:  # the bulk of a noisy log; never progress, never a failure marker
                continue
            if self._progress(line):
                continue
            if ("memory (" in line or "mem-" in line) and self._mem_line(line):
                continue
            if want_ts and ("[20" in line or "[NeMo" in line or " AT 20" in line):
                self._timestamp(line)
            for g in gate:
                if g in line:
                    self._failure(line)
                    break
            if self.pending_trace and ("Error" in line or "Exception" in line or "Interrupt" in line):
                self._exception_line(line)
            if "Exception ignored in" in line:
                self.ignore_next_trace = True


# ------------------------------------------------------------------------------------------ following a live log
def steady_split(values: list[float | None]) -> tuple[int, list[float]]:
    """The parser's warm-up rule (public for :mod:`dse.logs.steady`): (steps dropped, valid steady values)."""
    return _steady(values)


def _series(scan: _Scan) -> tuple[_Series, str | None]:
    """The step series the log's result is computed from: per-iteration formats first (the longest wins),
    then the fallbacks in order; at most the last :data:`MAX_STEPS` steps (``dropped``: the earlier ones)."""
    series = _Series()
    fmt: str | None = None
    for f in LOG_FORMATS:
        recs = scan.steps[f.name]
        if recs and (recs.total > series.total if f.primary else not series):
            keys = sorted(recs)[-MAX_STEPS:]
            series = _Series(recs[k] for k in keys)
            series.dropped = recs.total - len(keys)
            fmt = f.name
    return series, fmt


_CHUNK = 4 << 20  # bytes of a followed log read at a time


class LogFollower:
    """Follows a log that is still being written with the scan :func:`parse_log` uses, incrementally.

    Each :meth:`poll` reads only the bytes appended since the last one and feeds the complete lines to the
    same scanner (an unfinished last line waits for its newline, kept to :data:`MAX_LINE` characters), so
    the cost of following a run is one read of its log in all, not one per poll. :meth:`metrics` concludes
    on what has been read so far, as :func:`parse_log` would on the log cut at that point.
    """

    def __init__(self, path: str | os.PathLike, *, want_ts: bool = False):
        self.path = os.fspath(path)
        self.scan = _Scan(want_ts=want_ts)
        self._offset = 0
        self._tail = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def poll(self) -> bool:
        """Read what was appended; True if anything was (a missing log is not an error: not started yet)."""
        read = False
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                while data := fh.read(_CHUNK):  # bounded pieces: a log that grew by a gigabyte is not held whole
                    self._offset += len(data)
                    self._feed(data)
                    read = True
        except OSError:
            return read
        return read

    def _feed(self, data: bytes) -> None:
        text = self._tail + self._decoder.decode(data)  # a character cut at a chunk's end waits for its rest
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self._tail = lines.pop()[:MAX_LINE]
        self.scan.feed(iter([ln[:MAX_LINE] + "\n" for ln in lines]))

    def step_times(self) -> list[float | None]:
        """The step times logged so far (None where a progress line gave none), in step order."""
        return [r[0] for r in _series(self.scan)[0]]

    def metrics(
        self, *, exit_code: int | None = 0, scheduler_state: str | None = None, context: ParseContext = ParseContext()
    ) -> RunMetrics:
        """The result of the lines read so far (by default as a run that ended cleanly there)."""
        return _conclude(self.scan, self.path, exit_code, scheduler_state, context)


# ------------------------------------------------------------------------------------------ entry point
def parse_log(
    source: str | os.PathLike | Iterable[str],
    *,
    exit_code: int | None = None,
    scheduler_state: str | None = None,
    context: ParseContext = ParseContext(),
) -> RunMetrics:
    """Parse a training log (a path, or an iterable of lines) into :class:`RunMetrics`.

    A ``str`` is a path (a ``.gz`` one is read decompressed); pass ``text.splitlines()`` to parse text. A missing file raises
    ``FileNotFoundError`` rather than reading as a failed run, so a wrong run directory cannot pass
    unnoticed. ``exit_code`` and ``scheduler_state`` are what the backend saw (None when unknown).
    """
    lines, path = _lines(source)
    scan = _Scan(want_ts=context.stall_timeout_s is not None)
    scan.feed(iter(lines))
    metrics = _conclude(scan, path, exit_code, scheduler_state, context)
    corrupt = getattr(lines, "error", None)
    if corrupt is not None and metrics.status in ("ok", "no_metrics"):  # what ended the run, if it said, stands
        return replace(metrics, status="failed", reason=corrupt, partial=metrics.steps > 0)
    return metrics


def parse_run(result, context: ParseContext = ParseContext()) -> RunMetrics:
    """Parse a backend's ``RunResult`` (anything with ``log_path``, ``exit_code``, ``scheduler_state``)."""
    return parse_log(
        result.log_path,
        exit_code=result.exit_code,
        scheduler_state=getattr(result, "scheduler_state", None),
        context=context,
    )


def _conclude(
    scan: _Scan, path: str | None, exit_code: int | None, scheduler_state: str | None, ctx: ParseContext
) -> RunMetrics:
    """The run's result from a finished scan: step statistics, throughput, memory, loss and the verdict."""
    series, fmt = _series(scan)
    warm, times = _steady([r[0] for r in series], series.dropped)
    step_time, mean, p10, p90 = _step_stats(times)
    tflops, tflops_source = _tflops(scan, series, fmt, step_time, ctx)
    losses = [r[2] for r in series if r[2] is not None]
    status, reason = _status(scan, path, series, times, warm, exit_code, scheduler_state, ctx)
    failed = status in FAILURE_STATUSES
    return RunMetrics(
        status=status,
        reason=reason,
        step_time_s=step_time,
        step_time_mean_s=mean,
        step_time_p10_s=p10,
        step_time_p90_s=p90,
        tflops_per_gpu=tflops,
        tokens_per_s_per_gpu=_tokens_per_gpu(series, step_time, ctx),
        peak_memory_gib=scan.mem_alloc,
        loss=losses[-1] if losses else None,
        steps=series.total,
        partial=failed and series.total > 0,
        log_format=fmt,
        warmup_steps=warm,
        last_iteration=scan.last_iteration,
        peak_memory_reserved_gib=scan.mem_reserved,
        tflops_source=tflops_source,
        exit_code=exit_code if exit_code is not None else scan.exit_code_seen,
    )


def _step_stats(times: list[float]) -> tuple[float | None, float | None, float | None, float | None]:
    """(median, mean, p10, p90) of the steady step times; all None without any."""
    if not times:
        return None, None, None, None
    p10, p90 = _quantiles(times)
    return statistics.median(times), statistics.fmean(times), p10, p90


def _tflops(
    scan: _Scan, series: _Series, fmt: str | None, step_time: float | None, ctx: ParseContext
) -> tuple[float | None, str | None]:
    """TFLOP/s per GPU and where it came from: the log's steady values (the series', else Megatron-Bridge's
    summary lines), else the model's FLOPs per step over the measured step time; (None, None) without either."""
    _, tfs = _steady([r[1] for r in series], series.dropped)
    summaries = scan.steps["megatron_bridge_summary"]
    summary = [tf for _, tf, *_ in summaries.values()]
    if not tfs and fmt != "megatron_bridge_summary" and summary:
        _, tfs = _steady(summary, summaries.dropped)
    if tfs:
        return statistics.median(tfs), "log"
    if step_time is not None and ctx.model_flops_per_step and ctx.num_gpus:
        return ctx.model_flops_per_step / (step_time * ctx.num_gpus) / 1e12, "model"
    return None, None


def _tokens_per_gpu(series: list, step_time: float | None, ctx: ParseContext) -> float | None:
    """Tokens/s per GPU from the step time, the global batch (the context's, else the last one logged) and the
    sequence length; None where any is unknown."""
    gbs = ctx.gbs
    if gbs is None:
        logged = [r[4] for r in series if r[4] is not None]
        gbs = logged[-1] if logged else None
    if step_time is not None and gbs and ctx.seq_length and ctx.num_gpus:
        return gbs * ctx.seq_length / (step_time * ctx.num_gpus)
    return None


def _status(
    scan: _Scan,
    path: str | None,
    series: _Series,
    times: list,
    warm: int,
    exit_code: int | None,
    scheduler_state: str | None,
    ctx: ParseContext,
) -> tuple[str, str | None]:
    """(status, reason), by precedence: OOM, timeout, NCCL error, stall, other failures, missing metrics, ok.
    After a clean end only what came after the last progress line counts (what ended the run)."""
    state = (scheduler_state or "").strip().upper().split(" ")[0].rstrip("+") or None
    ev = _ending_evidence(scan) if _clean_end(exit_code, state) else scan.evidence
    verdict = _resource_failure(ev, state)
    if verdict is not None:
        return verdict
    stall = _stall(scan, path, series, exit_code, state, ctx)
    if stall is not None:
        return "timeout", stall
    verdict = _run_failure(ev, state, exit_code)
    if verdict is not None:
        return verdict
    if scan.implausible is not None:
        return "no_metrics", scan.implausible
    return _metrics_verdict(series, times, warm)


def _clean_end(exit_code: int | None, state: str | None) -> bool:
    """The run ended cleanly: exit code 0 (or unknown with a clean scheduler state), no failing state."""
    if exit_code is None:
        return state in _SCHED_DONE
    return exit_code == 0 and (state is None or state in _SCHED_DONE or state in _SCHED_RUNNING)


def _ending_evidence(scan: _Scan) -> dict[str, str]:
    """The evidence seen after the last progress line: what a run that went on stepping survived is not what
    ended it."""
    return {k: v for k, v in scan.evidence.items() if scan.evidence_at.get(k) == scan.progress_lines}


def _resource_failure(ev: dict[str, str], state: str | None) -> tuple[str, str] | None:
    """OOM, then timeout, then NCCL error, from the log's evidence or the scheduler's state."""
    if "oom" in ev:
        return "oom", ev["oom"]
    if state in _SCHED_OOM:
        return "oom", f"scheduler state {state}"
    if "time_limit" in ev:
        return "timeout", ev["time_limit"]
    if state in _SCHED_TIMEOUT:
        return "timeout", f"scheduler state {state}"
    if "nccl_error" in ev:
        return "nccl_error", ev["nccl_error"]
    return None


def _run_failure(ev: dict[str, str], state: str | None, exit_code: int | None) -> tuple[str, str] | None:
    """A ``failed`` run: a traceback, a failing scheduler state, a signal or cancel line, a non-zero exit code
    (the backend's, then one the log reports), in that order."""
    if "traceback" in ev:
        return "failed", ev["traceback"]
    if state is not None and state not in _SCHED_DONE and state not in _SCHED_RUNNING:
        return "failed", f"scheduler state {state}" + (f", exit code {exit_code}" if exit_code else "")
    if "failed" in ev:
        return "failed", ev["failed"]
    if exit_code is not None and exit_code != 0:
        return "failed", f"exit code {exit_code}"
    if "exited" in ev:
        return "failed", ev["exited"]
    return None


def _metrics_verdict(series: _Series, times: list, warm: int) -> tuple[str, str | None]:
    """``ok`` if a steady step time exists, else ``no_metrics`` with what was missing."""
    if not series:
        return "no_metrics", "no progress line with a step time in the log"
    if not times:
        if series.total <= warm:
            return "no_metrics", f"{series.total} logged step(s), all warm-up (the first {warm} are dropped)"
        return "no_metrics", "no valid step time after warm-up"
    return "ok", None


def _stall(
    scan: _Scan, path: str | None, series: list, exit_code: int | None, state: str | None, ctx: ParseContext
) -> str | None:
    if ctx.stall_timeout_s is None:
        return None
    finished = exit_code is not None or (state is not None and state not in _SCHED_RUNNING)
    stamps = [r[3] for r in series if r[3] is not None]
    last_progress = max(stamps) if stamps else None
    if last_progress is None and path is not None:
        try:
            last_progress = os.path.getmtime(path)
        except OSError:
            return None
    if last_progress is None:
        return None
    if ctx.now is not None:
        now: float | None = ctx.now
    elif not finished:
        now = time.time()
    else:  # judged by the log's own clock: its last timestamp, progress lines included
        now = max((t for t in (scan.last_ts, *stamps) if t is not None), default=None)
    if now is None:
        return None
    idle = now - last_progress
    if idle > ctx.stall_timeout_s:
        what = "progress line" if stamps else "write to the log"
        return f"no progress for {idle:.0f} s since the last {what} (stall_timeout_s={ctx.stall_timeout_s:g})"
    return None
