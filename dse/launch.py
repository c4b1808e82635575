"""``LaunchPlan``: what a backend needs to run one trial — command, overrides, environment, pre-steps.

The overrides come from the knob catalogue for the payload's flavour (``nemo2``, ``mbridge`` or ``sim``);
the environment is what NeMo's PerfEnvPlugin would set (``nemo/lightning/run/plugins.py``), plus the
space's ``env.NAME`` knobs, plus what the payload reads (``DSE_*``). Every value is validated by its knob
type here; backends shell-quote whatever they write into a script.

Allocator settings (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, ``max_split_size_mb:N``) are
environment of the *job*: PyTorch reads them once, when the CUDA caching allocator initialises, so setting
them from Python inside the trainer after CUDA is up has no effect. Give them as ``env.PYTORCH_CUDA_ALLOC_CONF``
in the space; they land in the job's environment before the process starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from dse import knobs
from dse.errors import UserError
from dse.trial import TrialConfig

if TYPE_CHECKING:  # recipes.sim.logwriter is plain Python; imported for the type only
    from recipes.sim.logwriter import SimRun

PAYLOADS = ("nemo2", "mbridge", "sim")

# GPU generations that are SM100 or newer (Blackwell): PerfEnvPlugin(gpu_sm100_or_newer=...) as NeMo's
# and Megatron-Bridge's performance scripts set it (gpu in b200, gb200, gb300).
SM100_OR_NEWER = frozenset({"b200", "gb200", "gb300"})
LAYERNORM_SM_MARGIN = 16  # PerfEnvPlugin.layernorm_sm_margin default
NCCL_PP_COMM_CHUNKSIZE = 2097152  # what NeMo's performance scripts pass when pp > 1
FLOPS_CALLBACK_SINCE = (25, 4)  # FLOPsMeasurementCallback ships in NeMo containers 25.04 and later

# Environment the payload reads (recipes/ may not import dse, so these names are its whole interface).
ENV_TASK = "DSE_NEMO_TASK"  # pretrain | finetune (the seed's "Plan B")
ENV_RECIPE = "DSE_NEMO_RECIPE"  # the NeMo 2 recipe module, e.g. llama3_70b
ENV_FLOPS_CALLBACK = "DSE_FLOPS_CALLBACK"  # "1": add FLOPsMeasurementCallback; "0": the container lacks it
ENV_TP_OVERLAP_CFG = "DSE_TP_COMM_OVERLAP_CFG"  # userbuffer config name when tp_comm_overlap is on
ENV_VBOOST = "ENABLE_VBOOST"
# The simulated trainer's figures (python -m recipes.sim reads them; see recipes/sim/__main__.py).
SIM_ENV = {
    "step_time_s": "DSE_SIM_STEP_TIME_S", "tflops_per_gpu": "DSE_SIM_TFLOPS_PER_GPU",
    "peak_memory_gib": "DSE_SIM_PEAK_MEMORY_GIB", "gpu_memory_gib": "DSE_SIM_GPU_MEMORY_GIB",
    "oom": "DSE_SIM_OOM", "oom_after": "DSE_SIM_OOM_AFTER", "seed": "DSE_SIM_SEED",
    "max_steps": "DSE_SIM_MAX_STEPS", "gbs": "DSE_SIM_GBS",
}

VBOOST_COMMAND = "sudo nvidia-smi boost-slider --vboost 1"

# NeMo's userbuffer (TP comm-overlap) configs, by the attribute names of
# nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py (the same names exist in
# megatron.bridge.training.comm_overlap): userbuffers_{precision}_{gpu}_h{hidden}_tp{tp}[_cp{cp}]_mbs{mbs}_seqlen{s}.
USERBUFFER_CONFIGS = (
    "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192",
    "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192",
    "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192",
    "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192",
    "userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192",
    "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192",
    "userbuffers_bf16_b200_h16384_tp4_cp2_mbs1_seqlen8192",
    "userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192",
    "userbuffers_bf16_h100_h6144_tp2_mbs2_seqlen2048",
    "userbuffers_fp8_h100_h6144_tp2_mbs2_seqlen2048",
    "userbuffers_bf16_h100_h12288_tp4_mbs1_seqlen2048",
    "userbuffers_fp8_h100_h12288_tp4_mbs1_seqlen2048",
    "userbuffers_bf16_b200_h12288_tp4_mbs1_seqlen2048",
    "userbuffers_fp8_b200_h12288_tp4_mbs1_seqlen2048",
    "userbuffers_bf16_b200_h6144_tp2_mbs1_seqlen4096",
    "userbuffers_bf16_b200_h18432_tp8_mbs1_seqlen4096",
    "userbuffers_fp8_b200_h18432_tp8_mbs1_seqlen4096",
)
_UB_NAME = re.compile(r"^userbuffers_(?P<prec>[a-z0-9]+)_(?P<gpu>[a-z0-9]+)_h(?P<h>\d+)_tp(?P<tp>\d+)"
                      r"(?:_cp(?P<cp>\d+))?_mbs(?P<mbs>\d+)_seqlen(?P<seq>\d+)$")
# The configs are tuned per chip family; NeMo's and Bridge's performance scripts use the H100 ones on H200
# and the B200 ones on GB200 (Bridge's COMM_OVERLAP_CONFIG_MAP); GB300 is a B200-class chip as well.
_UB_GPU_FAMILY = {"h100": "h100", "h200": "h100", "b200": "b200", "gb200": "b200", "gb300": "b200"}


@dataclass(frozen=True)
class PreStep:
    """A command run once per node before training (vboost), as its own srun step.

    ``command`` is the whole Slurm step (``srun --ntasks=<nodes> ... bash -c '...'``); ``per_node`` is what
    runs on each node, for backends without srun (local).
    """

    name: str
    command: tuple[str, ...]
    per_node: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchPlan:
    trial: TrialConfig
    payload: str  # "nemo2" | "mbridge" | "sim"
    argv: tuple[str, ...]  # the training command inside the container, one process per GPU
    overrides: tuple[str, ...]  # key=value, already part of argv; kept for display and tests
    env: Mapping[str, str] = field(default_factory=dict)
    pre_steps: tuple[PreStep, ...] = ()

    @property
    def nodes(self) -> int:
        return self.trial.num_nodes

    @property
    def gpus_per_node(self) -> int:
        return self.trial.system.gpus_per_node


def nemo2_factory(trial: TrialConfig) -> str:
    """The ``--factory`` name of the NeMo 2 payload for ``trial`` (one place, for the nemo2 payload's naming)."""
    return f"{trial.recipe.nemo2_recipe}_recipe"


def container_version(version: str) -> tuple[int, int]:
    """``"25.04"`` (also ``"25.04.01"``, ``"25.04.rc3"``) as ``(25, 4)``; a :class:`UserError` otherwise."""
    m = re.match(r"^(\d{2})\.(\d{2})(?:\.[A-Za-z0-9]+)*$", version)
    if not m:
        raise UserError(f"{version!r} is not a container version; write YY.MM, e.g. 25.04", field="system.container")
    return int(m.group(1)), int(m.group(2))


def flops_callback_available(version: str) -> bool:
    """NeMo's FLOPsMeasurementCallback exists in containers 25.04 and later (24.12 lacks it)."""
    return container_version(version) >= FLOPS_CALLBACK_SINCE


def userbuffer_config(trial: TrialConfig) -> str | None:
    """The name of NeMo's userbuffer config for ``trial``'s (GPU, hidden size, tp, precision), or None.

    When several exist (e.g. with and without cp), the one matching the trial's cp, micro-batch size and
    sequence length is preferred, as NeMo's lookup tries the cp-specific name first.
    """
    family = _UB_GPU_FAMILY.get(trial.system.gpu)
    if family is None:
        return None
    cands = []
    for name in USERBUFFER_CONFIGS:
        m = _UB_NAME.match(name)
        assert m, name  # a typo in the table above, not user input
        if (m["prec"], m["gpu"], int(m["h"]), int(m["tp"])) == (trial.precision, family, trial.arch.hidden_size,
                                                                 trial.tp):
            exact = (int(m["cp"] or 1), int(m["mbs"]), int(m["seq"])) == (trial.cp, trial.mbs, trial.seq_length)
            cands.append((not exact, name))
    return min(cands)[1] if cands else None


def tp_comm_overlap_supported(trial: TrialConfig) -> str | None:
    """Constraint rule: the reason ``trial`` cannot use tp_comm_overlap, or None when it can (or does not ask).

    TP comm overlap needs a userbuffer config tuned for the GPU family, model width, tp and precision;
    NeMo ships a handful (``USERBUFFER_CONFIGS``) and we do not launch untuned ones.
    """
    if not trial.tp_comm_overlap or trial.tp == 1:  # tp == 1: the rule tp_comm_overlap_needs_tp says why
        return None
    if userbuffer_config(trial) is not None:
        return None
    family = _UB_GPU_FAMILY.get(trial.system.gpu, trial.system.gpu)
    return (f"tp_comm_overlap needs a userbuffer config for ({family}, hidden {trial.arch.hidden_size}, "
            f"tp {trial.tp}, {trial.precision}); NeMo has none, so turn tp_comm_overlap off for this point")


def perf_env(trial: TrialConfig) -> dict[str, str]:
    """What PerfEnvPlugin sets for ``trial`` (``nemo/lightning/run/plugins.py``), plus NCCL stream priority.

    - ``CUDA_DEVICE_MAX_CONNECTIONS``: only when tp > 1 or cp > 1 (program-order kernel launch for TP/CP
      overlap): 32 on SM100+ (Blackwell), 1 on Hopper and older; left unset otherwise, as the plugin does.
    - ``NVTE_FWD/BWD_LAYERNORM_SM_MARGIN``: the plugin's default margin, 16.
    - ``NCCL_P2P_NET_CHUNKSIZE=2097152`` exactly when pp > 1.
    - ``TORCH_NCCL_HIGH_PRIORITY=1``: high-priority NCCL streams, as NVIDIA's performance recipes run.
    """
    env: dict[str, str] = {}
    if trial.tp > 1 or trial.cp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32" if trial.system.gpu in SM100_OR_NEWER else "1"
    env["NVTE_FWD_LAYERNORM_SM_MARGIN"] = str(LAYERNORM_SM_MARGIN)
    env["NVTE_BWD_LAYERNORM_SM_MARGIN"] = str(LAYERNORM_SM_MARGIN)
    if trial.pp > 1:
        env["NCCL_P2P_NET_CHUNKSIZE"] = str(NCCL_PP_COMM_CHUNKSIZE)
    env["TORCH_NCCL_HIGH_PRIORITY"] = "1"
    return env


def vboost_step(nodes: int) -> PreStep:
    """PerfEnvPlugin's vboost: one task per node, before training, output beside the job's log."""
    return PreStep("vboost", ("srun", f"--ntasks={nodes}", "--output=vboost.out", "--error=vboost.err",
                              "bash", "-c", VBOOST_COMMAND), per_node=("bash", "-c", VBOOST_COMMAND))


def knob_values(trial: TrialConfig) -> dict[str, Any]:
    """Every catalogue knob of ``trial``, validated by its type; ``sp`` as the effective setting."""
    out: dict[str, Any] = {}
    for name, knob in knobs.CATALOGUE.items():
        value = trial.sequence_parallel if name == "sp" else trial.values[name]
        out[name] = knob.coerce(value, field=name)
    return out


def _sim_env(run: "SimRun") -> dict[str, str]:
    return {var: str(int(v) if isinstance(v, bool) else v) for attr, var in SIM_ENV.items()
            for v in [getattr(run, attr)]}


def build_plan(trial: TrialConfig, *, payload: str = "nemo2", container: str | None = None, seed: int = 0,
               sim_run: "SimRun | None" = None) -> LaunchPlan:
    """The launch plan of ``trial`` for a payload flavour.

    ``container`` is the container version (default: the system's); it gates the FLOPs callback.
    ``sim_run`` (payload ``sim`` only) carries the simulated figures; when None they come from the
    performance model via ``dse.backends.sim.simulate(trial, seed)``. Raises :class:`UserError` for a value
    its knob type does not allow (an environment value with shell syntax, say) — nothing is launched.
    """
    if payload not in PAYLOADS:
        raise UserError(f"unknown payload {payload!r}; one of {', '.join(PAYLOADS)}", field="backend.payload")
    values = knob_values(trial)
    ov = tuple(knobs.overrides(values, payload))
    if payload != "mbridge":  # Lightning's trainer needs the GPUs per node; Bridge takes the world size
        ov += (f"trainer.devices={int(trial.system.gpus_per_node)}",)
    if payload == "mbridge":
        if not trial.recipe.mbridge_recipe:
            raise UserError(f"recipe {trial.recipe.name} has no Megatron-Bridge recipe; use payload nemo2",
                            field="backend.payload")
        argv = ("python", "-m", "recipes.mbridge", "--recipe", trial.recipe.mbridge_recipe, *ov)
    else:
        argv = ("python", "-m", f"recipes.{payload}", "--factory", nemo2_factory(trial), "-y", *ov)

    env = perf_env(trial)
    version = container or trial.system.container
    env[ENV_TASK] = "pretrain"
    env[ENV_RECIPE] = trial.recipe.nemo2_recipe
    env[ENV_FLOPS_CALLBACK] = "1" if flops_callback_available(version) else "0"
    if trial.tp_comm_overlap:
        reason = tp_comm_overlap_supported(trial)
        if reason:
            raise UserError(reason, field="tp_comm_overlap")
        env[ENV_TP_OVERLAP_CFG] = userbuffer_config(trial) or ""
    for name, value in trial.env.items():  # the space's env.NAME knobs win over the defaults above
        key = knobs.ENV_PREFIX + name
        env[name] = knobs.get(key, field=key).coerce(value, field=key)
    if payload == "sim":
        if sim_run is None:
            from dse.backends.sim import simulate  # the lead's performance-model bridge; lazy (import cycle)

            sim_run = simulate(trial, seed)
        env.update(_sim_env(sim_run))

    pre_steps = (vboost_step(trial.num_nodes),) if env.get(ENV_VBOOST) == "1" else ()
    return LaunchPlan(trial=trial, payload=payload, argv=argv, overrides=ov, env=env, pre_steps=pre_steps)
