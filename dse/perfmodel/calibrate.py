"""``dse calibrate``: refit the performance model's parameters to a user's own runs.

The shipped parameters (:data:`dse.perfmodel.timing.DEFAULT_PARAMS`) are fitted to NVIDIA's published
throughput; another stack (container, kernels, layer spec) runs the same layouts at another speed. From a
few real runs this module refits the parameters those runs can identify, by the MAP fit of
:mod:`dse.perfmodel.fit` (squared log error plus a Gaussian prior centred on the shipped value), and writes
them as a plain TOML calibration file that ``dse predict --calibration`` and the simulated backend
(``[backend] calibration = "FILE"``) read.

Decisions where the issue is silent:

* Step time and peak memory are fitted separately: no memory parameter moves time, and of the time parameters
  only ``moe_imbalance`` moves memory (the busiest rank's routed activations), so the memory fit starts from the
  time fit's values: two small fits, the same MAP as one large one where no parameter moves both, and faster.
* The time parameters fitted by default are those of :data:`STACK_TIME`, in that order, kept where the runs'
  predicted step time moves with them (a parameter no run depends on is not identifiable) and at most one
  per run; ``--params`` names them explicitly (more than there are runs is refused).
* The stack parameters have wide priors (a log-width of 1.0 is a factor e^1 = 2.7 at one sigma), the other
  parameters keep the published fit's widths, so that a few runs of one kind cannot drag them far.
* Measured memory is Megatron's peak *allocated* memory (TSV ``peak_allocated_gib``, the study's
  ``peak_memory_gib``); the offset :attr:`Params.memory_offset_gib` absorbs what the stack keeps outside the
  model's count (or that the model's reserve counts but the allocator does not see).
* A failed trial whose reason says out-of-memory is evidence that the layout did not fit: a censored observation
  (its peak is above the GPU's memory, by an unknown amount), whose term is the log-probability of that under the
  measured peaks' scatter (:func:`memory_loss`).
* A calibration is for one GPU: runs of several GPUs, or of another GPU than ``--gpu``, are refused, and so
  is a calibration file used for another GPU.
* Speed: each run is prepared once (:func:`dse.perfmodel.model.prepare`) and the fit evaluates only what the
  parameters change (the step time, or the peak memory). The leave-one-out refits start at the full fit's values
  with one short Nelder-Mead descent on the full loss less the left-out run's term (``LOO_STEP``), since one run of
  many moves the optimum little; where the other runs are fewer than the parameters, the refit is a full fit of
  fewer parameters, as before. An 86-run study calibrates in seconds instead of minutes, its leave-one-out error
  within a tenth of a percentage point of refitting every run from scratch on the studies measured
  (bench/calibrate_speed.py --scratch).
"""

from __future__ import annotations

import csv
import datetime as _dt
import functools
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from scipy.special import log_ndtr

from dse.errors import UserError
from dse.facts.calibration_file import Calibration, dumps  # noqa: F401 (dumps re-exported for the CLI)
from dse.facts.calibration_file import load_calibration as _load
from dse.facts.calibration_file import loads as _loads
from dse.inputs import csv_row, read_text
from dse.perfmodel.fit import PRIORS, Prior, minimise, nelder_mead
from dse.perfmodel.model import predict, prepare
from dse.perfmodel.timing import DEFAULT_PARAMS, PARAM_NAMES, Params

D = DEFAULT_PARAMS
# Stack parameters: wide priors centred on the shipped values (see the module docstring).
STACK_PRIORS: dict[str, Prior] = {
    "elementwise_scale": Prior(D.elementwise_scale, 1.0, "log"),  # unfused norms, SwiGLU, RoPE, casts
    "unfused_scores_scale": Prior(D.unfused_scores_scale, 1.0, "log"),  # unfused attention's softmax traffic
    "gemm_eff_bf16": Prior(D.gemm_eff_bf16, 1.0),  # another GEMM library / tile set
    "layer_overhead_s": Prior(D.layer_overhead_s, 1.5, "log"),  # launches and small kernels per layer
    "step_overhead_s": Prior(D.step_overhead_s, 1.5, "log"),
    "memory_offset_gib": Prior(D.memory_offset_gib, 8.0, "linear"),  # GiB
    "memory_fragmentation": Prior(D.memory_fragmentation, 1.5),
    # MoE: the busiest expert-parallel rank's token copies over the mean. NVIDIA's published rows force-balance the
    # router (1, the shipped value); a real router's is what one's runs say, so the prior is loose (log width 0.5:
    # 1.65 at one sigma) and held at 1 or more. Runs without expert parallelism do not identify it
    "moe_imbalance": Prior(D.moe_imbalance, 0.5, "log_min1"),
    # MoE: the host's launch time of a MoE layer's forward (another CPU, another Transformer Engine / Megatron-Core)
    "moe_host_fwd_s": Prior(D.moe_host_fwd_s, 1.0, "log"),
    # bytes per logit element at the last stage's peak (dse.perfmodel.stack.logits_peak_bytes): another loss keeps
    # other fp32 copies (the logits scale with mbs x seq x vocab, so a wrong count misjudges every larger
    # micro-batch); log width 1.0, a factor 2.7 at one sigma
    "logits_bytes": Prior(D.logits_bytes, 1.0, "log"),
    "logits_bytes_native": Prior(D.logits_bytes_native, 1.0, "log"),
}
CALIBRATION_PRIORS: dict[str, Prior] = {
    **{n: Prior(getattr(D, n), p.width, p.kind) for n, p in PRIORS.items()},
    **STACK_PRIORS,
}
# last: a Grace host's time per layer, identifiable only from GB200 / GB300 runs whose layers are short on the GPU
STACK_TIME = (
    "elementwise_scale",
    "unfused_scores_scale",
    "gemm_eff_bf16",
    "layer_overhead_s",
    "attn_eff",
    "step_overhead_s",
    "host_layer_s_grace",
    "moe_imbalance",
    "moe_host_fwd_s",
)
MEMORY = ("memory_offset_gib", "memory_fragmentation")
# memory parameters --params may name besides: the bytes per logit element (a study's refit fits the one its loss
# uses where its runs depend on it: dse.perfmodel.refit)
LOGITS_MEMORY = ("logits_bytes", "logits_bytes_native")
TIME_SIGMA = 0.05  # log scatter assumed for a measured step time (repeat runs of one layout: a few %)
MEM_SIGMA = 0.03
OOM_WORDS = ("oom", "out of memory")


