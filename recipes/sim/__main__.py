"""The simulated trainer: ``python -m recipes.sim --factory llama3_8b_recipe -y path=value ...``.

It accepts the NeMo 2 payload's command line, applies the overrides to a plain dict shaped like a NeMo 2
recipe config (an override path the config does not have is an error, exit 2, as in nemo-run's CLI), and
prints the log of the performance model's figures with :func:`recipes.sim.logwriter.write_log`, exiting
with the code it returns. So every launch path (local, sbatch) can be tested end to end without GPUs.

The figures arrive in the environment (``DSE_SIM_*``, set by ``dse.launch.build_plan``), because code under
``recipes/`` imports nothing of the controller. Only rank 0 prints the log, as Lightning's progress output
does; the other ranks check the command line the same way and exit with the same code.

Test hooks: ``DSE_SIM_SLEEP_S`` sleeps that long before training (a job that hangs, for time-limit tests);
``DSE_SIM_STEP_S`` sleeps that long after each step (a long-running trial, for early-stop tests);
``DSE_SIM_ECHO_ENV`` (comma-separated names) prints those variables as the process received them.
"""

from __future__ import annotations

import argparse
import ast
import copy
import io
import os
import re
import sys
import time
from typing import Any

from ..contract import SIM_ENV
from .logwriter import SimRun, write_log

USAGE_ERROR = 2

# The NeMo 2 recipe fields the simulated trainer knows (a subset of llm.pretrain's config tree), and the
# arguments its factories take (recipes/nemo2/factories.py) for what a dotted override cannot set.
FACTORY_ARGS = {"fsdp": bool, "tp_comm_overlap": bool, "tp_comm_overlap_cfg": str, "attention_backend": str}
# Megatron-Core's AttnBackend names (megatron/core/transformer/enums.py), which the NeMo 2 factories take
ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")
_FACTORY = re.compile(r"^(?P<name>[A-Za-z_]\w*_recipe)(?:\((?P<args>.*)\))?$")
_DEFAULT_CONFIG: dict[str, Any] = {
    "trainer": {
        "num_nodes": 1,
        "devices": 8,
        "max_steps": 50,
        "val_check_interval": 50,
        "limit_val_batches": 0,
        "log_every_n_steps": 1,
        "enable_checkpointing": False,
        "strategy": {
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "virtual_pipeline_model_parallel_size": None,
            "context_parallel_size": 1,
            "expert_model_parallel_size": 1,
            "sequence_parallel": False,
            "fsdp": None,
            "account_for_embedding_in_pipeline_split": False,
            "account_for_loss_in_pipeline_split": False,
            "ckpt_async_save": False,
            "use_te_rng_tracker": False,
            # DistributedDataParallelConfig's fields that knobs set (nccl_ub; its FSDP double buffer; the weight
            # all-gather's overlap, True in NeMo 2's recipes)
            "ddp": {"nccl_ub": False, "fsdp_double_buffer": False, "overlap_param_gather": True},
        },
        "plugins": {
            "precision": "bf16-mixed",
            "fp8": None,
            "fp8_recipe": None,
            "fp8_margin": 0,
            "fp8_amax_history_len": 1,
            "fp8_amax_compute_algo": "most_recent",
            "fp8_param_gather": False,
            "grad_reduce_in_fp32": False,
            "first_last_layers_bf16": False,
            "reuse_grad_buf_for_mxfp8_param_ag": False,
            # Megatron-Core's FP4 fields (fp4="e2m1", fp4_recipe="nvfp4": Megatron-Bridge's bf16_with_nvfp4_mixed)
            "fp4": None,
            "fp4_recipe": None,
        },
    },
    "data": {"micro_batch_size": 1, "global_batch_size": 128, "seq_length": 8192},
    "model": {
        "config": {
            "seq_length": 8192,
            "recompute_granularity": None,
            "recompute_method": None,
            "recompute_num_layers": None,
            "recompute_modules": None,
            "num_layers": None,
            "cpu_offloading": False,
            "cpu_offloading_num_layers": 0,
            "cpu_offloading_activations": True,
            "cpu_offloading_weights": False,
            "enable_cuda_graph": False,
        }
    },
    "optim": {"config": {"lr": 3e-4}},
    "log": {"ckpt": {"save_on_train_epoch_end": False, "save_last": False}},
}


class OverrideError(ValueError):
    pass


