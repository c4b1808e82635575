"""Space and system files: pydantic models, and loading with errors that name the file and the field.

A *space* says which recipe runs on which system, which knobs stay fixed and which vary (each over a list
of values), what to optimise and how to search. A *system* describes a cluster: GPU generation, GPUs per
node, NVLink domain, scale-out bandwidth, and the Slurm fields used to launch there.
"""

from __future__ import annotations

import importlib.resources
import itertools
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dse.errors import UserError, did_you_mean
from dse.facts import allowlists, knobs
from dse.facts.hardware import GPU_NAMES
from dse.inputs import load_toml
from dse.recipes import contract
from dse.recipes.models import RECIPES, Recipe


def shipped(kind: str) -> Path:
    """The folder of the shipped ``spaces`` or ``systems``: package data of ``dse.conf`` (the repository's
    ``conf/``), found through the import system, so an installed wheel finds them as an editable checkout does.
    pip always unpacks a wheel into files, so the resource is a real folder."""
    return Path(str(importlib.resources.files("dse.conf") / kind))


SYSTEMS_DIR = shipped("systems")
SPACES_DIR = shipped("spaces")
METRICS = ("tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s")
PAYLOADS = contract.PAYLOADS


# Knobs one space may vary, and fixed settings it may give. The catalogue has a few dozen knobs; the rest are
# environment variables, and each stored trial carries every one (1,000 env knobs cost 8 MB per trial, 100,000
# one-value knobs kept a one-point study busy for minutes), so a space is bounded far above any real one.
MAX_KNOBS = 64
MAX_SETTINGS = 128

# GPUs of one node: far above any machine built (8 today, 72 in one NVL72 rack's domain).
GPUS_PER_NODE_MAX = 1024

# Values one knob may list. The store keeps each trial's params with Optuna's distributions, which carry the
# whole list, so a knob of 10^6 values costs megabytes per trial; no real knob has more than a few dozen.
MAX_VALUES_PER_KNOB = 1024
# Values all of a space's knobs list together (what each stored trial's distributions carry): eight knobs of
# the largest lists.
MAX_VALUES_PER_SPACE = 8192
# Trials one study may run ([search] trials): ten million, far beyond any study on real GPUs.
MAX_TRIALS = 10_000_000

# Raw points that any walk over a whole space examines one by one (`dse space`'s exact count, the grid, `dse
# dry-run`, the grid's progress bar, the twin's screen). Checking a point's rules costs 18-34 us (measured by
# bench/space_size.py), so a walk of this many takes a few seconds; a space of more points (a dozen knobs of a
# dozen values is 10^12) is counted by seeded sampling, and what would walk it refuses with the count. A grid of
# 10^5 points is also 10^5 launched jobs: far beyond any study on real GPUs.
WALK_LIMIT = 100_000
# The memory screen's default margin (dse.forecast), from bench/screen_evidence.py: the model over-predicts the
# measured peak of real H200 runs by at most 2.7% of the GPU's memory, no layout known to run is predicted above
# 99.1% of it, the one real OOM (a measured H200 study) at 110.3%: 5% keeps every known fit and catches both OOMs.
DEFAULT_SCREEN_MARGIN = 0.05


