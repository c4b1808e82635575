"""The calibration file of ``dse calibrate``: TOML (written with tomlkit), ``[params]`` name = value and
``[provenance]``.

Kept apart from :mod:`dse.calibrate` (which needs the model) so that :mod:`dse.space` can check a space's
``[backend] calibration`` when the space is read.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from dse.errors import UserError
from dse.fsutil import write_text


@dataclass
class Calibration:
    """A calibration: the GPU it was made on, parameter values, provenance (see :mod:`dse.calibrate`)."""

    gpu: str
    params: dict[str, float]
    sources: list[str]
    runs: int
    date: str = ""
    fit: dict | None = None
    loo: dict | None = None


# ------------------------------------------------------------------------------------------


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
    """Parse a calibration file; ``names`` given, a parameter outside them is refused (dse.calibrate passes
    the model's; dse.space, below the model, checks the rest of the file when a space is read)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"not valid TOML: {e}", file=file) from None
    params = doc.get("params")
    if not isinstance(params, dict) or not params:
        raise UserError("no [params] table; a calibration file has [params] name = value", file=file, field="params")
    out = {}
    for k, v in params.items():
        if names is not None and k not in names:
            raise UserError(f"unknown parameter; allowed: {', '.join(sorted(names))}", file=file, field=f"params.{k}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise UserError(f"{v!r} is not a number", file=file, field=f"params.{k}")
        out[k] = float(v)
    prov = doc.get("provenance") or {}
    gpu = prov.get("gpu")
    if not isinstance(gpu, str):
        raise UserError("missing provenance.gpu (the GPU the runs were on)", file=file, field="provenance.gpu")
    return Calibration(
        gpu=gpu,
        params=out,
        sources=list(prov.get("sources", [])),
        runs=int(prov.get("runs", 0)),
        date=str(prov.get("date", "")),
    )


def load_calibration(path: str | Path, gpu: str | None = None, names: Collection[str] | None = None) -> Calibration:
    """Read a calibration file; ``gpu`` given, refuse one made on another GPU."""
    p = Path(path)
    if not p.is_file():
        raise UserError("calibration file not found", file=str(p))
    cal = loads(p.read_text(), file=str(p), names=names)
    if gpu is not None and cal.gpu != gpu:
        raise UserError(f"calibrated on {cal.gpu}, not on {gpu}", file=str(p), field="provenance.gpu")
    return cal
