"""``python -m recipes.mcore [flags] [path=value ...]``: parse, validate, then train (torch imported only then)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from .config import (
    BLACKWELL_FP8_RECIPES,
    ConfigError,
    check,
    config_from_argv,
    model_flops_per_step,
)


def _gpu_capability() -> tuple[int, int] | None:
    """This process's GPU's compute capability (torch imported only for the FP8 recipes that depend on it)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(int(os.environ.get("LOCAL_RANK", "0")))


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 after training, 2 for a configuration this payload cannot run (one line on stderr)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg, ns = config_from_argv(argv)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        cfg = check(cfg, world)
        if not ns.check_only and cfg.precision == "fp8" and cfg.fp8_recipe in BLACKWELL_FP8_RECIPES:
            cfg = check(cfg, world, gpu_capability=_gpu_capability())
    except ConfigError as e:
        print(f"recipes.mcore: error: {e}", file=sys.stderr)
        return 2
    if ns.check_only:
        print(
            json.dumps(
                {
                    "config": cfg.to_dict(),
                    "model_flops_per_step": model_flops_per_step(cfg),
                    "flops_convention": "causal",
                },
                sort_keys=True,
            )
        )
        return 0
    from .train import train

    return train(cfg, fake=ns.fake_process_group)


if __name__ == "__main__":
    sys.exit(main())