class _Strict(BaseModel):
    """Unknown fields refused; strict types: a boolean is not a number, a string not an integer, "yes" not a
    boolean (pydantic's strict mode; an integer is still a float)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# A name (of a space, a system) is a name: it becomes a directory under runs/ and words in generated
# scripts' comments, so it may not carry a path separator, a newline or shell syntax. Full match.
NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
NAME_RULE = "letters, digits and _.- (not only dots)"


def one_of(v: str, allowed, what: str) -> str:
    """``v`` when it is one of ``allowed``; else a ValueError naming the closest and every allowed name (the
    field validators' one rule for a name that must come from a table: GPUs, payloads, backends, recipes)."""
    if v not in allowed:
        raise ValueError(f"unknown {what} {v!r}{did_you_mean(str(v), allowed)}; known: {', '.join(allowed)}")
    return v


def check_name(v: str) -> str:
    if not isinstance(v, str) or not NAME_RE.fullmatch(v) or set(v) == {"."}:
        raise ValueError(f"{v!r} is not a name; use {NAME_RULE}")
    return v


# What a system file may put into an sbatch script (checked when the file is read, so `dse validate` and
# `dse run` refuse the same values before anything is written; the script writers quote them as well).
SLURM_NAME = r"[A-Za-z0-9_.,\-]*"
SLURM_TIME = r"(\d+-)?\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE"
# an image reference (never a leading '#': that would comment the srun line out), or the absolute path of a squashfs
# file made by `enroot import` (pyxis reads a value starting with '/' as a file: no registry pull at job start)
SLURM_IMAGE = r"[A-Za-z0-9][A-Za-z0-9_.:/#@+\-]*|/[A-Za-z0-9_.+@=\-]+(/[A-Za-z0-9_.+@=\-]+)*"
SLURM_MOUNT = r"[A-Za-z0-9_.:/+@=,\-]+"
SLURM_PATH = r"/?[A-Za-z0-9_.,:+@=\-]+(/[A-Za-z0-9_.,:+@=\-]+)*/?"  # no '%': Slurm expands %j, %u, ...
_SLURM_RULES = {
    "partition": (SLURM_NAME, "letters, digits and _.,-"),
    "account": (SLURM_NAME, "letters, digits and _.,-"),
    "time_limit": (SLURM_TIME, "a Slurm time: MM, HH:MM:SS or D-HH:MM:SS"),
    "container_image": (
        SLURM_IMAGE + "|",
        "an image reference such as nvcr.io#nvidia/nemo:25.09 (not starting with #), or a squashfs file's absolute "
        "path such as /lustre/images/nemo.sqsh",
    ),
    "container_mounts": (SLURM_MOUNT, "src:dst[:flags] paths"),
    "job_dir": (SLURM_PATH + "|", "a path of letters, digits and _.,:+@=- (no % patterns)"),
    "max_pending": (SLURM_TIME + "|", "a Slurm time: MM, HH:MM:SS or D-HH:MM:SS (empty: wait)"),
}


class SlurmSettings(_Strict):
    """How jobs are submitted on this cluster; empty strings mean 'leave it to Slurm's defaults'."""

    partition: str = ""
    account: str = ""
    time_limit: str = "00:30:00"
    container_image: str = ""
    container_mounts: list[str] = Field(default_factory=list, max_length=64)
    use_container: bool = True
    gpus_per_node_flag: bool = True  # emit --gpus-per-node (off for clusters without GRES)
    exclusive: bool = True
    # srun options of the training step, parsed as srun parses them and limited to options that select resources
    # (dse.facts.allowlists.SRUN_ALLOWED); kept in their full spelling (`--cpu-b cores` -> `--cpu-bind=cores`)
    srun_args: list[str] = Field(default_factory=list)
    # `#SBATCH --name=value` lines: options that select or account resources (dse.facts.allowlists.SBATCH_ALLOWED)
    sbatch_options: dict[str, Any] = Field(default_factory=dict)
    job_dir: str = ""  # where sbatch scripts and logs go on the cluster; default: the trial's run dir
    max_pending: str = ""  # a Slurm time; a job pending longer is cancelled and failed with Slurm's reason ("": wait)

    @field_validator(
        "partition",
        "account",
        "time_limit",
        "container_image",
        "container_mounts",
        "job_dir",
        "max_pending",
    )
    @classmethod
    def _safe_fields(cls, v: Any, info) -> Any:
        pattern, what = _SLURM_RULES[info.field_name]
        for item in v if isinstance(v, list) else [v]:
            if not re.fullmatch(pattern, item):
                raise ValueError(f"{item!r} is not allowed; use {what}")
        return v

    @field_validator("time_limit", "max_pending")
    @classmethod
    def _slurm_time(cls, v: str) -> str:
        if v:
            try:
                allowlists.slurm_time(v)  # its fields in range: 00:61:99 is not a time
            except allowlists.OptionError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("job_dir")
    @classmethod
    def _no_climbing(cls, v: str) -> str:
        if any(part in (".", "..") for part in v.split("/")):
            raise ValueError(f"{v!r} is not allowed; a job directory has no . or .. components")
        return v

    @model_validator(mode="after")
    def _time_min_within_limit(self) -> SlurmSettings:
        t_min, limit = self.sbatch_options.get("time-min"), allowlists.slurm_time(self.time_limit)
        if t_min is not None and limit is not None and allowlists.slurm_time(t_min) > limit:  # type: ignore[operator]
            raise ValueError(f"sbatch_options time-min {t_min} exceeds time_limit {self.time_limit}")
        return self

    @field_validator("srun_args")
    @classmethod
    def _allowed_srun_args(cls, v: list[str]) -> list[str]:
        try:
            return allowlists.parse_srun_args(v)
        except allowlists.OptionError as e:
            raise ValueError(str(e)) from None

    @field_validator("sbatch_options")
    @classmethod
    def _allowed_sbatch_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            return allowlists.sbatch_options(v)
        except allowlists.OptionError as e:
            raise ValueError(str(e)) from None


class System(_Strict):
    """A cluster: one GPU generation, uniform nodes."""

    name: str
    gpu: str = Field(description="a GPU generation of dse.facts.hardware.HARDWARE")
    gpus_per_node: int = Field(8, ge=1, le=GPUS_PER_NODE_MAX)
    nvlink_domain: int = Field(
        8, ge=1, le=knobs.NODES_MAX, description="GPUs that share one NVLink domain (72 on GB200 NVL72)"
    )
    scaleout_gbps: float = Field(
        400.0, ge=1, le=1e6, allow_inf_nan=False, description="scale-out network bandwidth per GPU, Gb/s (at least 1)"
    )
    container: str = Field(
        "25.09",
        description="NeMo / Megatron-Bridge container version, YY.MM; the performance model applies its family's "
        "software efficiency (dse.facts.containers)",
    )
    # the scale-out fabric above the NVLink domain (the NIC bandwidth per GPU is scaleout_gbps); the performance
    # model's data-parallel collectives that span several pods pay the oversubscription (dse.perfmodel.model)
    pod_gpus: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="GPUs of one non-blocking pod (none: non-blocking at any size)",
    )
    pod_oversubscription: float = Field(
        1.0,
        ge=1.0,
        le=1000.0,
        allow_inf_nan=False,
        description="oversubscription of the fabric above the pods (1: none)",
    )
    rank_order: Literal["tp-cp-dp-pp", "tp-cp-pp-dp"] = Field(
        "tp-cp-dp-pp",
        description="the order of the parallel groups over the ranks (Megatron-Core's default puts pipeline stages "
        "outermost; tp-cp-pp-dp puts data parallelism outermost, across pods, as Meta's Llama 3 runs did)",
    )
    startup_s: float = Field(
        300.0,
        ge=0,
        le=86400,
        allow_inf_nan=False,
        description="a job's start-up before its first step (container, "
        "NCCL init, checkpoint-free model build): the simulated runs' GPU-hours count it",
    )
    price_per_gpu_hour: float | None = Field(
        None,
        gt=0,
        le=1e6,
        allow_inf_nan=False,
        description="what one GPU-hour costs (any currency); `dse compare` prices GPU-hours with it",
    )
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        return one_of(v, GPU_NAMES, "GPU generation")

    _name = field_validator("name")(classmethod(lambda cls, v: check_name(v)))