@dataclass(frozen=True)
class Run:
    """One measured run: the resolved trial, measured step time (s) and peak allocated memory (GiB)."""

    name: str
    trial: object
    step_time_s: float | None
    peak_memory_gib: float | None
    oom: bool = False
    where: str = ""  # the file and row (or trial) it came from, for errors
    key: tuple = ()  # what it ran (a TSV row's columns but its name and measurements): repeats share it
    # a probe's peak is one pipeline stage's (dse probe): "first", "last", "stageK" (middle stage K) or "mid" (a
    # middle stage of unknown index: the second, the model's); None: the run's peak, the largest stage's
    stage: str | None = None


def run_step_s(p, P: Params, stage: str | None) -> float:
    """The model's step time (s) of a prepared layout ``p`` under ``P`` as a run measures it: the whole step, or what a
    probe of a stage measures (its compute alone: :meth:`dse.perfmodel.model.Prepared.probe_step_s`)."""
    return p.step_time_s(P) if stage is None else p.probe_step_s(P, stage)


def run_peak_gib(p, P: Params, stage: str | None) -> float:
    """The model's peak (GiB) of a prepared layout ``p`` under ``P`` as a run measures it: the largest stage's, or a
    probed stage's (a middle stage where the model counts none: the largest, as ``dse probe`` compares it) less what
    the model counts outside PyTorch's allocator (:meth:`dse.perfmodel.memory.MemoryCounts.outside_gib`: the CUDA
    context and NCCL's communicators, which a probe on a fake process group never holds), the part a probe measures."""
    if stage is None:
        return p.peak_memory_gib(P)
    stages = p.memory.stage_gib(P, p.stack, middle=True)
    return (stages.get(stage) or max(stages.values())) - p.memory.outside_gib(P)


# ---- sources -------------------------------------------------------------------------------------------


# The integer columns of a TSV row that are no knob and the values each may take: far beyond any real run, so that
# a typo, a wrong column or a hostile row (hidden 1e9, a 5,000-digit number) is a one-line refusal naming the row,
# never a traceback or a model evaluated where it divides by zero. A knob's column (tp 0) is refused outside the
# knob's own range (dse.facts.knobs.Column).
_INT_RANGES: dict[str, tuple[int, int]] = {
    "num_layers": (1, 10_000),
    "hidden_size": (1, 1_000_000),
    "num_attention_heads": (1, 100_000),
    "num_query_groups": (1, 100_000),
    "ffn_hidden_size": (1, 10_000_000),
    "vocab_size": (1, 100_000_000),
    "seq_length": (1, 100_000_000),  # the architecture's; the knob's own column is in the knob's range
    "num_gpus": (1, 1_000_000),
    "num_experts": (0, 100_000),
    "moe_topk": (0, 100_000),
    "moe_ffn_hidden_size": (0, 10_000_000),
    "moe_shared_expert_size": (0, 10_000_000),
    "moe_first_dense_layers": (0, 10_000),
    "kv_channels": (0, 1_000_000),
}


class RowError(ValueError):
    """A TSV row's value out of its range (the reader turns it into a one-line error naming file and row)."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


def _int(row: dict, name: str, default: int | None = 0, bounds: tuple[int, int] | None = None) -> int:
    """The integer in column ``name`` (``default`` when empty or absent; None: required), within ``bounds``
    (by default :data:`_INT_RANGES`)."""
    raw = row.get(name)
    if raw is None or str(raw).strip() == "":
        if default is None:
            raise RowError(name, "is empty; give a value")
        return default
    text = str(raw).strip()
    if len(text) > 12 or not text.lstrip("+-").isdigit():
        raise RowError(name, f"{text[:40]!r} is not an integer of at most 12 digits")
    value = int(text)
    lo, hi = bounds or _INT_RANGES.get(name, (0, 10**12))
    if not lo <= value <= hi:
        raise RowError(name, f"{value} is out of range; it must be >= {lo} and <= {hi}")
    return value


def arch_from_row(row: dict):
    """The architecture of one TSV row (bench/data/h200_real_runs.tsv's columns; with ``num_experts``, the MoE
    columns of bench/data/moe_gpu_runs.tsv: experts, top-k, expert and shared-expert FFN, first dense layers,
    head size), as a :class:`dse.recipes.models.ModelArch`."""
    from dse.recipes.models import ModelArch

    if _int(row, "num_experts") and _int(row, "moe_topk", 2) < 1:
        raise RowError("moe_topk", "must be at least 1 in a row with experts")
    return ModelArch(
        row["model"],
        _int(row, "num_layers", None),
        _int(row, "hidden_size", None),
        _int(row, "num_attention_heads", None),
        _int(row, "num_query_groups", None),
        _int(row, "ffn_hidden_size", None),
        _int(row, "vocab_size", None),
        str(row["gated"]) == "True",
        num_experts=_int(row, "num_experts"),
        moe_topk=_int(row, "moe_topk", 2),
        moe_ffn_hidden_size=_int(row, "moe_ffn_hidden_size"),
        moe_shared_expert_size=_int(row, "moe_shared_expert_size"),
        moe_first_dense_layers=_int(row, "moe_first_dense_layers"),
        kv_channels=_int(row, "kv_channels") or None,
    )


def _knob_cell(row: dict, name: str, knob) -> Any:
    """Knob ``name``'s value in one TSV row, as its catalogue column says (:class:`dse.facts.knobs.Column`)."""
    column = knob.column
    raw = row.get(name)
    if raw is None or str(raw).strip() == "":
        if column.required:
            raise RowError(name, "is empty; give a value")
        return knob.default if column.empty is None else column.empty
    if knob.kind == "int":
        return _int(row, name, None, (knob.minimum or 0, knob.maximum or 10**12))
    if knob.kind == "bool":
        return str(raw).strip() == "True"
    return raw


def _knob_columns(row: dict, *, moe: bool) -> dict:
    from dse.facts import knobs

    return {
        name: _knob_cell(row, name, k)
        for name, k in knobs.CATALOGUE.items()
        if k.column is not None and k.column.moe == moe
    }


