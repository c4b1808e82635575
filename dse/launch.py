"""``LaunchPlan``: what a backend needs to run one trial — command, overrides, environment, pre-steps.

The overrides come from the knob catalogue for the payload's flavour (``nemo2``, ``mbridge``, ``mcore`` or
``sim``);
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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dse.errors import UserError
from dse.facts import allowlists, knobs
from dse.facts.hardware import HARDWARE
from dse.perfmodel.simulate import simulate
from dse.perfmodel.timing import DEFAULT_PARAMS, Params
from dse.recipes import contract
from dse.recipes.sim.logwriter import SimRun
from dse.rules.constraints import tp_comm_overlap_supported, userbuffer_config  # noqa: F401 (re-exported)
from dse.rules.trial import TrialConfig

PAYLOADS = contract.PAYLOADS
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")  # a dotted key=value (not the --factory call)

LAYERNORM_SM_MARGIN = 16  # PerfEnvPlugin.layernorm_sm_margin default
NCCL_PP_COMM_CHUNKSIZE = 2097152  # what NeMo's performance scripts pass when pp > 1
FLOPS_CALLBACK_SINCE = (25, 4)  # FLOPsMeasurementCallback ships in NeMo containers 25.04 and later

# Environment the payload reads (recipes/ may not import dse, so these names are its whole interface).
ENV_TASK, ENV_RECIPE = contract.ENV_NEMO_TASK, contract.ENV_NEMO_RECIPE
ENV_FLOPS_CALLBACK, ENV_VBOOST = contract.ENV_FLOPS_CALLBACK, contract.ENV_VBOOST
SIM_ENV = contract.SIM_ENV

VBOOST_COMMAND = "sudo nvidia-smi boost-slider --vboost 1"


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
    payload: str  # "nemo2" | "mbridge" | "mcore" | "sim"
    argv: tuple[str, ...]  # the training command inside the container, one process per GPU
    overrides: tuple[str, ...]  # key=value, already part of argv; kept for display and tests
    env: Mapping[str, str] = field(default_factory=dict)
    pre_steps: tuple[PreStep, ...] = ()
    sim_run: SimRun | None = None  # the simulated figures (sim payload, or a simulated backend)

    @property
    def nodes(self) -> int:
        return self.trial.layout.num_nodes

    @property
    def gpus_per_node(self) -> int:
        return self.trial.system.gpus_per_node


def container_version(version: str) -> tuple[int, int]:
    """``"25.04"`` (also ``"25.04.01"``, ``"25.04.rc3"``) as ``(25, 4)``; a :class:`UserError` otherwise."""
    m = re.fullmatch(r"(\d{2})\.(\d{2})(?:\.[A-Za-z0-9]+)*", version)  # fullmatch: "$" would let "25.09\n" by
    if not m:
        raise UserError(f"{version!r} is not a container version; write YY.MM, e.g. 25.04", field="system.container")
    return int(m.group(1)), int(m.group(2))


def flops_callback_available(version: str) -> bool:
    """NeMo's FLOPsMeasurementCallback exists in containers 25.04 and later (24.12 lacks it)."""
    return container_version(version) >= FLOPS_CALLBACK_SINCE


def perf_env(trial: TrialConfig) -> dict[str, str]:
    """What PerfEnvPlugin sets for ``trial`` (``nemo/lightning/run/plugins.py``), plus NCCL stream priority.

    - ``CUDA_DEVICE_MAX_CONNECTIONS``: only when tp > 1 or cp > 1 (program-order kernel launch for TP/CP
      overlap): 32 on SM100+ (Blackwell), 1 on Hopper and older; left unset otherwise, as the plugin does.
    - ``NVTE_FWD/BWD_LAYERNORM_SM_MARGIN``: the plugin's default margin, 16.
    - ``NCCL_P2P_NET_CHUNKSIZE=2097152`` exactly when pp > 1.
    - ``TORCH_NCCL_HIGH_PRIORITY=1``: high-priority NCCL streams, as NVIDIA's performance recipes run.
    - ``NVTE_USE_FAST_MATH=1`` under precision=nvfp4: Transformer Engine's fast-math path for NVFP4, which every
      NVFP4 preset of Megatron-Bridge's performance recipes sets (``megatron/bridge/perf_recipes/llama/*``).
    - ``NCCL_NVLS_ENABLE=1``, ``NCCL_CTA_POLICY=1`` with ``nccl_ub`` (Megatron-Bridge's
      ``scripts/performance/setup_experiment.py``).
    """
    env: dict[str, str] = {}
    if trial.layout.tp > 1 or trial.layout.cp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(HARDWARE[trial.system.gpu].cuda_device_max_connections)
    env["NVTE_FWD_LAYERNORM_SM_MARGIN"] = str(LAYERNORM_SM_MARGIN)
    env["NVTE_BWD_LAYERNORM_SM_MARGIN"] = str(LAYERNORM_SM_MARGIN)
    if trial.layout.pp > 1:
        env["NCCL_P2P_NET_CHUNKSIZE"] = str(NCCL_PP_COMM_CHUNKSIZE)
    env["TORCH_NCCL_HIGH_PRIORITY"] = "1"
    if trial.layout.precision == "nvfp4":
        env["NVTE_USE_FAST_MATH"] = "1"
    if trial.layout.nccl_ub:  # NVLink SHARP and NCCL's CTA policy, as Bridge's setup_experiment.py sets with nccl_ub
        env["NCCL_NVLS_ENABLE"] = "1"
        env["NCCL_CTA_POLICY"] = "1"
    return env


