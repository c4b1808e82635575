"""The best configuration of a study, ready to launch: ``DIR/best/`` with its knobs, metrics and scripts.

``best.json`` holds the winning trial's run directory (relative to the study directory), every resolved knob,
its measured (or simulated) metrics and the trainer command line and environment; ``launch.sbatch`` is the
Slurm script for the space's system (rendered as ``dse dry-run`` renders it, with the payload package staged beside it under ``code/``);
``launch.sh``, the torchrun script for one machine, is written only when the best fits one node (a
multi-node layout under ``torchrun --nnodes 1`` cannot start); ``README`` says which file launches it and
where the time limit comes from. A study on the simulated payload gets scripts for the NeMo 2 payload: the
point of the file is to run the layout for real.

The time limit (decided here; the issue left the margin open). The estimate is the trial's run time
(``max_steps`` x its step time: measured, or the model's prediction when no step time was parsed), doubled,
plus :data:`START_UP_S` for the image import, NCCL set-up and the first (compiling) steps, rounded up to
whole :data:`ROUND_S`. The system file's ``slurm.time_limit`` (what each trial ran under) is kept when it is
longer; ``README`` says which one was used and why.

Where the figures come from: ``best.json``'s ``figures`` is "predicted by the model" for a simulated study
(the ``sim`` backend or payload) and "measured" otherwise, and its ``provenance`` holds the backend, truth and
calibration as ``leaderboard.csv`` names them; ``README`` says the same in a sentence.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

from dse.backends.slurm import slurm_seconds
from dse.fsutil import write_text
from dse.launch import LaunchPlan, build_plan
from dse.rules.space import Space
from dse.rules.trial import resolve
from dse.study.leaderboard import ModelError, Provenance
from dse.study.store import TrialRecord

BEST_DIR = "best"
README_NAME = "README"
START_UP_S = 15 * 60  # container import + distributed init + first steps, at 1-128 nodes (a generous guess)
RUN_MARGIN = 2.0  # the measured (or predicted) run time, doubled: step time varies run to run and node to node
ROUND_S = 5 * 60


def slurm_time(seconds: float) -> str:
    """``seconds`` as Slurm's ``D-HH:MM:SS`` (``HH:MM:SS`` under a day)."""
    s = int(math.ceil(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def time_limit(trial, metrics: dict, *, simulated: bool = False) -> tuple[str, str]:
    """The best's Slurm time limit and where it comes from (one sentence for ``best/README``; ``simulated``:
    the trial's step time is itself the model's)."""
    configured = trial.system.slurm.time_limit
    step = metrics.get("step_time_s")
    source = "the trial's, predicted by the model" if simulated else "the trial's, measured"
    if not isinstance(step, (int, float)) or not step > 0:
        from dse.perfmodel import predict

        step, source = predict(trial).step_time_s, "predicted by the performance model"
    run_s = trial.layout.max_steps * step
    estimate = math.ceil((RUN_MARGIN * run_s + START_UP_S) / ROUND_S) * ROUND_S
    how = (
        f"{trial.layout.max_steps} steps x {step:.3g} s ({source}) = {run_s:.0f} s, x {RUN_MARGIN:g}, "
        f"+ {START_UP_S // 60} min start-up (image import, NCCL set-up), rounded up to {ROUND_S // 60} min"
    )
    conf_s = slurm_seconds(configured)
    if conf_s is None or conf_s >= estimate:
        return configured, (
            f"the system file's slurm.time_limit ({trial.system.name}), at least the estimate "
            f"{slurm_time(estimate)}: {how}"
        )
    return slurm_time(estimate), (
        f"{how}; longer than the system file's slurm.time_limit {configured} (what each trial ran under)"
    )


def with_time_limit(trial, limit: str):
    """``trial`` on a copy of its system whose ``slurm.time_limit`` is ``limit`` (the trial is not mutated)."""
    system = trial.system.model_copy(update={"slurm": trial.system.slurm.model_copy(update={"time_limit": limit})})
    return dataclasses.replace(trial, system=system)


def best_record(records: Sequence[TrialRecord]) -> TrialRecord | None:
    ok = [r for r in records if r.ok]
    return max(ok, key=lambda r: (r.reward, -r.number)) if ok else None


def write_best(
    space: Space,
    records: Sequence[TrialRecord],
    out_dir: Path,
    *,
    provenance: Provenance | None = None,
    model: ModelError | None = None,
) -> Path | None:
    """Write ``out_dir/best/`` for the best ``ok`` trial; None when no trial succeeded. ``provenance``: where
    the figures come from (by default the space's own backend's), which ``best.json`` and ``README`` say;
    ``model``: the model's error on the study's runs (the README's memory headroom is judged against it)."""
    from dse.backends.scripts import stage_code

    rec = best_record(records)
    if rec is None:
        return None
    prov = provenance or Provenance.of_space(space, space.backend.kind)
    trial = resolve(space, rec.knobs)
    limit, limit_source = time_limit(trial, rec.metrics, simulated=prov.simulated)
    trial = with_time_limit(trial, limit)
    payload = "nemo2" if space.backend.payload == "sim" else space.backend.payload
    plan = build_plan(trial, payload=payload)
    d = Path(out_dir) / BEST_DIR
    d.mkdir(parents=True, exist_ok=True)
    one_node = trial.layout.num_nodes == 1
    info = {
        "trial": rec.number,
        "reward": rec.reward,
        "objective": space.objective.metric,
        "run_dir": _relative(rec.run_dir, Path(out_dir)),
        "knobs": trial.as_dict(),
        "varied": rec.knobs,
        "metrics": rec.metrics,
        "figures": prov.figures,
        "provenance": prov.as_dict(),
        "payload": payload,
        "argv": list(plan.argv),
        "env": dict(plan.env),
    }
    write_text(d / "best.json", json.dumps(info, indent=2, default=str))
    stage_code(d)
    _write_scripts(plan, d, one_node)
    if prov.simulated and not str(prov.truth).startswith("twin"):
        model = None  # the model against its own figures: no error to speak of, the prior stands
    memory = memory_lines(space, rec, trial, model, measured=not prov.simulated)
    _write_readme(d, rec.number, trial, limit, limit_source, one_node, prov, memory)
    return d


def memory_lines(
    space: Space, rec: TrialRecord, trial, model: ModelError | None, *, measured: bool = True
) -> list[str]:
    """The README's memory paragraph: the predicted peak against the GPU's memory (the headroom), the model's
    memory error (its MAPE on the study's measured runs, else the screen's margin, which the model's error on
    known outcomes sets), the measured peak when there is one (``measured``: the study's figures are), and a
    warning when the headroom is inside the error: the layout may not fit on the real machine."""
    from dse.perfmodel import predict
    from dse.perfmodel.calibrate import calibrated_params

    m = rec.metrics
    peak, capacity = m.get("predicted_peak_memory_gib"), m.get("predicted_memory_gib")
    if peak is None or capacity is None:  # recorded before trials kept their prediction: predicted now
        params = calibrated_params(space.backend.calibration)
        p = predict(trial, flops_convention=space.backend.flops_convention, params=params)
        peak, capacity = p.peak_memory_gib, p.gpu_memory_gib
    headroom = capacity - peak
    if model is not None and model.memory is not None:
        error = model.memory * peak
        why = f"+-{model.memory:.1%} of the peak ({error:.1f} GiB), its error on {model.mem_n} measured runs"
    else:
        error = space.search.screen_margin * capacity
        why = (
            f"+-{error:.1f} GiB ({space.search.screen_margin:.0%} of the GPU's memory, the screen's margin: "
            "none measured here)"
        )
    lines = [
        "",
        f"Memory: predicted peak {peak:.1f} of {capacity:.1f} GiB, headroom {headroom:.1f} GiB "
        f"({headroom / capacity:.1%}); the model's memory error {why}.",
    ]
    if measured and (got := m.get("peak_memory_gib")) is not None:
        lines.append(f"Measured peak (allocated): {got:.1f} GiB.")
    if headroom < error:
        lines.append(
            f"WARNING: the predicted headroom ({headroom:.1f} GiB) is inside the model's memory error "
            f"({error:.1f} GiB): this layout may run out of memory; run it briefly before a long job."
        )
    return lines


def _write_scripts(plan: LaunchPlan, d: Path, one_node: bool) -> None:
    """``launch.sbatch`` (and ``launch.sh`` when the best fits one node) naming no path of this machine: each finds
    its files through ``DSE_DIR`` (sbatch: the submit directory; bash: the script's own folder), so ``best/`` can be
    copied to a login node and launched there."""
    from dse.backends.local import SCRIPT_NAME as LOCAL_SCRIPT
    from dse.backends.local import render_local_script
    from dse.backends.scripts import DIR_VAR, RELOCATABLE_ROOT, relocatable
    from dse.backends.slurm import write_relocatable_sbatch

    write_relocatable_sbatch(plan, d)
    stale = d / LOCAL_SCRIPT
    if not one_node:
        if stale.exists():  # from an earlier best of this study (resumed) that fitted one node
            stale.unlink()
        return
    stand_in = Path(RELOCATABLE_ROOT) / d.name
    lines = render_local_script(plan, stand_in).splitlines()
    at = lines.index("set -euo pipefail") + 1
    lines[at:at] = [f'{DIR_VAR}="${{{DIR_VAR}:-$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)}}"']
    write_text(stale, relocatable("\n".join(lines), stand_in))


def _relative(run_dir: str | None, out_dir: Path) -> str | None:
    """``run_dir`` relative to the study directory when it is inside it (as the store keeps it), so a moved
    or copied study's ``best.json`` still names its own run."""
    if run_dir is None:
        return None
    try:
        return Path(run_dir).absolute().relative_to(out_dir.absolute()).as_posix()
    except ValueError:
        return run_dir


def _write_readme(
    d: Path,
    number: int,
    trial,
    limit: str,
    limit_source: str,
    one_node: bool,
    prov: Provenance,
    memory: Sequence[str] = (),
) -> None:
    k = trial.layout
    n, g = k.num_nodes, trial.system.gpus_per_node
    if prov.simulated:
        figures = f"Its figures were predicted by the model, not measured ({prov.describe()}): run it to measure them."
    else:
        figures = f"Its figures were measured ({prov.describe()})."
    lines = [
        f"Best trial {number}: {trial.recipe.name} on {n} x {g} {trial.system.gpu} "
        f"(tp {k.tp}, pp {k.pp}, cp {k.cp}, vp {k.vp}, mbs {k.mbs}, gbs {k.gbs}).",
        figures,
        "",
        "Launch from this folder (or a copy of it): sbatch launch.sbatch  (the Slurm script for the space's",
        "system; payload in code/; DSE_DIR overrides where it looks for code/)",
    ]
    if one_node:
        lines.append("    or: bash launch.sh       (torchrun on one machine with its GPUs)")
    else:
        lines.append(f"No launch.sh: the layout needs {n} nodes, and torchrun on one machine cannot start it;")
        lines.append("launch.sbatch is the launch file.")
    lines += [
        "",
        f"Time limit {limit}: {limit_source}.",
        *memory,
        "",
        "best.json: every resolved knob, the trial's metrics, the trainer command line and environment.",
    ]
    write_text(d / README_NAME, "\n".join(lines) + "\n")