class Objective(_Strict):
    metric: Literal["tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s"] = "tflops_per_gpu"
    direction: Literal["maximize", "minimize"] | None = None
    failure_reward: float | None = Field(
        None, ge=-1e12, le=1e12, allow_inf_nan=False
    )  # finite: a reward the agents can rank

    @property
    def sense(self) -> str:
        return self.direction or ("minimize" if self.metric == "step_time_s" else "maximize")

    @property
    def failed_reward(self) -> float:
        """Reward of a failed or rejected trial: 0 when maximising; an hour per step when minimising."""
        if self.failure_reward is not None:
            return self.failure_reward
        return 0.0 if self.sense == "maximize" else -3600.0


class Search(_Strict):
    agent: str = "optuna"
    sampler: str = "tpe"
    warm_start: Literal["none", "model"] = "none"  # optuna: "model" enqueues the model's top points first
    trials: int | None = Field(None, ge=1, le=MAX_TRIALS)
    seed: int = Field(0, ge=0, le=2**32 - 1)  # numpy's and Optuna's seeds are unsigned 32-bit
    parallel: int = Field(1, ge=1, le=1024, description="trials in flight at once (dse run --parallel)")
    # the memory screen (dse.forecast.Screen): "memory" keeps from launch a point predicted to exceed the GPU's
    # memory by more than screen_margin (a share of it); "probe" probes each point on one GPU first (dse.probe:
    # local or slurm backend, mcore payload) and keeps it from launch on the probe's measured peak plus the
    # model's NCCL buffers and CUDA context; "none" launches every valid point
    screen: Literal["memory", "probe", "none"] = "memory"
    # the study's baseline (dse.study.request.baseline_of): "run" measures the recipe's layout first when the space holds it
    # (a trial of the budget, run alone before the agent proposes); "predict" never launches it and shows the
    # model's figures for it as the reference instead (a parallel study loses no wall time to it)
    baseline: Literal["run", "predict"] = "run"
    screen_margin: float = Field(
        DEFAULT_SCREEN_MARGIN, ge=0, le=10, allow_inf_nan=False, description="share of the GPU's memory"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="the agent's own options, validated by it")
    # whether the study refits its model on its measured runs (dse.perfmodel.refit; dse run --no-learn sets false): off, the
    # screen, the agents and the predicted columns use the model the study starts from for the whole study
    learn: bool = True


