"""``[search] screen = "probe"``: each point probed on one GPU before it is launched at scale (:mod:`dse.probe`),
and kept from launch on what the probe measured.

A point is probed on the ranks that bound its memory (:func:`dse.probe.probe_ranks`: 1 to 3 one-GPU runs, on the
study's backend: this machine's GPU, or one-GPU Slurm jobs). It is not launched (``screened``, with the probe's
figures as its reason) when a probed rank ran out of memory, or when the most memory a probed rank's allocator
held plus what a probe cannot see (NCCL's buffers and the CUDA context: the model's figure,
:meth:`dse.forecast.Screen.buffers_gib`) exceeds the GPU's memory. A probe that measured no peak (it failed for
another reason) leaves the point to the model's memory screen. The out-of-memory neighbour rule of
:mod:`dse.perfmodel.refit` still applies first, so a point it screens is not probed.

The probes of a study live in its directory, apart from its runs: ``probes/NNNNN/rankRRRRR/`` (NNNNN: the
point's index in the space's grid, as ``dse probe`` numbers it) and ``probes/probes.csv`` (one line per probed
rank: the point, the rank, what it measured, the model's figure beside it and whether the point was screened).
``dse.json``'s ``probes`` counts them and their GPU-minutes, which are not in the runs' GPU-hours; the study's
summary says both (:class:`dse.study.leaderboard.ProbeCost`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dse.errors import UserError
from dse.forecast import Screen
from dse.probe import PROBE_BACKENDS, PROBE_PAYLOAD, probe_point, result_row, screen_reason, write_rows
from dse.rules.space import Space
from dse.rules.trial import TrialConfig
from dse.study import outdir
from dse.study.leaderboard import ProbeCost

__all__ = ["PROBES_DIR", "ProbeScreen", "check_probe_screen"]

PROBES_DIR = "probes"
PROBES_CSV = "probes.csv"


def check_probe_screen(space: Space, backend: str) -> None:
    """Refuse, before anything runs, a probe screen the study cannot run: probes run the mcore payload on one
    GPU of the local backend or as one-GPU Slurm jobs."""
    if space.search.screen != "probe":
        return
    f = space.source or None
    if backend not in PROBE_BACKENDS:
        raise UserError(
            f'screen = "probe" probes each point on one GPU of the {" or ".join(PROBE_BACKENDS)} backend; this '
            f'study runs on {backend!r} (use screen = "memory" there)',
            file=f,
            field="search.screen",
        )
    if space.backend.payload != PROBE_PAYLOAD:
        raise UserError(
            f'screen = "probe" runs the {PROBE_PAYLOAD} payload under a fake process group; this space\'s payload '
            f"is {space.backend.payload!r}",
            file=f,
            field="search.screen",
        )


def grid_index(space: Space, action: dict[str, int]) -> int:
    """The point's index in the space's grid order (:meth:`dse.rules.space.Space.points`: the last knob fastest)."""
    index = 0
    for name in space.knob_names:
        index = index * len(space.knobs[name]) + int(action[name])
    return index


class ProbeScreen:
    """The probe screen of one study in ``out``: :meth:`reason` probes a point and says why it is not launched,
    or None. ``screen`` gives the model's figures (the study's model, refit as its runs come)."""

    def __init__(self, space: Space, out: Path, backend: str, screen: Screen, *, worker: bool = False):
        self.space, self.out, self.backend, self.screen, self.worker = space, out, backend, screen, worker

    def reason(self, action: dict[str, int], trial: TrialConfig) -> str | None:
        """Probe the point (its ranks one after another), record the probes, and give the screen's verdict."""
        index = grid_index(self.space, action)
        point = {n: self.space.knobs[n][int(action[n])] for n in self.space.knob_names}
        results, rows = [], []
        probes = probe_point(
            trial,
            point,
            self.out / PROBES_DIR / f"{index:05d}",
            backend=self.backend,
            timeout_s=self.space.backend.timeout_s,
            seed=self.space.search.seed,
        )
        for result, model_peak in probes:
            results.append(result)
            rows.append({"point": index, **result_row(result, model_peak)})
        buffers = self.screen.buffers_gib(trial)
        measured, why = screen_reason(results, buffers, self.screen.point(trial).memory_gib)
        if not measured:
            model = self.screen.model_reason(trial)
            why = f"the probe measured no peak; {model}" if model else None
        for row in rows:
            row.update(buffers_gib=round(buffers, 3), screened=why is not None)
            row["run_dir"] = str(Path(row["run_dir"]).relative_to(self.out))
        self._record(rows, screened=why is not None)
        return why

    def _record(self, rows: list[dict[str, Any]], *, screened: bool) -> None:
        """The probes' rows appended to ``probes/probes.csv``; ``dse.json``'s ``probes`` counted up."""
        with outdir.serialized(self.out, self.worker):
            write_rows(self.out / PROBES_DIR / PROBES_CSV, rows, append=True)
            meta = outdir.read_meta(self.out)
            was = ProbeCost.of_meta(meta) or ProbeCost()
            minutes = sum(float(r["gpu_minutes"]) for r in rows if math.isfinite(float(r["gpu_minutes"])))
            meta["probes"] = ProbeCost(
                points=was.points + 1,
                ranks=was.ranks + len(rows),
                screened=was.screened + int(screened),
                gpu_minutes=round(was.gpu_minutes + minutes, 4),
            ).as_dict()
            outdir.write_meta(self.out, meta)
