"""The Slurm backend: an sbatch script rendered by nemo-run's ``SlurmExecutor``, submitted, polled, collected.

The script is nemo-run's own (``SlurmBatchRequest.materialize`` over a ``SlurmExecutor``, the same object
that ``run.Experiment(...).dryrun()`` renders), with nodes, GPUs per node, time limit, pyxis container
flags, account, partition and srun arguments from the system file. What nemo-run does not do for us,
and how we make up for it:

- nemo-run writes ``export KEY=value`` and the srun command line without quoting (it expects trusted
  values); we hand it values already passed through ``shlex.quote``, so the script holds them quoted.
- vboost is a pre-step before training; as NeMo's ``PerfEnvPlugin`` does, it goes into the executor's
  ``setup_lines`` (its own ``srun --ntasks=<nodes>`` step).
- We call ``SlurmBatchRequest`` directly instead of ``Experiment.dryrun()``: the experiment nests the job
  directory under ``<title>/<id>/<task>`` and writes experiment metadata, while the trial's run directory
  should itself be the job directory (script, log and payload code together).

States map to trial statuses through :data:`SLURM_STATE_STATUS` (``TIMEOUT`` -> ``timeout``,
``OUT_OF_MEMORY`` -> ``oom``, ``CANCELLED``/``NODE_FAIL``/... -> ``failed``; ``COMPLETED`` and ``FAILED``
are decided by the log: an OOM traceback is ``oom`` whatever the exit code).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from dse.backends.base import Backend, InfrastructureFailure, LaunchFailures, RunResult, StopCheck
from dse.backends.scripts import (
    DIR_VAR,
    LOG_NAME,
    RELOCATABLE_ROOT,
    check_env,
    check_field,
    check_path,
    import_nemo_run,
    job_name,
    quoted_command,
    relocatable,
    stage_code,
)
from dse.errors import UserError
from dse.facts import allowlists
from dse.facts.hardware import HARDWARE
from dse.launch import LaunchPlan
from dse.recipes import contract
from dse.rules.space import (
    SLURM_IMAGE,
    SLURM_MOUNT,
    SLURM_NAME,
    SLURM_PATH,
    SLURM_TIME,
    SlurmSettings,
    Space,
    System,
)

SCRIPT_NAME = "launch.sbatch"
SBATCH_OUT = "sbatch.out"  # the batch script's own output (set -x trace, head-node lookup)
SUBMIT_FAILED = "SUBMIT_FAILED"  # our word, not Slurm's: sbatch refused the script
UNKNOWN = "UNKNOWN"  # the job left the queue and no accounting record says how it ended

# Slurm's end states (sacct's State column) -> trial status; None: decided by the log and the exit code.
# One table with the parser's: recipes.contract.SCHEDULER_END_STATES (less torchx's SUCCEEDED), plus our own words.
SLURM_STATE_STATUS: dict[str, str | None] = {
    **{s: st for s, st in contract.SCHEDULER_END_STATES.items() if s != "SUCCEEDED"},
    SUBMIT_FAILED: "failed",
    UNKNOWN: "failed",
}
TERMINAL = frozenset(SLURM_STATE_STATUS) - {SUBMIT_FAILED, UNKNOWN}

# What the system file may put into a script: the rules the system file is read with (dse.rules.space), checked
# again here before quoting, for a SlurmSettings built in code.
_NAME, _TIME, _IMAGE, _MOUNT = SLURM_NAME, SLURM_TIME, SLURM_IMAGE, SLURM_MOUNT
# pyxis jobs as NeMo's performance scripts launch them (scripts/performance/executors.py)
CONTAINER_SRUN_ARGS = ("--mpi=pmix", "--no-container-mount-home")


def status_for(state: str | None) -> str | None:
    """The trial status a Slurm end state implies (None: look at the log)."""
    return SLURM_STATE_STATUS.get((state or "").split(" ")[0].upper(), None) if state else None


def _check_settings(s: SlurmSettings, file: str | None) -> None:
    check_field(s.partition, _NAME, field="slurm.partition", file=file, what="letters, digits and _.,-")
    check_field(s.account, _NAME, field="slurm.account", file=file, what="letters, digits and _.,-")
    check_field(
        s.time_limit, _TIME, field="slurm.time_limit", file=file, what="a Slurm time: MM, HH:MM:SS or D-HH:MM:SS"
    )
    if s.max_pending:
        check_field(
            s.max_pending, _TIME, field="slurm.max_pending", file=file, what="a Slurm time: MM, HH:MM:SS or D-HH:MM:SS"
        )
    if s.use_container:
        check_field(
            s.container_image,
            _IMAGE,
            field="slurm.container_image",
            file=file,
            what="an image reference such as nvcr.io#nvidia/nemo:25.09",
        )
    for m in s.container_mounts:
        check_field(m, _MOUNT, field="slurm.container_mounts", file=file, what="src:dst[:flags] paths")
    for field, check in (("srun_args", allowlists.parse_srun_args), ("sbatch_options", allowlists.sbatch_options)):
        try:
            check(getattr(s, field))
        except allowlists.OptionError as e:
            raise UserError(str(e), file=file, field=f"slurm.{field}") from None
    if s.job_dir:
        check_field(s.job_dir, SLURM_PATH, field="slurm.job_dir", file=file, what="a path without % patterns")


def cluster_dir(run_dir: Path, settings: SlurmSettings) -> Path:
    """Where the job lives on the cluster: the run directory, or a unique folder under ``slurm.job_dir``."""
    if not settings.job_dir:
        return run_dir
    tag = f"{zlib.crc32(str(run_dir.resolve()).encode()):08x}"
    return Path(settings.job_dir) / f"{run_dir.name}-{tag}"


def segment(nodes: int, system: System, options: dict) -> int | None:
    """``--segment``: the system file's ``sbatch_options.segment`` (0: none), else, on GPUs whose NVLink domain
    spans nodes (GB200/GB300 NVL72: 18 nodes of 4), whole NVLink domains as Megatron-Bridge's performance scripts
    ask, so that the job gets the NVLink domain the performance model assumed."""
    if "segment" in options:
        return int(options["segment"]) or None
    row = HARDWARE[system.gpu]
    if row.nvlink_domain <= row.gpus_per_node:  # an NVLink domain is one node (HGX): nothing to keep together
        return None
    return allowlists.nvlink_segment(nodes, system.gpus_per_node, system.nvlink_domain)


def check_sbatch(plan: LaunchPlan, job_dir: Path) -> tuple[Path, dict[str, str]]:
    """Every check of what ``plan``'s sbatch script would carry (the system's Slurm settings, the job directory's
    path, the environment), without nemo-run: ``dse validate`` and a study's start check a Slurm script this way
    (nemo-run's import takes seconds); the job directory and the environment as checked."""
    _check_settings(plan.trial.system.slurm, None)
    job_dir = check_path(Path(job_dir).absolute())
    return job_dir, check_env(plan.env)


def render_sbatch(plan: LaunchPlan, job_dir: Path) -> str:
    """The sbatch script of ``plan`` with ``job_dir`` as its job directory, rendered by nemo-run."""
    job_dir, env = check_sbatch(plan, job_dir)
    run = import_nemo_run()  # heavy (seconds); only a Slurm script's rendering needs it
    from nemo_run.core.execution.slurm import SlurmBatchRequest, SlurmJobDetails

    system = plan.trial.system
    s = system.slurm
    name = job_name(job_dir)

    @dataclass(kw_only=True)
    class _JobDetails(SlurmJobDetails):
        """Fixed file names in the job directory: the trainer's log is ``log.txt`` as with every backend."""

        @property
        def stdout(self) -> Path:
            return Path(self.folder) / SBATCH_OUT

        @property
        def stderr(self) -> Path:
            return Path(self.folder) / SBATCH_OUT

        @property
        def srun_stdout(self) -> Path:
            return Path(self.folder) / LOG_NAME

        @property
        def srun_stderr(self) -> Path:
            return Path(self.folder) / LOG_NAME

    srun_args = list(CONTAINER_SRUN_ARGS if s.use_container else ()) + allowlists.parse_srun_args(s.srun_args)
    options = allowlists.sbatch_options(s.sbatch_options)
    executor = run.SlurmExecutor(
        account=s.account or "",
        partition=s.partition or None,
        job_name_prefix="dse-",  # unused (job_details names the job) but nemo-run reads it
        time=s.time_limit,
        nodes=plan.nodes,
        ntasks_per_node=plan.gpus_per_node,  # one process per GPU, started by srun
        gpus_per_node=plan.gpus_per_node if s.gpus_per_node_flag else None,
        exclusive=True if s.exclusive else None,
        mem="0" if s.exclusive else None,  # all of each node's memory, as NeMo's performance executor asks
        container_image=s.container_image if s.use_container else None,
        container_mounts=list(s.container_mounts) if s.use_container else [],
        srun_args=srun_args,
        env_vars={k: shlex.quote(v) for k, v in env.items()},
        setup_lines="\n".join(quoted_command(step.command) for step in plan.pre_steps) or None,
        segment=segment(plan.nodes, system, options),
        additional_parameters={**{k: v for k, v in options.items() if k != "segment"}, "chdir": str(job_dir)},
        job_details=_JobDetails(job_name=name, folder=str(job_dir)),
        tunnel=run.LocalTunnel(job_dir=str(job_dir.parent)),
        packager=run.Packager(),
    )
    executor.job_dir = str(job_dir)
    if not s.account:  # nemo-run always writes --account; an empty one means "the user's default"
        executor.account = None
    request = SlurmBatchRequest(
        launch_cmd=["sbatch", "--parsable"],
        jobs=[name],
        command_groups=[[quoted_command(plan.argv)]],
        executor=executor,
        max_retries=0,
        extra_env={},
        launcher=None,
    )
    return request.materialize()


def write_sbatch(plan: LaunchPlan, run_dir: Path) -> Path:
    """Render and write ``run_dir/launch.sbatch`` (nothing submitted); return its path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SCRIPT_NAME
    path.write_text(render_sbatch(plan, run_dir).rstrip("\n") + "\n")
    return path


# The lines a relocatable sbatch script opens with: its files are where it was submitted from (sbatch runs a copy
# of the script, so the script's own path says nothing), unless DSE_DIR says otherwise.
SUBMIT_DIR_LINES = (
    "# This script's files (code/, log.txt) are in the directory sbatch is run from: cd there, then sbatch "
    + SCRIPT_NAME,
    "# (or: sbatch --export=ALL,DSE_DIR=/path/to/this/folder " + SCRIPT_NAME + ")",
    f'{DIR_VAR}="${{{DIR_VAR}:-${{SLURM_SUBMIT_DIR}}}}"',
    f'[ -d "${{{DIR_VAR}}}/code" ] || {{ echo "no code/ in ${{{DIR_VAR}}}: submit from the folder of {SCRIPT_NAME}, '
    f'or set {DIR_VAR}" >&2; exit 2; }}',
)


def write_relocatable_sbatch(plan: LaunchPlan, out_dir: Path) -> Path:
    """Write ``out_dir/launch.sbatch`` naming no absolute path of this machine: the job's files are found through
    ``DSE_DIR`` (the submit directory by default) and sbatch's own output is relative to it, so the folder can be
    copied to a login node and submitted there (``best/``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stand_in = Path(RELOCATABLE_ROOT) / out_dir.name  # the job is named after the folder, as a trial's is
    text = render_sbatch(plan, stand_in)
    lines = [ln for ln in text.splitlines() if not ln.startswith(f"#SBATCH --chdir={stand_in}")]
    last = max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH "))
    lines[last + 1 : last + 1] = ["", *SUBMIT_DIR_LINES]
    path = out_dir / SCRIPT_NAME
    path.write_text(relocatable("\n".join(lines), stand_in).rstrip("\n") + "\n")
    return path


@dataclass(frozen=True)
class JobState:
    state: str  # Slurm's state word (first word: "CANCELLED by 0" -> "CANCELLED")
    exit_code: int | None
    reason: str = ""  # Slurm's reason while PENDING (squeue's %r: Resources, Priority, ReqNodeNotAvail...)


def slurm_seconds(text: str) -> float | None:
    """Slurm's time formats (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in seconds; None: unlimited
    (checked when the system file was read: :func:`dse.facts.allowlists.slurm_time`)."""
    return allowlists.slurm_time(text)


def pending_reason(job_id: str) -> str:
    """Why Slurm keeps the job pending (squeue's ``%r``), '' when squeue does not say."""
    r = _run(["squeue", "-h", "-j", job_id, "-o", "%r"])
    if r is None or r.returncode != 0 or not r.stdout.strip():
        return ""
    return r.stdout.strip().splitlines()[0].strip()


def _parse_exit(text: str) -> int | None:
    code, _, signal = text.strip().partition(":")
    try:
        c, s = int(code), int(signal or 0)
    except ValueError:
        return None
    return 128 + s if s and not c else c


def _run(cmd: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def query_state(job_id: str) -> JobState | None:
    """The job's state from ``sacct``, else ``squeue`` / ``scontrol`` (no accounting); None if nobody knows it."""
    r = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"])
    if r is not None and r.returncode == 0 and r.stdout.strip():
        state, _, code = r.stdout.strip().splitlines()[0].partition("|")
        return JobState(state.split(" ")[0].upper(), _parse_exit(code))
    r = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if r is not None and r.returncode == 0 and r.stdout.strip():
        return JobState(r.stdout.strip().splitlines()[0].upper(), None)
    r = _run(["scontrol", "show", "job", "-o", job_id])
    if r is not None and r.returncode == 0:
        fields = dict(p.split("=", 1) for p in r.stdout.split() if "=" in p)
        if "JobState" in fields:
            return JobState(fields["JobState"].upper(), _parse_exit(fields.get("ExitCode", "")))
    return None


_SBATCH_PREFIXES = ("sbatch:", "error:", "Batch job submission failed:")
REFUSALS_TO_STOP = 3  # the same refusal this many times in a row ends the study (the cluster is misconfigured)


def sbatch_message(output: str) -> str:
    """sbatch's complaint in its own words, without its ``sbatch: error:`` prefixes, on one line.

    ``sbatch: error: invalid partition specified: x`` and ``sbatch: error: Batch job submission failed:
    Invalid partition name specified`` become ``invalid partition specified: x; Invalid partition name
    specified``. Error lines win over warnings; a repeated line is kept once.
    """
    lines: list[tuple[str, str]] = []  # (kind, text)
    for raw in output.splitlines():
        line, kind = raw.strip(), "other"
        changed = True
        while changed:
            changed = False
            for p in _SBATCH_PREFIXES:
                if line.startswith(p):
                    kind = "error" if p == "error:" or kind == "error" else kind
                    line, changed = line[len(p) :].strip(), True
        if line.lower().startswith("warning:"):
            kind = "warning"
        if line and line.lower() not in (seen.lower() for _, seen in lines):
            lines.append((kind, line))
    errors = [text for kind, text in lines if kind == "error"]
    return "; ".join(errors or [text for _, text in lines])


def submit(script: Path) -> tuple[str | None, str]:
    """``sbatch --parsable script``: (job id, '') or (None, sbatch's output as it printed it)."""
    r = _run(["sbatch", "--parsable", str(script)], timeout=60)
    if r is None:
        return None, "sbatch could not be run (is Slurm installed and on PATH?)"
    if r.returncode != 0 or not r.stdout.strip():
        return None, "\n".join(
            t.strip() for t in (r.stderr, r.stdout) if t.strip()
        ) or f"sbatch exited with {r.returncode}"
    return r.stdout.strip().split(";")[0], ""


def cancel(job_id: str) -> None:
    _run(["scancel", job_id])


@dataclass
class _Pending:
    """One wait's view of its job while Slurm keeps it pending: the last reason it gave, printed once per new
    reason unless ``quiet``. A wait's own object: one backend instance serves every trial in flight."""

    job_id: str
    quiet: bool = False
    reason: str = ""

    def given_up(self, st: JobState, waited_s: float, limit_s: float | None) -> JobState | None:
        """Note Slurm's reason while ``st`` is PENDING (else ''); a PENDING state with the reason once
        ``waited_s`` passes ``limit_s``."""
        if st.state != "PENDING":
            self.reason = ""
            return None
        reason = pending_reason(self.job_id) or "no reason given"
        if reason != self.reason and not self.quiet and reason not in ("None", "no reason given"):
            # one line per new reason, above the progress bar (rich's Progress redirects stderr); Slurm
            # says "None" before it has looked at a new job: not worth a line
            print(f"job {self.job_id} pending: {reason}", file=sys.stderr, flush=True)
        self.reason = reason
        if limit_s is not None and waited_s > limit_s:
            return JobState("PENDING", None, reason)
        return None


class SlurmBackend(Backend):
    """Submits each plan with sbatch and waits for its end; Ctrl-C cancels the job (``scancel``) and re-raises.

    ``poll_s`` is the polling interval; ``settle_s`` how long a job that left the queue may take to appear
    in the accounting database before it is recorded as ``UNKNOWN``.
    """

    name = "slurm"
    script_name = SCRIPT_NAME
    run_errors = (OSError, subprocess.SubprocessError)  # the job directory, the Slurm commands

    @classmethod
    def write_script(cls, plan: LaunchPlan, run_dir: Path) -> Path:
        return write_sbatch(plan, run_dir)

    @classmethod
    def check_script(cls, plan: LaunchPlan, run_dir: Path) -> None:
        check_sbatch(plan, run_dir)

    def __init__(self, space: Space | None = None, *, poll_s: float = 2.0, settle_s: float = 30.0):
        self.space, self.poll_s, self.settle_s = space, poll_s, settle_s
        # The last sbatch refusal and how many times in a row: the study's, not one run's (runs in flight at
        # once each update it, under the lock). A run's own state lives in its wait (_Pending).
        self._refusals = LaunchFailures(REFUSALS_TO_STOP)

    def stop_reason(self) -> str | None:
        """Set once sbatch refused :data:`REFUSALS_TO_STOP` submissions in a row with the same message: a
        misconfigured partition, account or GRES fails every trial, and the study should not go on."""
        if (repeated := self._refusals.repeated()) is None:
            return None
        message, n = repeated
        return (
            f"sbatch refused {n} jobs in a row: {message} (check the system file's [slurm] table: "
            f"partition, account, gpus_per_node_flag, time_limit)"
        )

    def run(self, plan: LaunchPlan, run_dir: Path, stop: StopCheck | None = None) -> RunResult:
        """Submit, wait, collect. With ``stop``: asked at each poll while the job runs (with the log in the
        job directory, where srun writes it); when it says so the job is cancelled (``scancel``), as a user
        would, and the result is ``stopped`` whatever end state Slurm then records (``CANCELLED``)."""
        settings = plan.trial.system.slurm
        _check_settings(settings, None)  # before any directory is made
        job_dir = cluster_dir(run_dir, settings)
        job_dir.mkdir(parents=True, exist_ok=True)
        stage_code(job_dir)
        script = write_sbatch(plan, job_dir)
        if job_dir != run_dir:
            shutil.copy2(script, run_dir / SCRIPT_NAME)
        job_id, error = submit(script)
        if job_id is None:
            err = run_dir / SBATCH_OUT
            err.write_text(error.rstrip("\n") + "\n")  # as sbatch printed it (its own "sbatch: error:" prefix)
            message = sbatch_message(error)
            self._refusals.failed(message)
            return RunResult(
                run_dir=run_dir,
                log_path=err,
                exit_code=None,
                scheduler_state=SUBMIT_FAILED,
                # the cluster refused the submission (partition, account, QOS, GRES, limits): nothing of the
                # layout ran, so an infrastructure failure, which agents do not learn from and --resume runs again
                reason=InfrastructureFailure(f"sbatch refused the job: {message}"),
            )
        self._refusals.launched()
        (run_dir / "job_id").write_text(job_id + "\n")
        stopped = False
        limit = settings.max_pending
        pending_limit_s = slurm_seconds(limit) if limit else None
        try:
            if stop is not None:
                end, stopped = self.wait_or_stop(job_id, job_dir / LOG_NAME, stop, pending_limit_s=pending_limit_s)
            else:
                end = self.wait(job_id, pending_limit_s=pending_limit_s)
        except KeyboardInterrupt:
            cancel(job_id)
            self.wait(job_id, limit_s=15)
            raise
        if job_dir != run_dir:
            for name in (LOG_NAME, SBATCH_OUT):
                if (job_dir / name).exists():
                    shutil.copy2(job_dir / name, run_dir / name)
        if end.state == "PENDING":  # pending past slurm.max_pending: cancelled, never ran
            cancel(job_id)
            self.wait(job_id, limit_s=15)
            return RunResult(
                run_dir=run_dir,
                log_path=run_dir / SBATCH_OUT,
                exit_code=None,
                scheduler_state="PENDING",
                job_id=job_id,
                # the cluster did not start it (a drained node, a reservation, the queue): nothing of the layout
                # ran, so an infrastructure failure, as a refused submission is; --resume runs it again
                reason=InfrastructureFailure(
                    f"pending longer than slurm.max_pending {limit} "
                    f"({end.reason or 'Slurm gave no reason'}); job {job_id} cancelled"
                ),
            )
        return RunResult(
            run_dir=run_dir,
            log_path=run_dir / LOG_NAME,
            exit_code=end.exit_code,
            scheduler_state=end.state,
            job_id=job_id,
            stopped=stopped,
        )

    def finished_after_interrupt(self, trial, run_dir: Path) -> RunResult | None:
        """The job's result when ``sacct`` says it COMPLETED although a Ctrl-C stopped the wait (the cancel came
        after its end), or although the dse that waited for it is gone (asked on --resume): its log is
        collected as :meth:`run` would have. None for any other state; a job still queued or running then
        is cancelled (nobody waits for it, and the trial runs again)."""
        id_file = run_dir / "job_id"
        if not id_file.is_file():
            return None
        job_id = id_file.read_text().strip()
        st = query_state(job_id)
        if st is not None and st.state not in TERMINAL:
            # still queued or running with no dse waiting for it (the one that launched it is gone): cancelled,
            # since the trial now runs again
            cancel(job_id)
            return None
        if st is None or st.state != "COMPLETED":
            return None
        job_dir = cluster_dir(run_dir, trial.system.slurm)
        if job_dir != run_dir:
            for name in (LOG_NAME, SBATCH_OUT):
                if (job_dir / name).exists():
                    shutil.copy2(job_dir / name, run_dir / name)
        return RunResult(
            run_dir=run_dir,
            log_path=run_dir / LOG_NAME,
            exit_code=st.exit_code,
            scheduler_state=st.state,
            job_id=job_id,
        )

    def wait_or_stop(
        self, job_id: str, log: Path, stop: StopCheck, *, pending_limit_s: float | None = None
    ) -> tuple[JobState, bool]:
        """Poll until the job ends by itself (state, False), or ``stop(log)`` says so while it runs: then
        ``scancel`` and wait for its end state (state, True). The log is looked at every ``stop.poll_s``.
        ``pending_limit_s`` as for :meth:`wait` (the state returned is then ``PENDING``, not stopped)."""
        start = time.monotonic()
        gone_since: float | None = None
        last_look = last_query = float("-inf")
        pending = _Pending(job_id)
        while True:
            now = time.monotonic()
            if now - last_query >= self.poll_s:  # the scheduler is asked at its own pace, however often stop is
                last_query = now
                st = query_state(job_id)
                if st is not None:
                    if st.state in TERMINAL:
                        return st, False
                    gone_since = None
                    if (given_up := pending.given_up(st, now - start, pending_limit_s)) is not None:
                        return given_up, False
                else:
                    gone_since = gone_since or now
                    if now - gone_since > self.settle_s:
                        return JobState(UNKNOWN, None), False
            if now - last_look >= stop.poll_s:
                last_look = now
                if stop(log):
                    cancel(job_id)
                    return self.wait(job_id, limit_s=max(self.settle_s, 15.0)), True
            time.sleep(min(self.poll_s, stop.poll_s))

    def wait(self, job_id: str, *, limit_s: float | None = None, pending_limit_s: float | None = None) -> JobState:
        """Poll until the job reaches an end state (or ``limit_s`` passes); the last state seen.

        ``pending_limit_s``: a job still ``PENDING`` that long after submission is given up on; the state
        returned is then ``PENDING`` with Slurm's pending reason (the caller cancels it). While the job
        pends, each new reason Slurm gives is printed on one line to stderr (above the progress bar: rich's
        Progress redirects stderr), so a wait is never silent; a PENDING state returned carries the last one.
        """
        start = time.monotonic()
        gone_since: float | None = None
        last = JobState("PENDING", None)
        pending = _Pending(job_id, quiet=limit_s is not None)
        while True:
            st = query_state(job_id)
            now = time.monotonic()
            if st is not None:
                if st.state in TERMINAL:
                    return st
                gone_since = None
                if (given_up := pending.given_up(st, now - start, pending_limit_s)) is not None:
                    return given_up
                last = replace(st, reason=pending.reason)  # a PENDING state with Slurm's reason
            else:
                gone_since = gone_since or now
                if now - gone_since > self.settle_s:
                    return JobState(UNKNOWN, None)
            if limit_s is not None and now - start > limit_s:
                return last
            time.sleep(self.poll_s)