def moe_values_from_row(row: dict) -> dict:
    """A MoE row's knob values (the catalogue's MoE columns: expert parallelism and the dispatcher's options); none
    for a dense row."""
    return _knob_columns(row, moe=True) if _int(row, "num_experts") else {}


def knob_values_from_row(row: dict) -> dict:
    """One TSV row's knob values: each catalogue knob with a calibration column (:class:`dse.facts.knobs.Column`), the
    MoE columns in a MoE row only; every other knob keeps its default."""
    return {**_knob_columns(row, moe=False), **moe_values_from_row(row)}


def trial_from_row(row: dict, gpu: str):
    """A TrialConfig for one TSV row (format of bench/data/h200_real_runs.tsv): its architecture as a one-off
    recipe on one GPU, its knobs by the catalogue's columns (:func:`knob_values_from_row`: the local layer spec's
    unfused attention unless the row has ``attention_backend``); a row with ``num_experts`` is a MoE run
    (:func:`arch_from_row`, :func:`moe_values_from_row`)."""
    from dse.facts import knobs
    from dse.recipes.models import Recipe
    from dse.rules.space import load_system
    from dse.rules.trial import TrialConfig

    arch = arch_from_row(row)
    recipe = Recipe(
        arch.name,
        arch,
        nemo2_recipe="",
        mbridge_recipe=None,
        seq_length=_int(row, "seq_length", None),
        num_gpus_default=1,
    )
    n = _int(row, "num_gpus", 1)
    system = load_system({"gpu": gpu, "gpus_per_node": n, "nvlink_domain": n})
    values = {name: k.default for name, k in knobs.CATALOGUE.items()}
    values.update(knob_values_from_row(row), num_nodes=1)
    # the rows are recipes.mcore runs (bench/h200_real_runs.py, bench/h200_te_runs.py) unless they say otherwise
    return TrialConfig(recipe=recipe, system=system, values=MappingProxyType(values), payload=payload_from_row(row))


def payload_from_row(row: dict) -> str:
    """The stack a TSV row ran (column ``payload``; empty or absent: ``mcore``): a payload's name or a payload's
    variant (dse.perfmodel.stack: ``mcore:torch-adamw`` for recipes.mcore with megatron-core alone); anything else is
    refused, where it would silently be priced as NVIDIA's recipes."""
    from dse.perfmodel.stack import PAYLOAD_VARIANTS, STACKS

    name = str(row.get("payload") or "").strip() or "mcore"
    known = (*STACKS, *PAYLOAD_VARIANTS)
    if name not in known:
        raise RowError("payload", f"{name[:40]!r} is not a payload; use one of {', '.join(known)}")
    return name


def _tsv_needs() -> tuple[str, ...]:
    """The columns every calibration TSV has: the architecture's, the catalogue's required knob columns
    (:class:`dse.facts.knobs.Column`) and the measured step time."""
    from dse.facts import knobs

    required = tuple(n for n, k in knobs.CATALOGUE.items() if k.column is not None and k.column.required)
    return _ARCH_NEEDS + required + ("step_time_ms",)


_ARCH_NEEDS = (
    "model",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "ffn_hidden_size",
    "vocab_size",
    "gated",
)


def _float(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


#: The largest calibration TSV read, and the most runs one calibration fits: a calibration is fitted to the runs
#: one measured (the shipped TSVs hold 13 to 144 rows, under 60 KB); leave-one-out refits once per run, and 200 runs
#: take over a minute on a busy 2-core machine, so 300 keeps a calibration to minutes.
MAX_TSV_BYTES = 1024 * 1024
MAX_RUNS = 300


def _tsv_rows(path: Path) -> list[dict]:
    """The rows of a calibration TSV of at most :data:`MAX_TSV_BYTES` bytes, its header checked."""
    import io

    text = read_text(path, cap=MAX_TSV_BYTES)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t")
    missing = [c for c in _tsv_needs() if c not in (reader.fieldnames or [])]
    if missing:
        raise UserError(
            f"missing column(s) {', '.join(missing)}; the format is that of bench/data/h200_real_runs.tsv",
            file=str(path),
            field="header",
        )
    return list(reader)


def runs_from_tsv(path: Path, gpu: str | None) -> tuple[list[Run], str | None]:
    rows = _tsv_rows(path)
    from dse.facts.hardware import HARDWARE, gpu_from_device_name

    # a gpu column may hold dse's names or the device's as torch prints it (bench/data/moe_gpu_runs.tsv)
    gpus = {gpu_from_device_name(r["gpu"]) or r["gpu"] for r in rows if r.get("gpu")}
    if len(gpus) > 1:
        raise UserError(
            f"runs of several GPUs ({', '.join(sorted(gpus))[:200]}); calibrate one GPU at a time",
            file=str(path),
            field="gpu",
        )
    file_gpu = next(iter(gpus), None)
    if gpu and file_gpu and file_gpu != gpu:
        raise UserError(f"runs are on {file_gpu[:40]!r}, not {gpu} as --gpu says", file=str(path), field="gpu")
    use = gpu or file_gpu
    if use is None:
        raise UserError("no gpu column; say which GPU the runs are on with --gpu", file=str(path), field="gpu")
    if use not in HARDWARE:
        raise UserError(f"{use[:40]!r} is not a GPU dse knows ({', '.join(HARDWARE)})", file=str(path), field="gpu")
    runs = []
    for i, r in enumerate(rows):
        st = _float(r.get("step_time_ms"))
        if st is None:
            continue
        name = f"row {i + 2}"
        try:
            trial = trial_from_row(r, use)
            mem = _float(r.get("peak_allocated_gib"))
            runs.append(Run(r.get("name") or name, trial, st / 1e3, mem, where=f"{path}: {name}", key=_row_key(r)))
        except RowError as e:
            raise UserError(str(e), file=f"{path}: {name}", field=e.name) from None
        except UserError as e:  # the system of the row (its GPUs) refused
            raise UserError(str(e), file=f"{path}: {name}") from None
        except (ValueError, KeyError) as e:  # a value the knob catalogue or the system refuses
            raise UserError(f"cannot be read: {str(e)[:200]}", file=f"{path}: {name}") from None
    return runs, use


def _study_space(path: Path):
    """The space of the study directory ``path`` (its dse.json names the space file, found from the working
    directory or the study, else the shipped space it names, as ``dse run --space`` found it), with the paths of
    the study's dse.json and leaderboard.csv."""
    from dse.rules.space import load_space, space_path

    meta_p, board_p = path / "dse.json", path / "leaderboard.csv"
    for p in (meta_p, board_p):
        if not p.is_file():
            raise UserError("not a study directory (needs dse.json and leaderboard.csv) nor a TSV", file=str(p))
    try:
        meta = json.loads(read_text(meta_p))
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"cannot read: {str(e)[:200] or type(e).__name__}", file=str(meta_p)) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("space", ""), str):
        raise UserError("not a dse.json (an object naming its space file)", file=str(meta_p))
    space_ref = Path(meta.get("space", ""))
    cands = [space_ref, path / space_ref, path / space_ref.name, space_path(space_ref)]
    space_p = next((c for c in cands if c.is_file()), None)
    if space_p is None:
        raise UserError(
            f"the study's space file {space_ref} is not found (from the working directory or the study, nor a "
            "shipped space)",
            file=str(meta_p),
            field="space",
        )
    return load_space(space_p), meta_p, board_p


