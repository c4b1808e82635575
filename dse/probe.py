"""``dse probe``: one rank of a large job on one GPU, under PyTorch's ``fake`` process group.

The megatron-core payload (``recipes.mcore --fake-process-group``, with ``WORLD_SIZE`` and ``RANK`` set) builds
the rank's real pipeline stage (its layers, the embedding on the first stage, the loss on the last, its share of
the experts and of the distributed optimizer's states), runs a few iterations with the layout's micro-batch count
and schedule, and prints Megatron's memory and iteration lines; every collective returns at once. So a probe
measures the rank's own memory and compute on the user's own stack, and nothing that other ranks or the network
add: NCCL's buffers, communication time, the pipeline bubble, other ranks' imbalance.

A point is probed on the ranks that bound its memory and time (:func:`probe_ranks`): the first and the last
pipeline stage, the stage with the most layers where the split is uneven, and the stage with the most MoE layers.
Each probe is a one-GPU run: a bash script here (local backend) or a one-node, one-GPU sbatch script (slurm).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dse.backends.scripts import CODE_DIR, LOG_NAME, check_env, check_path, comment, quoted_command, stage_code
from dse.errors import UserError
from dse.launch import LaunchPlan, build_plan
from dse.logs.parse import ParseContext, RunMetrics, parse_log
from dse.recipes.mcore.config import ConfigError, RunConfig, config_from_argv, stage_layers
from dse.rules.trial import TrialConfig

PROBE_PAYLOAD = "mcore"  # the payload that runs one rank under a fake process group
PROBE_FLAG = "--fake-process-group"
DEFAULT_ITERS = 3  # optimizer states exist from the first step; the peak is reached by the second
PROBE_BACKENDS = ("local", "slurm")


@dataclass(frozen=True)
class ProbeRank:
    """One rank to probe: its global rank, pipeline stage, transformer (and MoE) layers and why it was chosen."""

    rank: int
    stage: int
    layers: int
    moe_layers: int
    why: str


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured (``metrics``: the parsed log; ``gpu_s``: the one GPU's wall seconds)."""

    point: dict[str, Any]
    world: int
    target: ProbeRank
    run_dir: Path
    metrics: RunMetrics
    gpu_s: float


def payload_config(plan: LaunchPlan) -> RunConfig:
    """The payload's own reading of ``plan``'s command line (``python -m recipes.mcore ARGS``)."""
    try:
        cfg, _ = config_from_argv(list(plan.argv[3:]))
    except (ConfigError, SystemExit) as e:
        raise UserError(f"the mcore payload cannot read this point's command line: {e}", field="probe") from None
    return cfg


def _moe_layers(cfg: RunConfig, layers: list[int]) -> list[int]:
    """MoE layers on each stage: all but the leading dense layers (``moe_first_dense_layers``); 0 for a dense model."""
    if not cfg.is_moe:
        return [0] * len(layers)
    out, start = [], 0
    for n in layers:
        dense = max(0, min(cfg.moe_first_dense_layers - start, n))
        out.append(n - dense)
        start += n
    return out


def probe_ranks(cfg: RunConfig, world: int) -> list[ProbeRank]:
    """The ranks that bound a layout's memory and time: the first stage (embedding), the last (output layer and
    loss), the stage with the most layers (an uneven split) and the one with the most MoE layers (the most
    experts), each once, as data-, tensor- and expert-parallel rank 0 of its stage (Megatron puts the pipeline
    outermost in its rank order, so stage ``s`` starts at rank ``s * world / pp``)."""
    layers = stage_layers(cfg)
    moe = _moe_layers(cfg, layers)
    per_stage = world // cfg.pp
    picks: list[tuple[int, str]] = [(0, "first stage")]
    if cfg.pp > 1:
        picks.append((cfg.pp - 1, "last stage"))
    most = max(range(cfg.pp), key=lambda s: (layers[s], -s))
    picks.append((most, "most layers"))
    if cfg.is_moe:
        picks.append((max(range(cfg.pp), key=lambda s: (moe[s], -s)), "most experts"))
    out: list[ProbeRank] = []
    for stage, why in picks:
        if any(p.stage == stage for p in out):
            continue
        out.append(ProbeRank(stage * per_stage, stage, layers[stage], moe[stage], why))
    return out


