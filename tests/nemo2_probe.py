"""Run the NeMo 2 payload's entry point up to the point of training and print the resolved config as JSON.

Not a test module: ``tests/test_nemo2_factories.py`` runs it with the NeMo environment's Python, either as
``python tests/nemo2_probe.py <payload argv...>`` or, to import NeMo once for many trials,
``python tests/nemo2_probe.py --cases FILE`` with a JSON list of ``{"env": {...}, "argv": [...]}``; ``--tables``
prints what the plain-data tables name and NeMo lacks. Each result is one ``DSE_PROBE <json>`` line. It calls :func:`recipes.nemo2.__main__.main` exactly as the
container does, with nemo-run's ``run.run`` replaced by a function that keeps the parsed task instead of
training, then builds the parts that need no GPU (model config, precision plugin, callbacks, data module) to
show that the factories are valid calls of NeMo's API, and prints the fields the tests compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The probe runs in the NeMo environment, where dse is not installed: it imports the payload as a training container
# sees it, the top-level package `recipes` from the repository root (the payload imports itself relatively).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TE_ONLY_FUSIONS = ("apply_rope_fusion",)


def _name(obj) -> str | None:
    target = getattr(obj, "__fn_or_cls__", None)
    return None if target is None else target.__name__


def probe(argv: list[str]) -> dict:
    """The resolved fields of the task that ``python -m recipes.nemo2 <argv>`` would train."""
    import fiddle as fdl
    import nemo_run

    captured = {}

    def fake_run(fn_or_script=None, **kwargs):
        captured["task"] = fn_or_script

    nemo_run.run = fake_run  # nemo-run's CLI looks the function up on the module at call time
    from recipes.nemo2.__main__ import main as payload_main

    payload_main(argv)
    task = captured["task"]
    strat, data, cfg, plug, trainer = (
        task.trainer.strategy,
        task.data,
        task.model.config,
        task.trainer.plugins,
        task.trainer,
    )
    callbacks = list(trainer.callbacks or [])
    overlap = next((c for c in callbacks if _name(c) == "MegatronCommOverlapCallback"), None)
    flops = next((c for c in callbacks if _name(c) == "FLOPsMeasurementCallback"), None)
    out = {
        "fn": task.__fn_or_cls__.__name__,
        "tp": strat.tensor_model_parallel_size,
        "pp": strat.pipeline_model_parallel_size,
        "vp": strat.virtual_pipeline_model_parallel_size,
        "cp": strat.context_parallel_size,
        "ep": getattr(strat, "expert_model_parallel_size", 1),
        "sp": strat.sequence_parallel,
        "split_embedding": strat.account_for_embedding_in_pipeline_split,
        "split_loss": strat.account_for_loss_in_pipeline_split,
        "fsdp": strat.fsdp,
        "sharding": getattr(strat.ddp, "data_parallel_sharding_strategy", None),
        "check_for_nan_in_grad": getattr(strat.ddp, "check_for_nan_in_grad", None),
        "mbs": data.micro_batch_size,
        "gbs": data.global_batch_size,
        "data_seq_length": data.seq_length,
        "model_seq_length": cfg.seq_length,
        "num_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "ffn_hidden_size": cfg.ffn_hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_query_groups": cfg.num_query_groups,
        "model_config": _name(cfg),
        "recompute_granularity": cfg.recompute_granularity,
        "recompute_method": cfg.recompute_method,
        "recompute_num_layers": cfg.recompute_num_layers,
        "cpu_offloading": cfg.cpu_offloading,
        "cpu_offloading_num_layers": cfg.cpu_offloading_num_layers,
        "cpu_offloading_activations": cfg.cpu_offloading_activations,
        "cpu_offloading_weights": cfg.cpu_offloading_weights,
        "attention_backend": getattr(cfg.attention_backend, "name", cfg.attention_backend),
        "init_model_with_meta_device": getattr(cfg, "init_model_with_meta_device", False),
        "cross_entropy": (cfg.cross_entropy_loss_fusion, cfg.cross_entropy_fusion_impl),
        "fp8": plug.fp8,
        "fp8_recipe": getattr(plug, "fp8_recipe", "delayed"),
        "fp8_param_gather": getattr(plug, "fp8_param_gather", None),
        "fp8_amax_history_len": getattr(plug, "fp8_amax_history_len", 1),
        "first_last_layers_bf16": getattr(plug, "first_last_layers_bf16", False),
        "precision_aware_optimizer": task.optim.config.use_precision_aware_optimizer,
        "num_nodes": trainer.num_nodes,
        "devices": trainer.devices,
        "max_steps": trainer.max_steps,
        "limit_val_batches": trainer.limit_val_batches,
        "callbacks": [_name(c) for c in callbacks],
        "tp_comm_overlap": None if overlap is None else overlap.tp_comm_overlap,
        "tp_comm_overlap_cfg": None
        if overlap is None or overlap.tp_comm_overlap_cfg is None
        else _name(overlap.tp_comm_overlap_cfg),
        "vocab_size": getattr(getattr(data, "tokenizer", None), "vocab_size", None),
        "flops_model_name": None if flops is None else flops.model_name,
        "flops_seq_length": None if flops is None else flops.model_config.seq_length,
        "flops_gbs": None if flops is None else flops.data_config.global_batch_size,
    }
    # Build what needs no GPU: a wrong keyword or a missing class fails here, as it would in the container.
    # Transformer Engine is absent on CPU: switch off the fusions that check for it (the FLOPs callback
    # shares this config, so it is changed in place, after the values above were read).
    for fusion in TE_ONLY_FUSIONS:
        setattr(cfg, fusion, False)
    built = {"model_config": fdl.build(cfg), "plugins": fdl.build(plug), "callbacks": fdl.build(callbacks)}
    if out["vocab_size"] is not None:
        built["tokenizer"] = fdl.build(data.tokenizer)
        out["built_vocab_size"] = built["tokenizer"].vocab_size
    out["built_num_layers"] = built["model_config"].num_layers
    out["built_cpu_offloading"] = [
        getattr(built["model_config"], f)
        for f in ("cpu_offloading", "cpu_offloading_num_layers", "cpu_offloading_activations", "cpu_offloading_weights")
    ]
    out["built_attention_backend"] = built["model_config"].attention_backend.name
    out["built_fp8"] = built["plugins"].dtype_config.fp8
    out["built_callbacks"] = [type(c).__name__ for c in built["callbacks"]]
    if overlap is not None and overlap.tp_comm_overlap_cfg is not None:
        idx = out["callbacks"].index("MegatronCommOverlapCallback")
        ub = built["callbacks"][idx].user_comm_overlap_cfg.tp_comm_overlap_cfg
        out["built_ub_cfg"] = type(ub).__name__
    return out


def tables() -> dict:
    """Names in recipes.nemo2's tables that the installed NeMo does not have (all lists empty when in step)."""
    from nemo.collections import llm
    from nemo.collections.llm.recipes.tp_overlap_configs import userbuffers as nemo_ub

    from recipes.models import RECIPES
    from recipes.nemo2 import spec, userbuffers

    return {
        "missing_modules": [m.module for m in spec.MODELS.values() if not hasattr(llm, m.module)],
        "missing_registry_modules": sorted({r.nemo2_recipe for r in RECIPES.values()} - set(dir(llm))),
        "missing_userbuffers": [n for n in userbuffers.UB_CONFIGS.values() if not hasattr(nemo_ub, n)],
        "unlisted_userbuffers": sorted(
            n
            for n in dir(nemo_ub)
            if n.startswith("userbuffers_") and "lora" not in n and n not in userbuffers.UB_CONFIGS.values()
        ),
    }


def main() -> None:
    import os

    args = sys.argv[1:]
    if args[:1] == ["--tables"]:
        print("DSE_PROBE " + json.dumps(tables()))
        return
    cases = json.loads(Path(args[1]).read_text()) if args[:1] == ["--cases"] else [{"env": {}, "argv": args}]
    for case in cases:
        saved = dict(os.environ)
        os.environ.update(case.get("env", {}))
        try:
            out = probe(list(case["argv"]))
        except BaseException as e:  # noqa: BLE001 - reported to the test, which fails with the message
            out = {"error": f"{type(e).__name__}: {e}"}
        finally:
            os.environ.clear()
            os.environ.update(saved)
        print("DSE_PROBE " + json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