def _board_point(space, row: dict, board_p: Path) -> dict:
    """The space's point of one leaderboard row (each knob's value as the space spells it)."""
    from dse.facts import knobs

    point = {}
    for name, values in space.knobs.items():
        raw = row.get(name, "")
        match = [v for v in values if str(v) == raw or str(knobs.CATALOGUE[name].coerce(v)) == raw]
        if not match:
            raise UserError(f"value {raw!r} is not one of the space's {values!r}", file=str(board_p), field=name)
        point[name] = match[0]
    return point


def _board_run(row: dict, trial) -> Run | None:
    """The run of one leaderboard row: an ``ok`` trial with a step time, an out-of-memory failure, or None."""
    name = f"trial {row.get('trial')}"
    if row.get("status", "") in ("screened", "rejected"):  # never launched: its reason is no measurement of it
        return None
    if row.get("status", "") == "ok":
        st = _float(row.get("step_time_s"))
        return None if st is None else Run(name, trial, st, _float(row.get("peak_memory_gib")))
    if any(w in (row.get("reason") or "").lower() for w in OOM_WORDS):
        return Run(name, trial, None, None, oom=True)
    return None


def runs_from_study(path: Path, gpu: str | None) -> tuple[list[Run], str | None]:
    """``ok`` trials of a study directory (dse.json + leaderboard.csv) and its out-of-memory failures."""
    from dse.rules.trial import resolve

    space, meta_p, board_p = _study_space(path)
    study_gpu = space.system.gpu
    if gpu and study_gpu != gpu:
        raise UserError(f"the study ran on {study_gpu}, not {gpu} as --gpu says", file=str(meta_p), field="gpu")
    runs = []
    with open(board_p, newline="") as fh:
        for row in map(csv_row, csv.DictReader(fh)):
            if row.get("gpu") and row["gpu"] != study_gpu:
                raise UserError(
                    f"trial {row.get('trial')} ran on {row['gpu']}, the study's system is {study_gpu}",
                    file=str(board_p),
                    field="gpu",
                )
            run = _board_run(row, resolve(space, _board_point(space, row, board_p)))
            if run is not None:
                runs.append(replace(run, where=f"{board_p}: {run.name}"))
    if (path / PROBES_CSV).is_file():  # screen = "probe": the study's probes, apart from its runs
        runs += _probe_runs(space, path / PROBES_CSV)
    return runs, study_gpu


PROBES_CSV = "probes/probes.csv"  # a study's probes (dse.study.probe_screen)
PROBE_META = "probe.json"  # what dse probe --out DIR writes beside its probes.csv: the space it probed
_STAGE_OF_WHY = {"first stage": "first", "last stage": "last"}


def _middle_stage(index: object) -> str:
    """The model's name of a probed middle stage: ``stageK`` for its index K (``probes.csv``'s ``stage``), ``mid``
    (the second) where the row has none."""
    text = str(index or "").strip()
    return f"stage{int(text)}" if text.isdigit() else "mid"


def _probe_runs(space, csv_p: Path) -> list[Run]:
    """The observations of a ``probes.csv``: each probed rank's peak and step time (``ok``) or its out-of-memory end,
    of its pipeline stage (the model's first, last or a middle stage). A probe's step time is the stage's compute
    alone (no communication, no bubble), which the fit compares with the model's compute of that stage
    (:func:`run_step_s`): probes fit the compute terms, and the communication and bubble terms stay the model's."""
    from dse.rules.trial import resolve

    runs = []
    with open(csv_p, newline="") as fh:
        for row in map(csv_row, csv.DictReader(fh)):
            trial = resolve(space, _board_point(space, row, csv_p))
            stage = _STAGE_OF_WHY.get(row.get("why", "")) or _middle_stage(row.get("stage"))
            name = f"probe of point {row.get('point')} rank {row.get('rank')}"
            peak, step = _float(row.get("peak_memory_gib")), _float(row.get("step_time_s"))
            if row.get("status") == "ok" and (peak or step):
                runs.append(Run(name, trial, step or None, peak or None, where=f"{csv_p}: {name}", stage=stage))
            elif row.get("status") == "oom":
                runs.append(Run(name, trial, None, None, oom=True, where=f"{csv_p}: {name}", stage=stage))
    return runs


def runs_from_probes(path: Path, gpu: str | None) -> tuple[list[Run], str | None]:
    """The probes of ``dse probe --out DIR``: its ``probes.csv``, of the space its ``probe.json`` names (from the
    working directory or the probes' directory)."""
    from dse.rules.space import load_space

    meta_p = path / PROBE_META
    try:
        meta = json.loads(read_text(meta_p))
    except (ValueError, RecursionError) as e:
        raise UserError(f"cannot read: {str(e)[:200] or type(e).__name__}", file=str(meta_p)) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("space"), str):
        raise UserError("not a probe.json (an object naming its space file)", file=str(meta_p), field="space")
    space_p = next((c for c in (Path(meta["space"]), path / meta["space"]) if c.is_file()), Path(meta["space"]))
    if not space_p.is_file():
        raise UserError(f"the probed space file {space_p} is not found", file=str(meta_p), field="space")
    space = load_space(space_p)
    if gpu and space.system.gpu != gpu:
        raise UserError(f"the probes ran on {space.system.gpu}, not {gpu} as --gpu says", file=str(meta_p), field="gpu")
    return _probe_runs(space, path / "probes.csv"), space.system.gpu