def probe_plan(plan: LaunchPlan, target: ProbeRank, world: int, iters: int = DEFAULT_ITERS) -> LaunchPlan:
    """``plan`` as a probe of ``target``: the same command with the fake-group flag and ``iters`` iterations, and
    ``WORLD_SIZE``/``RANK`` in its environment."""
    if plan.payload != PROBE_PAYLOAD:
        raise UserError(
            f"a probe runs the {PROBE_PAYLOAD} payload (recipes.mcore --fake-process-group); this space's payload is "
            f"{plan.payload!r}",
            field="backend.payload",
        )
    if iters < 2:
        raise UserError(f"{iters} iterations: a probe needs at least 2 (the optimizer's states exist from the first)")
    # the flag before the overrides: argparse takes no flag between positional path=value arguments
    argv = (
        *plan.argv[:3],
        PROBE_FLAG,
        *plan.argv[3:],
        f"train.train_iters={iters}",
        f"scheduler.lr_decay_iters={iters}",
    )
    env = {**plan.env, "WORLD_SIZE": str(world), "RANK": str(target.rank)}
    return replace(plan, argv=argv, env=env)


def render_probe_script(plan: LaunchPlan, run_dir: Path) -> str:
    """A bash script that runs the probe ``plan`` on this machine's first GPU, one process (no torchrun: the
    payload makes its own fake process group), its output in ``log.txt``."""
    run_dir = check_path(Path(run_dir).absolute())
    env = check_env(plan.env)
    lines = [
        "#!/bin/bash",
        comment(f"Generated by dse probe for {plan.trial.recipe.name}: rank {env['RANK']} of {env['WORLD_SIZE']}"),
        "set -euo pipefail",
        f"cd {shlex.quote(str(run_dir / CODE_DIR))}",
        "export PYTHONUNBUFFERED=1",
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        f"exec {quoted_command(plan.argv)} > {shlex.quote(str(run_dir / LOG_NAME))} 2>&1",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class _OneGpuPlan(LaunchPlan):
    """A probe's plan as the Slurm backend renders it: one node, one GPU, one task."""

    @property
    def nodes(self) -> int:
        return 1

    @property
    def gpus_per_node(self) -> int:
        return 1


def write_probe_script(plan: LaunchPlan, run_dir: Path, backend: str) -> Path:
    """Stage the payload and write the probe's script (``launch.sh`` or a one-GPU ``launch.sbatch``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    stage_code(run_dir)
    if backend == "slurm":
        from dse.backends.slurm import render_sbatch

        path = run_dir / "launch.sbatch"
        one = _OneGpuPlan(**{f: getattr(plan, f) for f in plan.__dataclass_fields__})
        path.write_text(render_sbatch(one, run_dir).rstrip("\n") + "\n")
        return path
    path = run_dir / "launch.sh"
    path.write_text(render_probe_script(plan, run_dir))
    return path


def _execute(script: Path, backend: str, timeout_s: float) -> tuple[int | None, str | None]:
    """Run one probe script to its end: (exit code, the scheduler's end state or None)."""
    if backend == "slurm":
        from dse.backends.slurm import SlurmBackend, cancel, submit

        job, why = submit(script)
        if job is None:
            raise UserError(f"sbatch refused the probe: {why}", file=str(script))
        state = SlurmBackend(poll_s=2.0).wait(job, limit_s=timeout_s)
        if state.state in ("PENDING", "RUNNING"):
            cancel(job)
        return state.exit_code, state.state
    try:
        return subprocess.run(["bash", str(script)], timeout=timeout_s, check=False).returncode, None
    except subprocess.TimeoutExpired:
        return None, "TIMEOUT"


def run_probe(
    trial: TrialConfig,
    point: dict[str, Any],
    target: ProbeRank,
    out: Path,
    *,
    backend: str = "local",
    iters: int = DEFAULT_ITERS,
    timeout_s: float = 900.0,
    seed: int = 0,
) -> ProbeResult:
    """Probe one rank of ``trial``: write the script under ``out``, run it, parse its log."""
    if backend not in PROBE_BACKENDS:
        raise UserError(f"unknown backend {backend!r}; a probe runs on {', '.join(PROBE_BACKENDS)}", param="backend")
    world = trial.num_gpus
    plan = probe_plan(build_plan(trial, payload=PROBE_PAYLOAD, seed=seed), target, world, iters)
    script = write_probe_script(plan, out, backend)
    start = time.monotonic()
    code, state = _execute(script, backend, timeout_s)
    gpu_s = time.monotonic() - start
    ctx = ParseContext(gbs=int(trial.values["gbs"]), seq_length=int(trial.values["seq_length"]), num_gpus=world)
    metrics = parse_log(out / LOG_NAME, exit_code=code, scheduler_state=state, context=ctx)
    return ProbeResult(dict(point), world, target, out, metrics, gpu_s)


def result_row(r: ProbeResult, model_peak_gib: float | None = None) -> dict[str, Any]:
    """One line of ``probes.csv``: the point, the rank and what the probe measured (``measured``), beside the
    model's per-rank peak (``predicted``) where given."""
    m = r.metrics
    return {
        **r.point,
        "world": r.world,
        "rank": r.target.rank,
        "stage": r.target.stage,
        "layers": r.target.layers,
        "why": r.target.why,
        "status": m.status,
        "peak_memory_gib": m.peak_memory_gib,
        "peak_memory_reserved_gib": m.peak_memory_reserved_gib,
        "step_time_s": m.step_time_s,
        "gpu_minutes": round(r.gpu_s / 60.0, 3),
        "model_peak_memory_gib": model_peak_gib,
        "reason": m.reason,
        "run_dir": str(r.run_dir),
    }


def held_gib(m: RunMetrics) -> float | None:
    """What a probe's allocator held at its peak (``max reserved``: the caching allocator's blocks, fragmentation
    included, which is what runs out), else its ``max allocated`` where the log gives only that."""
    return m.peak_memory_reserved_gib or m.peak_memory_gib


def screen_reason(results: list[ProbeResult], buffers_gib: float, capacity_gib: float) -> tuple[bool, str | None]:
    """The probe screen's verdict on one point from its probes: (measured, why it is not launched or None).

    Not launched when a probed rank ran out of memory on its GPU, or when the largest memory a probed rank's
    allocator held, plus ``buffers_gib`` (what a probe cannot see: NCCL's communicators and buffers, the CUDA
    context; the model's figure), exceeds ``capacity_gib``. ``measured`` is False when no probe ended with a
    peak (it failed for another reason): the caller falls back to the model's screen."""
    for r in results:
        if r.metrics.status == "oom":
            return True, f"probe: rank {r.target.rank} ({r.target.why}) ran out of memory on one GPU (measured)"
    held = [(g, r) for r in results if r.metrics.status == "ok" and (g := held_gib(r.metrics))]
    if not held:
        return False, None
    peak, r = max(held, key=lambda x: x[0])
    if peak + buffers_gib <= capacity_gib:
        return True, None
    return True, (
        f"probe: rank {r.target.rank} ({r.target.why}) held {peak:.1f} GiB (measured) + {buffers_gib:.1f} GiB for "
        f"NCCL buffers and the CUDA context (predicted) > {capacity_gib:.0f} GiB GPU memory"
    )


def write_rows(path: Path, rows: list[dict[str, Any]], *, append: bool = False) -> None:
    """``rows`` as CSV at ``path`` (a header of every key seen), or appended to it (its header when new)."""
    import csv

    keys = list(dict.fromkeys(k for r in rows for k in r))
    new = not append or not path.exists()
    with open(path, "w" if new else "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def model_stage_gib(trial: TrialConfig) -> dict[str, float]:
    """The model's predicted peak (GiB) of the first, last and (where it counts them) middle pipeline stages (``mid``,
    the second, and ``stageK`` for each middle stage K), as a probe measures it: less what the model counts outside PyTorch's allocator (its reserve and the payload's measured
    extra: the CUDA context and NCCL's communicators, which a probe on a fake process group does not hold and its
    allocator's peak does not see; the probe screen adds them back, dse.forecast's ``buffers_gib``)."""
    from dse.perfmodel.model import prepare
    from dse.perfmodel.timing import DEFAULT_PARAMS

    prepared = prepare(trial)
    outside = prepared.memory.outside_gib(DEFAULT_PARAMS)
    stages = prepared.memory.stage_gib(DEFAULT_PARAMS, prepared.stack, middle=True)
    return {k: (v - outside if v else 0.0) for k, v in stages.items()}


def model_rank_gib(stages: dict[str, float], target: ProbeRank) -> float:
    """The model's figure for the probed rank: its own stage's (``first``, ``last``, or ``stageK`` for middle stage
    K of :func:`model_stage_gib`), or the worst stage's where the model counts no middle stage (a dense model's even
    or embedding-accounted split)."""
    if target.why == "first stage":
        return stages["first"]
    if target.why == "last stage":
        return stages["last"]
    return stages.get(f"stage{target.stage}") or max(stages.values())


def probe_point(
    trial: TrialConfig,
    point: dict[str, Any],
    out: Path,
    *,
    backend: str = "local",
    iters: int = DEFAULT_ITERS,
    timeout_s: float = 900.0,
    seed: int = 0,
) -> Iterator[tuple[ProbeResult, float]]:
    """Probe one point on each of its :func:`probe_ranks`, one after another (``out/rankNNNNN/``): each probe's
    result as it ends, with the model's predicted peak of the probed rank (:func:`model_rank_gib`)."""
    plan = build_plan(trial, payload=PROBE_PAYLOAD, seed=seed)
    model = model_stage_gib(trial)
    for target in probe_ranks(payload_config(plan), trial.num_gpus):
        result = run_probe(
            trial,
            point,
            target,
            out / f"rank{target.rank:05d}",
            backend=backend,
            iters=iters,
            timeout_s=timeout_s,
            seed=seed,
        )
        yield result, model_rank_gib(model, target)


def _points(space, point: dict[str, Any] | None, limit: int | None):
    """(index, point, trial) of each valid point to probe: ``point`` alone (its values over the space's
    settings), else the space's valid points in grid order, at most ``limit``."""
    from dse.rules.constraints import check
    from dse.rules.trial import resolve

    if point is not None:
        from dse.facts import knobs

        for name, value in point.items():
            try:
                point[name] = knobs.get(name, field=name).coerce(value, field=name)
            except UserError as e:  # the knob's error, as one of the `point` parameter's
                raise UserError(e.message, field=None, param="point") from None
        trial = resolve(space, point)
        rej = check(trial)
        if rej:
            raise UserError(f"this point breaks {rej.rule}: {rej.reason}", param="point")
        yield 0, point, trial
        return
    n = 0
    for index, p in enumerate(space.points()):
        trial = resolve(space, p)
        if check(trial) is not None:
            continue
        yield index, p, trial
        n += 1
        if limit is not None and n >= limit:
            return


def probe_space(
    space,
    point: dict[str, Any] | None,
    out: Path,
    *,
    backend: str = "local",
    iters: int = DEFAULT_ITERS,
    limit: int | None = None,
    timeout_s: float = 900.0,
) -> list[dict[str, Any]]:
    """Probe each point (:func:`_points`) on its :func:`probe_ranks`, one after another; write ``out/probes.csv``
    after each probe (a stopped command keeps what it measured); return its rows."""
    if space.backend.payload != PROBE_PAYLOAD:
        raise UserError(
            f"a probe runs the {PROBE_PAYLOAD} payload; this space's payload is {space.backend.payload!r}",
            file=str(space.source) if getattr(space, "source", None) else None,
            field="backend.payload",
        )
    out.mkdir(parents=True, exist_ok=True)
    if getattr(space, "source", None):  # dse calibrate DIR reads the probes against the space they probed
        import json

        (out / "probe.json").write_text(json.dumps({"space": str(Path(space.source).absolute())}) + "\n")
    rows: list[dict[str, Any]] = []
    for index, p, trial in _points(space, point, limit):
        probes = probe_point(
            trial, p, out / f"{index:05d}", backend=backend, iters=iters, timeout_s=timeout_s, seed=space.search.seed
        )
        for result, model_peak in probes:
            rows.append({"point": index, **result_row(result, model_peak)})
            write_rows(out / "probes.csv", rows)
    if not rows:
        raise UserError("no valid point to probe", field=None if point else "knobs", param="point" if point else None)
    return rows