class EarlyStopSettings(_Strict):
    """``[backend.early_stop]``: stop a trial once its steady-state step time has converged (dse.logs.steady).

    Defaults from the recorded real logs, dense H200 runs and one-GPU MoE runs (``bench/early_stop.py``;
    docs/early-stop.md). Off unless ``enabled = true``: turning it on changes every study's steps and GPU-hours,
    so a space asks for it.
    ``poll_s``: how often the local and Slurm backends look at the growing log. ``prune_margin`` (off unless
    set; needs ``enabled``): stop a trial as ``pruned`` once even its optimistic figure (a 95 % bound,
    dse.logs.steady.median_lower_bound) is worse than the study's best by more than this share of the best.
    """

    enabled: bool = False
    min_steps: int = Field(5, ge=1, le=100_000, description="steady steps (after the warm-up) before a stop")
    window: int = Field(5, ge=1, le=10_000, description="steps over which the median must hold still")
    tolerance: float = Field(
        0.005, gt=0, lt=1, allow_inf_nan=False, description="relative move of the median allowed over the window"
    )
    poll_s: float = Field(5.0, gt=0, le=3600, allow_inf_nan=False, description="seconds between looks at the log")
    prune_margin: float | None = Field(
        None,
        gt=0,
        le=10,
        allow_inf_nan=False,
        description="relative margin below the study's best at which a trial is pruned",
    )


class BackendSettings(_Strict):
    kind: str = "sim"  # a name in the dse.backends registry (checked without importing the backend)
    payload: str = "nemo2"  # one of recipes.contract.PAYLOADS
    flops_convention: Literal["causal", "noncausal"] = "causal"
    timeout_s: float = Field(
        1800.0, gt=0, le=30 * 86400, allow_inf_nan=False, description="no-progress time after which a run is a timeout"
    )
    # a file from `dse calibrate`: the simulated figures (sim backend, sim payload) use its parameters; a
    # relative path is relative to the space file
    calibration: str | None = None
    # replay backend only: the finished study to replay (its directory or its leaderboard.csv); a relative path is
    # relative to the space file (dse.backends.replay reads and checks it)
    replay: str | None = None
    # simulated backend only: "exact" writes the shipped model's figures; "twin" a seeded machine that differs
    # from the model (dse.perfmodel.twin, drawn around the shipped parameters; a calibration is not used),
    # so that a search is judged against a truth that is not its model
    truth: Literal["exact", "twin"] = "exact"
    twin_seed: int = Field(0, ge=0, le=2**32 - 1)
    allow_env: list[str] = Field(
        default_factory=list,
        max_length=MAX_SETTINGS,
        description="environment names outside the tuning families (dse.facts.allowlists) the space may set: an explicit "
        "opt-in; never SLURM_*, SRUN_*, LD_*, PYTHON*",
    )
    early_stop: EarlyStopSettings = Field(default_factory=EarlyStopSettings)

    @field_validator("allow_env")
    @classmethod
    def _allowable_env(cls, v: list[str]) -> list[str]:
        for name in v:
            if why := allowlists.env_never(name):
                raise ValueError(f"{name} cannot be allowed: {why}")
            if why := allowlists.env_reserved(name):
                raise ValueError(f"{name} cannot be allowed: {why}")
        return v

    @field_validator("payload")
    @classmethod
    def _known_payload(cls, v: str) -> str:
        return one_of(v, PAYLOADS, "payload")

    @field_validator("kind")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        from dse import registry

        return one_of(v, registry.names(registry.BACKENDS), "backend")