# A measured figure against the model's prediction for its layout: the model is within tens of percent on the
# stacks it was fitted to and a factor of two or three on others, while a wrong unit is a factor of 1,000 (seconds
# or nanoseconds given as milliseconds) or 2^30 (bytes as GiB). Past this factor a run is refused as a unit error.
UNIT_FACTOR = 10.0
# Runs of one layout (repeats) whose step times differ by more than this factor, or whose peaks differ by more than
# MEMORY_REPEAT_FACTOR, contradict each other: one of them is not what the row says.
REPEAT_FACTOR = 1.25
MEMORY_REPEAT_FACTOR = 1.1
# A fit whose step times are still off by more than this (mean absolute percentage) does not describe the runs.
MAX_FIT_MAPE = 50.0


def _predicted(run: Run):
    """The model's figures for the run's layout; a layout the model cannot evaluate is refused in one line."""
    try:
        return predict(run.trial)
    except (ValueError, ArithmeticError, KeyError) as e:
        raise UserError(f"the model cannot evaluate this layout: {str(e)[:200]}", file=run.where or run.name) from None


def _check_plausible(run: Run, gpu: str) -> None:
    """Refuse a run whose figures no run of its layout can have: a step time off the model's by more than
    :data:`UNIT_FACTOR` (a unit error), a peak above the GPU's memory or off the model's by that factor."""
    from dse.facts.hardware import HARDWARE

    pr = _predicted(run)
    where = run.where or run.name
    if run.step_time_s is not None:
        model_s = pr.step_time_s if run.stage is None else prepare(run.trial).probe_step_s(DEFAULT_PARAMS, run.stage)
        ratio = run.step_time_s / model_s
        if not 1 / UNIT_FACTOR <= ratio <= UNIT_FACTOR:
            raise UserError(
                f"step time {run.step_time_s * 1e3:.6g} ms is {ratio:.3g} times the model's {model_s * 1e3:.4g} "
                f"ms for this layout; a unit error? (a TSV's step_time_ms is milliseconds, a study's step_time_s "
                f"seconds)",
                file=where,
                field="step_time",
            )
    if run.peak_memory_gib is not None:
        cap = HARDWARE[gpu].memory_gib
        ratio = run.peak_memory_gib / max(pr.peak_memory_gib, 1e-3)
        if run.peak_memory_gib > cap or not 1 / UNIT_FACTOR <= ratio <= UNIT_FACTOR:
            raise UserError(
                f"peak memory {run.peak_memory_gib:.6g} GiB is not plausible on a {cap:g} GiB {gpu} (the model "
                f"predicts {pr.peak_memory_gib:.4g} GiB); a unit error? (peak_allocated_gib is GiB, 2^30 bytes)",
                file=where,
                field="peak_memory",
            )


# A TSV's columns that name or measure a run rather than say what ran (a repeat differs only in these)
_MEASURED = {"name", "log", "steps", "step_time_ms", "tflops_per_gpu", "tokens_per_s_per_gpu", "peak_allocated_gib"}
_MEASURED |= {"peak_reserved_gib", "loss_first", "loss_last"}


def _row_key(row: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in row.items() if k not in _MEASURED and isinstance(k, str)))


def _spread(a: float, b: float) -> float:
    return max(a, b) / min(a, b)


def _merge_repeats(runs: Sequence[Run]) -> list[Run]:
    """One run per layout: repeats that agree (step times within :data:`REPEAT_FACTOR`, peaks within
    :data:`MEMORY_REPEAT_FACTOR`) become one run with their median figures, so a row given 40 times weighs and
    costs one run; repeats that disagree are refused, naming both."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.key or (id(r),), []).append(r)
    out = []
    for same in groups.values():
        first = same[0]
        for r in same[1:]:
            for what, a, b, limit in (
                ("step times", first.step_time_s, r.step_time_s, REPEAT_FACTOR),
                ("peak memories", first.peak_memory_gib, r.peak_memory_gib, MEMORY_REPEAT_FACTOR),
            ):
                if a is not None and b is not None and _spread(a, b) > limit:
                    raise UserError(
                        f"the same layout as {first.where or first.name} with {what} {a:.6g} and {b:.6g}: repeats "
                        "that disagree; keep the one that is right",
                        file=r.where or r.name,
                    )
        if len(same) == 1:
            out.append(first)
            continue
        st = [r.step_time_s for r in same if r.step_time_s is not None]
        mem = [r.peak_memory_gib for r in same if r.peak_memory_gib is not None]
        out.append(
            Run(
                first.name,
                first.trial,
                statistics.median(st) if st else None,
                statistics.median(mem) if mem else None,
                oom=all(r.oom for r in same),
                where=first.where,
                key=first.key,
            )
        )
    return out


def load_runs(sources: Sequence[str | Path], gpu: str | None = None) -> tuple[list[Run], str]:
    """Every usable run of ``sources`` (study directories or TSVs), all on one GPU (returned)."""
    runs: list[Run] = []
    seen: dict[str, str] = {}
    for src in sources:
        p = Path(src)
        try:
            if p.is_dir() and (p / PROBE_META).is_file():
                got, g = runs_from_probes(p, gpu)
            elif p.is_dir():
                got, g = runs_from_study(p, gpu)
            elif p.is_file():
                got, g = runs_from_tsv(p, gpu)
            else:
                raise UserError("no such file or directory", file=str(p))
        except UnicodeDecodeError as e:  # a binary file given as a TSV, or in place of a leaderboard.csv
            raise UserError(f"not UTF-8 text (a binary file?): {e.reason} at byte {e.start}", file=str(p)) from None
        except csv.Error as e:  # a line longer than the csv module reads, a NUL byte
            raise UserError(f"not a table dse can read: {e}", file=str(p)) from None
        if g is not None:
            seen[str(p)] = g
        runs += got
    if len(set(seen.values())) > 1:
        raise UserError(
            "sources are of several GPUs ("
            + ", ".join(f"{k}: {v}" for k, v in seen.items())
            + "); calibrate one GPU at a time",
            field="SOURCE",
        )
    if not any(r.step_time_s or r.peak_memory_gib for r in runs):
        raise UserError(
            "no usable runs (an ok trial, a TSV row with a step time, or a probe with a peak)",
            field="SOURCE",
            file=", ".join(map(str, sources)),
        )
    g = next(iter(seen.values()))
    runs = _merge_repeats(runs)
    if len(runs) > MAX_RUNS:
        raise UserError(
            f"{len(runs)} distinct runs; a calibration fits at most {MAX_RUNS} (leave-one-out refits once per run)",
            field="SOURCE",
            file=", ".join(map(str, sources)),
        )
    for r in runs:
        _check_plausible(r, g)
    return runs, g


# ---- the fit -------------------------------------------------------------------------------------------


# A run's share of a fit's loss is one squared log error, so the loss of a fit on every run but one (leave-one-out)
# is the full loss less that run's term: each source below gives every run's term under a parameter set at once
# (the runs prepared once, dse.perfmodel.model.prepare: only what the parameters change is evaluated), summed in
# the order of the runs as the plain loss always was.
Terms = Callable[[Params], list[float]]


@dataclass(frozen=True)
class Loss:
    """A fit's data term: each run's term under a parameter set (:data:`Terms`), the order they are summed in and
    the scale (sigma^2, which the sum is divided by); called with parameters, the loss over every run."""

    terms: Terms
    order: tuple[int, ...]
    scale: float

    def total(self, terms: list[float], skip: int | None = None) -> float:
        """The loss of ``terms`` (one per run, as :attr:`terms` gives them) over every run but ``skip``."""
        return sum(terms[i] for i in self.order if i != skip) / self.scale

    def __call__(self, P: Params) -> float:
        return self.total(self.terms(P))


def _z_space(names: Sequence[str], base: Params):
    """(start, prior centres, widths, to_params) of a MAP fit of ``names`` in the priors' z space, from ``base``."""
    priors = [CALIBRATION_PRIORS[n] for n in names]
    centre = np.array([p.to_z(getattr(base, n)) if p.kind != "linear" else p.centre for n, p in zip(names, priors)])
    centre_prior = np.array([p.to_z(p.centre) for p in priors])
    width = np.array([p.width for p in priors])

    def to_params(z) -> Params:
        return base.with_values(**{n: p.from_z(float(v)) for n, p, v in zip(names, priors, z)})

    return centre, centre_prior, width, to_params


