"""The calibration file of ``dse calibrate``: TOML (written with tomlkit), ``[params]`` name = value and
``[provenance]``.

Kept apart from :mod:`dse.perfmodel.calibrate` (which needs the model) so that :mod:`dse.rules.space` can check a space's
``[backend] calibration`` when the space is read.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from dse.errors import UserError
from dse.fsutil import write_text
from dse.inputs import parse_toml, read_text

MAX_MISS_GIB = 10_000.0  # far beyond any GPU's memory: a larger miss is a wrong file, not a measurement


@dataclass
class Calibration:
    """A calibration: the GPU it was made on, parameter values, provenance (see :mod:`dse.perfmodel.calibrate`)."""

    gpu: str
    params: dict[str, float]
    sources: list[str]
    runs: int
    date: str = ""
    fit: dict | None = None
    loo: dict | None = None
    # a study's refit (dse.perfmodel.refit): the most a run's peak came above the model's forecast at its launch, GiB (an
    # out-of-memory run: at least up to the GPU's memory); the guided agent of a study that starts from this file
    # holds it back from every point's headroom. None: not measured (dse calibrate's files)
    memory_miss_gib: float | None = None


@dataclass(frozen=True)
class Range:
    """The values a calibration parameter may take: ``low`` to ``high``, both included."""

    low: float
    high: float
    why: str = ""

    def holds(self, v: float) -> bool:
        return self.low <= v <= self.high

    def text(self) -> str:
        return f">= {self.low:g} and <= {self.high:g}"


# Every parameter of dse.perfmodel.timing.Params, with the values a calibration may give it (tests check the
# names against Params). Rates divide a time, so they stay at least 0.001 of a peak (0 divides by zero, 1e-300
# overflows); shares are fractions; times and memory are bounded far beyond any measured value, so no value makes
# a prediction negative, infinite or turns a check off.
_RATE = Range(1e-3, 10.0, why="a rate relative to a peak; it divides a time")
_SHARE = Range(0.0, 1.0, why="a share of a time that is hidden")
_TIME = Range(0.0, 3600.0, why="seconds")
PARAM_RANGES: dict[str, Range] = {
    **dict.fromkeys(
        (
            "gemm_eff_bf16",
            "gemm_eff_fp8",
            "gemm_eff_fp8_blackwell",
            "attn_eff",
            "attn_eff_blackwell",
            "attn_eff_ampere",
            "ultra_tensor_ratio",
            "container_eff_nemo24",
            "container_eff_nemo25",
            "container_eff_bridge26",
            "container_ultra_bridge26",
            "container_host_bridge26",
            "mxfp8_gemm_ratio",
            "elementwise_scale",
            "unfused_scores_scale",
            "nvlink_eff",
            "scaleout_eff",
            "optimizer_bw_eff",
            "host_link_eff",
            "moe_a2a_eff",
            "moe_a2a_nic_eff",
            "moe_flex_speedup",
            "gemm_eff_nvfp4",
            "nccl_ub_nvls_gain",
        ),
        _RATE,
    ),
    **dict.fromkeys(
        ("tp_overlap", "cp_overlap", "dp_overlap", "tp_overlap_base", "offload_overlap", "moe_a2a_overlap"), _SHARE
    ),
    **dict.fromkeys(
        (
            "host_layer_s_grace",
            "collective_latency_s",
            "layer_overhead_s",
            "step_overhead_s",
            "moe_gemm_launch_s",
            "moe_layer_overhead_s",
            "moe_host_fwd_s",
            "moe_host_expert_fwd_s",
        ),
        _TIME,
    ),
    "moe_gemm_m_half": Range(0.0, 1e7, why="rows per expert at half the GEMM rate"),
    "moe_a2a_nic_plane_gbps": Range(1.0, 1e5, why="Gb/s of one network plane; it divides a time"),
    "moe_imbalance": Range(1.0, 1e4, why="the busiest expert-parallel rank's token copies over the mean"),
    "moe_host_grace_ratio": Range(0.1, 100.0, why="a Grace host's launch time over an x86 host's"),
    "moe_gemm_bf16_blackwell_ratio": Range(
        0.1, 100.0, why="a bf16 grouped GEMM's rows per expert at half rate on Blackwell over moe_gemm_m_half"
    ),
    "moe_host_bwd_ratio": Range(0.0, 100.0, why="a MoE layer's backward launch time over its forward's"),
    "bf16_over_fp8_eff_blackwell": Range(
        0.1, 10.0, why="Blackwell's bf16 GEMM efficiency over its FP8 one; it multiplies a rate"
    ),
    "memory_reserve_gib": Range(0.0, 1024.0, why="GiB"),
    "memory_offset_gib": Range(-1024.0, 1024.0, why="GiB, added to every predicted peak"),
    "memory_fragmentation": Range(0.0, 100.0, why="a share of the activation memory"),
    "cuda_graph_pool_share": Range(0.0, 100.0, why="a share of the activation memory"),
    "nccl_ub_memory_gib": Range(0.0, 1024.0, why="GiB"),
    "logits_bytes": Range(0.0, 64.0, why="bytes per logit"),
    "logits_bytes_native": Range(0.0, 64.0, why="bytes per logit"),
}


def dumps(cal: Calibration) -> str:
    """The calibration as TOML, built as a tomlkit document (values quoted and escaped by the library, the
    header a TOML comment); :func:`loads` reads it back with tomllib."""
    doc = tomlkit.document()
    doc.add(
        tomlkit.comment(
            "dse calibration: parameters of the performance model refitted to measured runs (dse calibrate)"
        )
    )
    params = tomlkit.table()
    for k, v in cal.params.items():
        params.add(k, float(v))
    prov = tomlkit.table()
    prov.add("gpu", cal.gpu)
    prov.add("sources", [str(s) for s in cal.sources])
    prov.add("date", cal.date)
    prov.add("runs", int(cal.runs))
    if cal.memory_miss_gib is not None:
        prov.add("memory_miss_gib", round(float(cal.memory_miss_gib), 3))
    for title, block in (
        ("fit_before", (cal.fit or {}).get("before")),
        ("fit_after", (cal.fit or {}).get("after")),
        ("leave_one_out", cal.loo),
    ):
        for k, v in (block or {}).items():
            if v is not None:
                prov.add(f"{title}_{k}", round(float(v), 3))
    doc.add("params", params)
    doc.add("provenance", prov)
    return tomlkit.dumps(doc)


def write(cal: Calibration, path: str | Path) -> Path:
    """Write the calibration file atomically (:func:`dse.fsutil.write_text`): an interrupted ``dse calibrate``
    leaves the old file, never half of one."""
    return write_text(path, dumps(cal))


def loads(text: str, *, file: str = "<calibration>", names: Collection[str] | None = None) -> Calibration:
    """Parse a calibration file; ``names`` given, a parameter outside them is refused (dse.perfmodel.calibrate passes
    the model's; dse.rules.space, below the model, checks the rest of the file when a space is read)."""
    doc = parse_toml(text, file=file)
    params = doc.get("params")
    if not isinstance(params, dict) or not params:
        raise UserError("no [params] table; a calibration file has [params] name = value", file=file, field="params")
    out = {k: _param(k, v, file, names) for k, v in params.items()}
    prov = doc.get("provenance") or {}
    if not isinstance(prov, dict):
        raise UserError("expected a table", file=file, field="provenance")
    gpu = prov.get("gpu")
    if not isinstance(gpu, str):
        raise UserError("missing provenance.gpu (the GPU the runs were on)", file=file, field="provenance.gpu")
    return Calibration(
        gpu=gpu,
        params=out,
        sources=_sources(prov.get("sources", []), file),
        runs=_runs(prov.get("runs", 0), file),
        date=str(prov.get("date", "")),
        memory_miss_gib=_miss(prov.get("memory_miss_gib"), file),
    )


def _miss(v: object, file: str) -> float | None:
    """``provenance.memory_miss_gib``: GiB, a finite number from 0 to the largest GPU memory's tenfold; absent: None."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0 <= v <= MAX_MISS_GIB):
        raise UserError(
            f"{v!r} is not a number of GiB from 0 to {MAX_MISS_GIB:g}", file=file, field="provenance.memory_miss_gib"
        )
    return float(v)


def _param(name: str, v: object, file: str, names: Collection[str] | None) -> float:
    """One ``[params]`` value: a known parameter (of ``names``, else of :data:`PARAM_RANGES`), a finite number
    in its range."""
    known = PARAM_RANGES if names is None else names
    if name not in known:
        raise UserError(f"unknown parameter; allowed: {', '.join(sorted(known))}", file=file, field=f"params.{name}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise UserError(f"{v!r} is not a number; give a finite one", file=file, field=f"params.{name}")
    r = PARAM_RANGES.get(name)
    if r is not None and not r.holds(float(v)):
        raise UserError(
            f"{v!r} is out of range; {name} ({r.why}) must be {r.text()}", file=file, field=f"params.{name}"
        )
    return float(v)


def _sources(v: object, file: str) -> list[str]:
    """``provenance.sources``: the runs' files (informational), a list of strings."""
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise UserError(f"{v!r} is not a list of file names", file=file, field="provenance.sources")
    return list(v)


def _runs(v: object, file: str) -> int:
    """``provenance.runs``: how many runs were fitted (a count, informational)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**9:
        raise UserError(f"{v!r} is not a count of runs (0 to 10^9)", file=file, field="provenance.runs")
    return v


def load_calibration(path: str | Path, gpu: str | None = None, names: Collection[str] | None = None) -> Calibration:
    """Read a calibration file; ``gpu`` given, refuse one made on another GPU."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():  # a symlink loop is said so by the reader
        raise UserError("calibration file not found", file=str(p))
    cal = loads(read_text(p), file=str(p), names=names)
    if gpu is not None and cal.gpu != gpu:
        raise UserError(f"calibrated on {cal.gpu}, not on {gpu}", file=str(p), field="provenance.gpu")
    return cal
