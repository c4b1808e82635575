"""Entry point of the Megatron-Bridge payload: build the recipe's ConfigContainer, apply overrides, pretrain.

Overrides go through Bridge's own ``omegaconf_utils`` (Hydra syntax), as Bridge's ``scripts/training`` and
``scripts/performance`` entry points do; the precision recipe and the userbuffer config are objects and are
set in Python first.
"""

from __future__ import annotations

import os
import sys


def build_config(args):
    """The ConfigContainer of ``args.recipe`` with ``args``' precision, userbuffer config and overrides applied."""
    import importlib

    from megatron.bridge.training.utils import omegaconf_utils

    cfg = getattr(importlib.import_module(args.recipe_module), args.recipe)()
    if args.clears_layout and getattr(cfg.model, "pipeline_model_parallel_layout", None) is not None:
        cfg.model.pipeline_model_parallel_layout = None  # the command line sets the split (argv.clears_layout)
    if args.mixed_precision:
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        cfg.mixed_precision = get_mixed_precision_config(args.mixed_precision)
    if args.needs_comm_overlap and cfg.comm_overlap is None:
        from megatron.bridge.training.comm_overlap import CommOverlapConfig

        cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)
    if args.tp_comm_overlap_cfg:
        from megatron.bridge.training import comm_overlap

        cfg.comm_overlap.tp_comm_overlap_cfg = getattr(comm_overlap, args.tp_comm_overlap_cfg)
    overrides = list(args.overrides)
    if hasattr(omegaconf_utils, "process_config_with_overrides"):
        return omegaconf_utils.process_config_with_overrides(cfg, cli_overrides=overrides)
    # Older Bridge: the same three steps its scripts/training/run_recipe.py spelled out.
    from omegaconf import OmegaConf

    conf, excluded = omegaconf_utils.create_omegaconf_dict_config(cfg)
    conf = omegaconf_utils.parse_hydra_overrides(conf, overrides)
    omegaconf_utils.apply_overrides(cfg, OmegaConf.to_container(conf, resolve=True), excluded)
    return cfg


def main(argv: list[str] | None = None) -> None:
    from .argv import parse

    args = parse(sys.argv[1:] if argv is None else argv, dict(os.environ))
    cfg = build_config(args)

    import torch
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    pretrain(config=cfg, forward_step_func=forward_step)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