def _map_fit(names: Sequence[str], loss_of, base: Params, restarts: int = 2) -> Params:
    centre, centre_prior, width, to_params = _z_space(names, base)

    def loss(z: np.ndarray) -> float:
        return loss_of(to_params(z)) + float(np.sum(((z - centre_prior) / width) ** 2))

    return to_params(minimise(loss, centre, width, restarts))  # from the shipped values


# Leave-one-out refits start at the full fit's optimum, which one run of many moves little: one Nelder-Mead descent
# from there, its first simplex a tenth of the full fit's and stopped when its values agree within 1e-4 (the loss
# is a chi-square: a hundred-thousandth of one run's one-sigma miss), instead of the full fit's two descents, its
# coordinate grid and its restarts. The simplex's first vertices are the same for every left-out run and evaluated
# once (:class:`_Memo`).
LOO_STEP = 0.03
LOO_TOL = 1e-4
LOO_ITERS = 400


class _Memo:
    """Each run's terms at the parameter vectors (z) already evaluated, shared by the leave-one-out refits."""

    def __init__(self, loss: Loss, to_params: Callable[[np.ndarray], Params], size: int = 64) -> None:
        self.loss, self.to_params, self.size = loss, to_params, size
        self.seen: dict[bytes, list[float]] = {}

    def terms(self, z: np.ndarray) -> list[float]:
        key = z.tobytes()
        hit = self.seen.get(key)
        if hit is None:
            hit = self.loss.terms(self.to_params(z))
            if len(self.seen) < self.size:
                self.seen[key] = hit
        return hit


def _refit_without(names: Sequence[str], loss: Loss, fitted: Params, skip: int, memo: _Memo) -> Params:
    """The MAP fit of ``names`` on every run but ``skip``, from the full fit's values ``fitted`` (see LOO_STEP)."""
    _, centre_prior, width, _ = _z_space(names, DEFAULT_PARAMS)
    start = np.array([CALIBRATION_PRIORS[n].to_z(getattr(fitted, n)) for n in names])

    def objective(z: np.ndarray) -> float:
        return loss.total(memo.terms(z), skip) + float(np.sum(((z - centre_prior) / width) ** 2))

    return memo.to_params(nelder_mead(objective, start, step=LOO_STEP, iters=LOO_ITERS, tol=LOO_TOL))


def time_loss(runs: Sequence[Run]) -> Loss:
    """Squared log error of the predicted step times over the runs with one, over ``TIME_SIGMA``^2."""
    timed = [(i, prepare(r.trial), math.log(r.step_time_s), r.stage) for i, r in enumerate(runs) if r.step_time_s]

    def terms(P: Params) -> list[float]:
        out = [0.0] * len(runs)
        for i, p, ls, stage in timed:
            out[i] = (math.log(run_step_s(p, P, stage)) - ls) ** 2
        return out

    return Loss(terms, tuple(t[0] for t in timed), TIME_SIGMA**2)