def vboost_step(nodes: int) -> PreStep:
    """PerfEnvPlugin's vboost: one task per node, before training, output beside the job's log."""
    return PreStep(
        "vboost",
        ("srun", f"--ntasks={nodes}", "--output=vboost.out", "--error=vboost.err", "bash", "-c", VBOOST_COMMAND),
        per_node=("bash", "-c", VBOOST_COMMAND),
    )


def knob_values(trial: TrialConfig) -> dict[str, Any]:
    """Every catalogue knob of ``trial``, validated by its type; ``sp`` as the effective setting."""
    out: dict[str, Any] = {}
    for name, knob in knobs.CATALOGUE.items():
        value = trial.sequence_parallel if name == "sp" else trial.values[name]
        out[name] = knob.coerce(value, field=name)
    return out


def _sim_env(run: SimRun) -> dict[str, str]:
    return {
        var: str(int(v) if isinstance(v, bool) else v) for attr, var in SIM_ENV.items() for v in [getattr(run, attr)]
    }


def build_plan(
    trial: TrialConfig,
    *,
    payload: str = "nemo2",
    container: str | None = None,
    seed: int = 0,
    flops_convention: str = "causal",
    simulated: bool = False,
    sim_run: SimRun | None = None,
    params: Params = DEFAULT_PARAMS,
) -> LaunchPlan:
    """The launch plan of ``trial`` for a payload flavour.

    ``container`` is the container version (default: the system's); it gates the FLOPs callback.
    ``sim_run`` carries the simulated figures for the ``sim`` payload (its environment) or a simulated
    backend (``simulated``); when None they come from :func:`dse.perfmodel.simulate.simulate` with ``seed``
    and ``flops_convention``. Raises :class:`UserError` for a value its knob type does not allow (an
    environment value with shell syntax, say) — nothing is launched.
    """
    if payload not in PAYLOADS:
        raise UserError(f"unknown payload {payload!r}; one of {', '.join(PAYLOADS)}", field="backend.payload")
    values = knob_values(trial)
    args = knobs.payload_args(
        payload, trial.recipe, values, gpu=trial.system.gpu, gpus_per_node=int(trial.system.gpus_per_node)
    )
    argv = ("python", "-m", f"recipes.{payload}", *args)
    ov = tuple(a for a in args if _OVERRIDE.match(a))

    env = perf_env(trial)
    version = container or trial.system.container
    env[ENV_TASK] = "pretrain"
    env[ENV_RECIPE] = trial.recipe.scaled_from or trial.recipe.name
    env[ENV_FLOPS_CALLBACK] = "1" if flops_callback_available(version) else "0"
    if trial.layout.tp_comm_overlap:  # checked for the payload that runs it: each ships its own userbuffer configs
        why = tp_comm_overlap_supported(trial if trial.payload == payload else replace(trial, payload=payload))
        if why is not None:
            raise UserError(why.reason, field="tp_comm_overlap")
    for name, value in trial.env.items():  # the space's env.NAME knobs win over the defaults above
        key = knobs.ENV_PREFIX + name
        if reserved := allowlists.env_reserved(name):  # belt and braces: a space file never gets one this far
            raise UserError(reserved, field=key)
        env[name] = knobs.get(key, field=key).coerce(value, field=key)
    if (payload == "sim" or simulated) and sim_run is None:
        sim_run = simulate(trial, seed, flops_convention=flops_convention, params=params)
    if payload == "sim":
        assert sim_run is not None  # simulated just above when not given
        env.update(_sim_env(sim_run))

    pre_steps = (vboost_step(trial.layout.num_nodes),) if env.get(ENV_VBOOST) == "1" else ()
    return LaunchPlan(
        trial=trial, payload=payload, argv=argv, overrides=ov, env=env, pre_steps=pre_steps, sim_run=sim_run
    )