class Space(_Strict):
    """A design space. ``settings`` are fixed knob values; ``knobs`` map varying knobs to their values."""

    name: str
    recipe: str
    system: System
    num_nodes: int = Field(ge=1, le=knobs.NODES_MAX)
    settings: dict[str, Any] = Field(default_factory=dict)
    knobs: dict[str, list[Any]] = Field(default_factory=dict)
    objective: Objective = Field(default_factory=Objective)
    search: Search = Field(default_factory=Search)
    backend: BackendSettings = Field(default_factory=BackendSettings)
    source: str = ""  # the file it was read from (for error messages)

    @model_validator(mode="before")
    @classmethod
    def _calibration_path(cls, data: Any) -> Any:
        """A relative ``[backend] calibration`` or ``replay`` path is relative to the space file (as
        docs/calibration.md and docs/backends.md say)."""
        if isinstance(data, dict) and isinstance(data.get("backend"), dict) and data.get("source"):
            src = Path(str(data["source"]))
            for key in ("calibration", "replay"):
                path = data["backend"].get(key)
                if isinstance(path, str) and not Path(path).is_absolute() and src.is_file():
                    data = {**data, "backend": {**data["backend"], key: str(src.parent / path)}}
        return data

    _name = field_validator("name")(classmethod(lambda cls, v: check_name(v)))

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, v: str) -> str:
        return one_of(v, list(RECIPES), "recipe")

    @model_validator(mode="after")
    def _check_knobs(self) -> Space:
        """The space's cross-field rules, in this order (the first broken one is the error the user sees)."""
        f = self.source or None
        self._check_caps(f)
        for name, value in list(self.settings.items()):
            knob = knobs.get(name, file=f, field=f"settings.{name}")
            coerced = knob.coerce(value, file=f, field=f"settings.{name}")
            if knob.kind == "modules":  # a set has one spelling everywhere (the trial, the leaderboard, the store)
                self.settings[name] = coerced
        for name, values in self.knobs.items():
            self._check_knob_values(name, values, f)
        self._check_backend(f)
        self._check_env_opt_in(f)
        self._check_segment(f)
        if "num_nodes" in self.settings:
            raise UserError(
                "set num_nodes at the top level of the space, not in [settings]", file=f, field="settings.num_nodes"
            )
        return self

    def _check_caps(self, f: str | None) -> None:
        """At most MAX_KNOBS knobs, MAX_SETTINGS settings and MAX_VALUES_PER_SPACE values over all knobs."""
        why = "each stored trial carries them all"
        if len(self.knobs) > MAX_KNOBS:
            raise UserError(
                f"{len(self.knobs):,} knobs; a space varies at most {MAX_KNOBS} ({why})", file=f, field="knobs"
            )
        if len(self.settings) > MAX_SETTINGS:
            raise UserError(
                f"{len(self.settings):,} settings; a space fixes at most {MAX_SETTINGS} ({why})",
                file=f,
                field="settings",
            )
        total = sum(len(v) for v in self.knobs.values())
        if total > MAX_VALUES_PER_SPACE:
            raise UserError(
                f"{total:,} values over all knobs; a space lists at most {MAX_VALUES_PER_SPACE:,} ({why})",
                file=f,
                field="knobs",
            )

    def _check_knob_values(self, name: str, values: list[Any], f: str | None) -> None:
        """One ``[knobs]`` entry: a known knob, 1 to MAX_VALUES_PER_KNOB valid distinct values, not also a setting."""
        knob = knobs.get(name, file=f, field=f"knobs.{name}")
        if not values:
            raise UserError("empty list; give at least one value", file=f, field=f"knobs.{name}")
        if len(values) > MAX_VALUES_PER_KNOB:
            raise UserError(
                f"{len(values)} values; a knob takes at most {MAX_VALUES_PER_KNOB} (each stored "
                "trial carries its knobs' value lists)",
                file=f,
                field=f"knobs.{name}",
            )
        seen = [knob.coerce(v, file=f, field=f"knobs.{name}") for v in values]
        if len(set(map(repr, seen))) != len(seen):
            raise UserError(f"duplicate values in {values!r}", file=f, field=f"knobs.{name}")
        if knob.kind == "modules":  # "mlp,core_attn" is the point "core_attn,mlp"
            values[:] = seen
        if name in self.settings:
            raise UserError(
                "is both fixed in [settings] and varied in [knobs]; keep one", file=f, field=f"knobs.{name}"
            )

    def _check_backend(self, f: str | None) -> None:
        """Pruning needs the early stop; a calibration file must load for this GPU (refused here, not at the
        first trial)."""
        if self.backend.early_stop.prune_margin is not None and not self.backend.early_stop.enabled:
            raise UserError(
                "pruning follows the log as the early stop does: set enabled = true with it, or remove prune_margin",
                file=f,
                field="backend.early_stop.prune_margin",
            )
        if self.backend.calibration is not None:
            from dse.facts.calibration_file import load_calibration

            # refused here (missing, malformed, made on another GPU), not at the first trial
            try:
                load_calibration(self.backend.calibration, gpu=self.system.gpu)
            except UserError as e:
                raise UserError(str(e), file=f, field="backend.calibration") from None

    def _check_segment(self, f: str | None) -> None:
        """The system's ``sbatch_options.segment`` divides every node count of the space: Slurm allocates whole
        segments, so a job of 18 nodes in segments of 7 (or of a million) is never scheduled."""
        seg = self.system.slurm.sbatch_options.get("segment")
        if not seg:
            return
        counts = sorted({self.num_nodes, *(int(v) for v in self.knobs.get("num_nodes", []))})
        bad = [n for n in counts if n % seg]
        if bad:
            raise UserError(
                f"segment {seg} does not divide the space's node count {bad[0]} (Slurm allocates whole segments); "
                f"use a divisor of {bad[0]}, or 0 for none",
                file=f,
                field="system.slurm.sbatch_options.segment",
            )

    def _check_env_opt_in(self, f: str | None) -> None:
        """Environment names are denied by default: a space sets only the tuning families of
        :mod:`dse.facts.allowlists`, and other names it lists in ``[backend] allow_env``."""
        for part, names in (("settings", self.settings), ("knobs", self.knobs)):
            for n in names:
                if knobs.is_env(n) and (
                    why := allowlists.env_refusal(n[len(knobs.ENV_PREFIX) :], self.backend.allow_env)
                ):
                    raise UserError(why, file=f, field=f"{part}.{n}")

    @property
    def recipe_obj(self) -> Recipe:
        return RECIPES[self.recipe]

    @property
    def knob_names(self) -> list[str]:
        return list(self.knobs)

    @property
    def size(self) -> int:
        """Raw points: a Python int, exact however large (10^19 and more)."""
        return math.prod(len(v) for v in self.knobs.values())

    def point_at(self, index: tuple[int, ...]) -> dict[str, Any]:
        """The raw point of one index per knob (in knob order)."""
        return {n: self.knobs[n][i] for n, i in zip(self.knobs, index)}

    def points(self):
        """Every raw point of the space (valid or not), as dicts of varying knobs, in grid order."""
        names = self.knob_names
        for combo in itertools.product(*(self.knobs[n] for n in names)):
            yield dict(zip(names, combo))