def memory_loss(runs: Sequence[Run]) -> Loss:
    """Squared log error of the predicted peaks over the runs with one, over ``MEM_SIGMA``^2; an out-of-memory run is
    a censored observation (its peak is above the GPU's memory): -2 log of the probability that a peak scattered
    as a measured one (``MEM_SIGMA``) around the prediction exceeds the GPU's memory (SciPy's ``log_ndtr``), a
    one-sided term that pushes the prediction above the memory and vanishes once it is well above."""
    measured = [
        (i, prepare(r.trial), math.log(r.peak_memory_gib), r.stage) for i, r in enumerate(runs) if r.peak_memory_gib
    ]
    ooms = [(i, prepare(r.trial), r.stage) for i, r in enumerate(runs) if r.oom]

    def terms(P: Params) -> list[float]:
        out = [0.0] * len(runs)
        for i, p, lm, stage in measured:
            pm = run_peak_gib(p, P, stage)
            out[i] = (math.log(pm) - lm) ** 2 if pm > 0 else 100.0
        for i, p, stage in ooms:  # censored: the peak is above the GPU's memory, by how much unknown
            pm, gpu_gib = run_peak_gib(p, P, stage), p.hw.memory_gib
            z = math.log(max(pm, 1e-3) / gpu_gib) / MEM_SIGMA
            out[i] = -2.0 * MEM_SIGMA**2 * float(log_ndtr(z))  # -2 log P(peak > memory), in the loss's units
        return out

    return Loss(terms, tuple(m[0] for m in measured) + tuple(o[0] for o in ooms), MEM_SIGMA**2)


def identifiable(
    runs: Sequence[Run], names: Sequence[str], base: Params = DEFAULT_PARAMS, threshold: float = 0.005
) -> list[str]:
    """Those of ``names`` that move some run's predicted step time by more than ``threshold`` (log) when
    the parameter moves by one prior width."""
    timed = [(prepare(r.trial), r.stage) for r in runs if r.step_time_s]
    ref = [math.log(run_step_s(p, base, stage)) for p, stage in timed]
    out = []
    for n in names:
        pr = CALIBRATION_PRIORS[n]
        moved = base.with_values(**{n: pr.from_z(pr.to_z(getattr(base, n)) + pr.width)})
        if max(abs(math.log(run_step_s(p, moved, stage)) - r0) for (p, stage), r0 in zip(timed, ref)) > threshold:
            out.append(n)
    return out