def parse_factory(text: str) -> tuple[str, dict[str, Any]]:
    """``llama3_8b_recipe`` or ``llama3_8b_recipe(tp_comm_overlap=True,tp_comm_overlap_cfg="...")`` as
    nemo-run's ``--factory`` takes it: the name and its keyword arguments (Python literals only)."""
    m = _FACTORY.match(text)
    if not m:
        raise OverrideError(f"unknown factory {text!r}; factories are named <recipe>_recipe[(arg=value,...)]")
    args: dict[str, Any] = {}
    if m["args"]:
        try:
            call = ast.parse(f"f({m['args']})", mode="eval").body
            if call.args:
                raise ValueError("positional arguments")
            args = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        except (SyntaxError, ValueError) as e:
            raise OverrideError(f"factory arguments {m['args']!r} are not keyword=literal ({e})") from None
    for key, value in args.items():
        if key not in FACTORY_ARGS or not isinstance(value, FACTORY_ARGS[key]):
            raise OverrideError(
                f"factory {m['name']} takes no argument {key}={value!r}; "
                f"known: {', '.join(f'{k} ({t.__name__})' for k, t in FACTORY_ARGS.items())}"
            )
    backend = args.get("attention_backend")
    if backend is not None and backend not in ATTENTION_BACKENDS:
        raise OverrideError(f"unknown attention_backend {backend!r}; one of {', '.join(ATTENTION_BACKENDS)}")
    return m["name"], args


def parse_value(text: str) -> Any:
    """An override's value as nemo-run's CLI reads simple literals: null, booleans, numbers, else a string."""
    low = text.lower()
    if low in ("null", "none"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def apply_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of ``config`` with each ``a.b.c=value`` set; unknown paths raise :class:`OverrideError`."""
    out = copy.deepcopy(config)
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise OverrideError(f"override {item!r} is not path=value")
        node: Any = out
        parts = path.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                raise OverrideError(f"unknown override path {path!r} (no {'.'.join(parts[: i + 1])!r} in the config)")
            if i == len(parts) - 1:
                if isinstance(node[part], dict):
                    raise OverrideError(f"override path {path!r} names a section, not a field")
                node[part] = parse_value(raw)
            else:
                node = node[part]
    return out


def _env_num(name: str, conv, default):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return conv(raw)
    except ValueError:
        raise OverrideError(f"{name}={raw!r} is not a number") from None


def sim_run_from_env(config: dict[str, Any]) -> SimRun:
    """The run to print: figures from ``DSE_SIM_*``, batch size and steps from the (overridden) config."""
    return SimRun(
        step_time_s=_env_num(SIM_ENV["step_time_s"], float, 1.0),
        tflops_per_gpu=_env_num(SIM_ENV["tflops_per_gpu"], float, 0.0),
        gbs=int(config["data"]["global_batch_size"]),
        max_steps=int(config["trainer"]["max_steps"]),
        peak_memory_gib=_env_num(SIM_ENV["peak_memory_gib"], float, 0.0),
        gpu_memory_gib=_env_num(SIM_ENV["gpu_memory_gib"], float, 80.0),
        oom=bool(_env_num(SIM_ENV["oom"], int, 0)),
        oom_after=_env_num(SIM_ENV["oom_after"], int, 0),
        seed=_env_num(SIM_ENV["seed"], int, 0),
    )


def base_config() -> dict[str, Any]:
    """The default config, with batch size and steps from the environment when given."""
    config = copy.deepcopy(_DEFAULT_CONFIG)
    config["data"]["global_batch_size"] = _env_num(SIM_ENV["gbs"], int, config["data"]["global_batch_size"])
    config["trainer"]["max_steps"] = _env_num(SIM_ENV["max_steps"], int, config["trainer"]["max_steps"])
    return config


def _rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--factory", required=True, help="recipe factory, e.g. llama3_8b_recipe")
    parser.add_argument("-y", "--yes", action="store_true", help="no confirmation (as nemo-run's CLI)")
    parser.add_argument("overrides", nargs="*", help="path=value")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on a bad command line
        return int(e.code or 0)
    try:
        parse_factory(args.factory)
        config = apply_overrides(base_config(), args.overrides)
        run = sim_run_from_env(config)
    except OverrideError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE_ERROR

    out = sys.stdout if _rank() == 0 else io.StringIO()
    out.write(f"[NeMo I] factory {args.factory}; overrides: {' '.join(args.overrides)}\n")
    for name in filter(None, os.environ.get("DSE_SIM_ECHO_ENV", "").split(",")):
        out.write(f"[NeMo I] env {name}={os.environ.get(name, '<unset>')}\n")
    out.flush()
    time.sleep(_env_num("DSE_SIM_SLEEP_S", float, 0.0))
    step_s = _env_num("DSE_SIM_STEP_S", float, 0.0)

    def pace(_: int) -> bool:  # a run that takes real time per step (early-stop tests): flush, then wait
        out.flush()
        time.sleep(step_s)
        return False

    code = write_log(run, out, after_step=pace if step_s > 0 else None)
    out.flush()
    if code:
        # A failed rank takes a moment to tear down (CUDA, NCCL) after printing its error, and the other ranks
        # wait in a collective until the launcher ends them. Exiting at once would let srun
        # --kill-on-bad-exit end the step before it has forwarded rank 0's last lines to the log.
        time.sleep(
            _env_num("DSE_SIM_TEARDOWN_S", float, 1.0) if _rank() == 0 else _env_num("DSE_SIM_PEER_WAIT_S", float, 5.0)
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