def _read_toml(path: Path) -> dict[str, Any]:
    """An input TOML file: a regular file of at most :data:`dse.inputs.MAX_INPUT_BYTES`, parsed with one-line
    errors (dse.inputs)."""
    return load_toml(path)


def _known_fields() -> set[str]:
    return {f for m in (Space, System, SlurmSettings, Objective, Search, BackendSettings) for f in m.model_fields}


def _first_error(e: ValidationError, file: str, prefix: str = "") -> UserError:
    """The most useful of pydantic's errors as one line: a misspelt field before the missing one it causes."""
    errors = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
    err = errors[0]
    field = prefix + ".".join(str(p) for p in err["loc"]) if err["loc"] else prefix.rstrip(".") or None
    ctx_err = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_err, UserError):
        return ctx_err
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field" + did_you_mean(str(err["loc"][-1]), _known_fields())
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif "input" in err and err["type"] not in ("value_error",):
        got = repr(err["input"])
        msg = f"{msg} (got {got if len(got) <= 80 else got[:77] + '...'})"
    return UserError(msg, file=file, field=field)


def load_system(ref: str | Path | dict[str, Any], *, file: str | None = None) -> System:
    """A system from a name in ``conf/systems``, a path, or an inline table."""
    if isinstance(ref, dict):
        try:
            return System.model_validate({"name": "inline", **ref})
        except ValidationError as e:
            raise _first_error(e, file or "<inline>", "system.") from None
    # A path is a path (spelled with '/' or ending in .toml); anything else is a name in conf/systems/, and
    # a name cannot climb out of it ("../../x" is neither).
    ref = str(ref)
    if "/" in ref or ref.endswith(".toml"):
        path = Path(ref)
    else:
        known = sorted(p.stem for p in SYSTEMS_DIR.glob("*.toml"))
        path = SYSTEMS_DIR / f"{ref}.toml"
        if not NAME_RE.fullmatch(ref) or set(ref) == {"."} or not path.is_file():
            raise UserError(
                f"unknown system {ref!r}{did_you_mean(ref, known)}; known: {', '.join(known)} "
                "(or a path to a system file, with / or .toml)",
                file=file,
                field="system",
            )
    data = _read_toml(path)
    data.setdefault("name", path.stem)
    try:
        return System.model_validate(data)
    except ValidationError as e:
        raise _first_error(e, str(path)) from None