def choose_params(runs: Sequence[Run], requested: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(time parameters, memory parameters) to fit; refuses unknown names and more than there are runs."""
    n_time = sum(1 for r in runs if r.step_time_s)
    n_mem = sum(1 for r in runs if r.peak_memory_gib or r.oom)
    if requested:
        unknown = [n for n in requested if n not in CALIBRATION_PRIORS]
        if unknown:
            raise UserError(
                f"unknown parameter(s) {', '.join(unknown)}; calibratable: {', '.join(CALIBRATION_PRIORS)}",
                param="params",
            )
        t = [n for n in requested if n not in (*MEMORY, *LOGITS_MEMORY)]
        m = [n for n in requested if n in (*MEMORY, *LOGITS_MEMORY)]
        if len(t) > n_time or len(m) > n_mem:
            raise UserError(
                f"{len(requested)} parameters asked for but only {n_time} runs with a step time and "
                f"{n_mem} with a memory figure; ask for at most as many as there are runs",
                param="params",
            )
        return t, m
    t = identifiable(runs, STACK_TIME)[:n_time] if n_time else []
    m = list(MEMORY[:n_mem])
    return t, m


def fit_runs(
    runs: Sequence[Run], time_names: Sequence[str], mem_names: Sequence[str], base: Params = DEFAULT_PARAMS
) -> Params:
    P = base
    if time_names:
        P = _map_fit(time_names, time_loss(runs), P)
    if mem_names:
        P = _map_fit(mem_names, memory_loss(runs), P)
    return P


def errors(runs: Sequence[Run], P: Params) -> dict[str, float | None]:
    """Step-time and memory MAPE (%) of ``P`` on ``runs``."""
    st, mem = [], []
    for r in runs:
        if not (r.step_time_s or r.peak_memory_gib):
            continue
        p = prepare(r.trial)
        if r.step_time_s:
            st.append(abs(run_step_s(p, P, r.stage) - r.step_time_s) / r.step_time_s)
        if r.peak_memory_gib:
            pm = run_peak_gib(p, P, r.stage)
            mem.append(abs(pm - r.peak_memory_gib) / r.peak_memory_gib)
    return {
        "step_time_mape": 100 * statistics.fmean(st) if st else None,
        "memory_mape": 100 * statistics.fmean(mem) if mem else None,
    }


def probe_rows(runs: Sequence[Run], before: Params, after: Params) -> list[dict[str, Any]]:
    """Each probe (a run of one stage) beside the model's figures of its stage, shipped (``before``) and fitted
    (``after``): its measured peak and step time against the model's peak of the stage and its compute alone
    (:func:`run_step_s`), which is all a probe measures."""
    out = []
    for r in runs:
        if r.stage is None:
            continue
        p = prepare(r.trial)
        out.append(
            {
                "probe": r.name,
                "stage": r.stage,
                "peak_memory_gib": r.peak_memory_gib,
                "oom": r.oom,
                "model_peak_memory_gib": run_peak_gib(p, before, r.stage),
                "fitted_peak_memory_gib": run_peak_gib(p, after, r.stage),
                "step_time_s": r.step_time_s,
                "model_step_time_s": run_step_s(p, before, r.stage),
                "fitted_step_time_s": run_step_s(p, after, r.stage),
            }
        )
    return out


Progress = Callable[[int, int], None]  # (fits done, fits in all): dse calibrate's progress bar


def _loo_fit(
    runs: Sequence[Run],
    i: int,
    time_names: Sequence[str],
    mem_names: Sequence[str],
    base: Params,
    full: Params,
    memos: tuple[tuple[Loss, _Memo], tuple[Loss, _Memo]],
) -> Params:
    """The parameters fitted on every run but ``i``: refitted from the full fit's (:func:`_refit_without`), or from
    scratch as the full fit is when the remaining runs are fewer than the parameters (then fewer are fitted)."""
    rest = [r for j, r in enumerate(runs) if j != i]
    n_t = sum(1 for r in rest if r.step_time_s)
    n_m = sum(1 for r in rest if r.peak_memory_gib or r.oom)
    t_names, m_names = list(time_names)[:n_t], list(mem_names)[:n_m]
    if len(t_names) < len(time_names) or len(m_names) < len(mem_names):
        return fit_runs(rest, t_names, m_names, base)
    (t_loss, t_memo), (m_loss, m_memo) = memos
    P = full
    if t_names:
        got = _refit_without(t_names, t_loss, full, i, t_memo)
        P = P.with_values(**{n: getattr(got, n) for n in t_names})
    if m_names and i in m_loss.order:  # a run with no memory figure leaves the memory fit as it is
        got = _refit_without(m_names, m_loss, full, i, m_memo)
        P = P.with_values(**{n: getattr(got, n) for n in m_names})
    return P


def leave_one_out(
    runs: Sequence[Run],
    time_names,
    mem_names,
    base: Params = DEFAULT_PARAMS,
    *,
    fitted: Params | None = None,
    progress: Progress | None = None,
) -> dict:
    """MAPE on each measured run of a fit on the others (the same parameters, fewer if fewer runs remain), each
    refit starting from the full fit's values ``fitted`` (fitted here when not given); ``progress(done, total)``
    after each refit."""
    st: list[float] = []
    mem: list[float] = []
    measured = [i for i, r in enumerate(runs) if r.step_time_s]
    if len(measured) < 2:
        return {"step_time_mape": None, "memory_mape": None}
    full = fitted if fitted is not None else fit_runs(runs, time_names, mem_names, base)
    t_loss, m_loss = time_loss(runs), memory_loss(runs)
    memos = (
        (t_loss, _Memo(t_loss, _z_space(list(time_names), base)[3])),
        (m_loss, _Memo(m_loss, _z_space(list(mem_names), full)[3])),
    )
    for k, i in enumerate(measured):
        P = _loo_fit(runs, i, time_names, mem_names, base, full, memos)
        e = errors([runs[i]], P)
        step_mape = e["step_time_mape"]
        assert step_mape is not None  # run i has a step time (it is in measured), so errors gives its MAPE
        st.append(step_mape)
        if e["memory_mape"] is not None:
            mem.append(e["memory_mape"])
        if progress is not None:
            progress(k + 1, len(measured))
    return {"step_time_mape": statistics.fmean(st), "memory_mape": statistics.fmean(mem) if mem else None}


def calibrate(
    sources: Sequence[str | Path],
    *,
    params: Sequence[str] | None = None,
    gpu: str | None = None,
    loo: bool = True,
    progress: Progress | None = None,
) -> tuple[Calibration, list[dict]]:
    """Fit, and the per-parameter report rows (name, old, new, moved); ``progress(done, total)`` after the fit and
    after each leave-one-out refit (total: 1, or 1 + the runs with a step time)."""
    runs, g = load_runs(sources, gpu)
    t_names, m_names = choose_params(runs, params)
    n_timed = sum(1 for r in runs if r.step_time_s)
    total = 1 + (n_timed if loo and n_timed >= 2 else 0)  # leave_one_out refits nothing with fewer than two
    P = fit_runs(runs, t_names, m_names)
    if progress is not None:
        progress(1, total)
    report = []
    for n in (*t_names, *m_names):
        old, new = getattr(DEFAULT_PARAMS, n), getattr(P, n)
        pr = CALIBRATION_PRIORS[n]
        shift = abs(pr.to_z(new) - pr.to_z(old)) / pr.width  # in prior widths
        report.append({"name": n, "old": old, "new": new, "moved": bool(shift > 0.1), "shift_sigma": shift})
    fit: dict[str, Any] = {"before": errors(runs, DEFAULT_PARAMS), "after": errors(runs, P)}
    if any(r.stage is not None for r in runs):
        fit["probes"] = probe_rows(runs, DEFAULT_PARAMS, P)
    _check_fit(P, t_names, m_names, fit)
    on_loo = None if progress is None else (lambda done, _n: progress(1 + done, total))
    cal = Calibration(
        gpu=g,
        params={n: getattr(P, n) for n in (*t_names, *m_names)},
        sources=[str(s) for s in sources],
        runs=len(runs),
        date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        fit=fit,
        loo=leave_one_out(runs, t_names, m_names, fitted=P, progress=on_loo) if loo else None,
    )
    return cal, report


def _check_fit(P: Params, t_names: Sequence[str], m_names: Sequence[str], fit: dict) -> None:
    """Refuse a fit that the calibration file's reader would refuse (a parameter outside its range) or that does
    not describe the runs (step times still off by more than :data:`MAX_FIT_MAPE` %): no file is written."""
    from dse.facts.calibration_file import PARAM_RANGES

    for n in (*t_names, *m_names):
        v, r = getattr(P, n), PARAM_RANGES.get(n)
        if not math.isfinite(v) or (r is not None and not r.holds(v)):
            raise UserError(
                f"the fit gives {n} = {v:.6g}, outside its range ({r.text() if r else 'finite'}): the runs do not "
                "fit the model with the parameters they identify (are the units right? more runs?); nothing written",
                field="SOURCE",
            )
    after = fit["after"]["step_time_mape"]
    if after is not None and after > MAX_FIT_MAPE:
        raise UserError(
            f"after the fit the model's step times are still {after:.0f}% off the runs' on average (more than "
            f"{MAX_FIT_MAPE:g}%): the runs do not fit the model (are the units right?); nothing written",
            field="SOURCE",
        )


# ---- the file (dse.facts.calibration_file, which dse.rules.space can import) --------------------------------------


def apply(cal: Calibration, base: Params = DEFAULT_PARAMS) -> Params:
    """``base`` with the calibration's values."""
    return base.with_values(**cal.params)


def loads(text: str, *, file: str = "<calibration>") -> Calibration:
    """A calibration file's text, its parameter names checked against :class:`Params`."""
    return _loads(text, file=file, names=PARAM_NAMES)


def load_calibration(path: str | Path, gpu: str | None = None) -> Calibration:
    """Read a calibration file (names checked); ``gpu`` given, refuse one made on another GPU."""
    return _load(path, gpu, names=PARAM_NAMES)


@functools.lru_cache(maxsize=8)
def calibrated_params(path: str | None) -> Params:
    """The parameters of a space's ``[backend] calibration`` (checked when the space was loaded), read once
    per process; the shipped ones without a file."""
    return DEFAULT_PARAMS if path is None else DEFAULT_PARAMS.with_values(**load_calibration(path).params)


@functools.lru_cache(maxsize=8)
def calibrated_miss(path: str | None) -> float:
    """The model's measured memory miss (GiB) that a space's ``[backend] calibration`` carries (a study's refit keeps
    it: dse.perfmodel.refit), 0 without a file or a figure."""
    return 0.0 if path is None else load_calibration(path).memory_miss_gib or 0.0