def space_path(ref: str | Path) -> Path:
    """The space file that ``ref`` names: a file that exists; else a shipped space, by name
    (``llama3_405b_space``, ``.toml`` optional) or by its place in the repository (``conf/spaces/NAME.toml``), so
    the quick start's command runs from any directory once dse is installed. Anything else is returned as given
    (reading it then says "no such file", and lists the shipped spaces)."""
    path = Path(ref)
    if path.exists() or not (len(path.parts) == 1 or path.parts[:-1] == ("conf", "spaces")):
        return path
    name = path.name.removesuffix(".toml")
    candidate = SPACES_DIR / f"{name}.toml"
    return candidate if NAME_RE.fullmatch(name) and set(name) != {"."} and candidate.is_file() else path


def load_space(path: str | Path) -> Space:
    """Read and validate a space file (a path, or a shipped space: :func:`space_path`); every problem is a
    one-line :class:`UserError`."""
    path = space_path(path)
    if not path.exists() and not path.is_symlink():  # a symlink loop is said so by the reader
        known = sorted(p.stem for p in SPACES_DIR.glob("*.toml"))
        raise UserError(
            f"no such file (nor a shipped space{did_you_mean(path.stem, known)}; shipped: {', '.join(known)})",
            file=str(path),
        )
    data = _read_toml(path)
    f = str(path)
    sysref = data.get("system")
    if sysref is None:
        raise UserError(
            "required field is missing (a name from conf/systems, a path, or a table)", file=f, field="system"
        )
    if not isinstance(sysref, (str, dict)):
        raise UserError(f"{sysref!r} is neither a system name nor a table", file=f, field="system")
    if isinstance(sysref, str) and sysref.endswith(".toml") and not Path(sysref).is_absolute():
        sysref = path.parent / sysref
    system = load_system(sysref, file=f)
    try:
        return Space.model_validate({**data, "system": system, "source": f})
    except UserError:
        raise
    except ValidationError as e:
        raise _first_error(e, f) from None
