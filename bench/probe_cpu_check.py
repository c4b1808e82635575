"""Can a probe run on a CPU? Each step of recipes.mcore's training step, tried on PyTorch's CPU build.

    WORLD_SIZE=64 RANK=0  python bench/probe_cpu_check.py --model small_gqa --pp 4 --gbs 64 --seq-length 64 \\
        --hidden-size 256 --num-attention-heads 8 --num-query-groups 4 --ffn-hidden-size 512 --vocab-size 1024
    WORLD_SIZE=64 RANK=48 python bench/probe_cpu_check.py --model small_moe --pp 4 --ep 16 --gbs 64 --seq-length 64 \\
        --hidden-size 256 --num-attention-heads 8 --num-query-groups 4 --ffn-hidden-size 512 \\
        --moe-ffn-hidden-size 64 --vocab-size 1024 --no-moe-grouped-gemm

Needs torch (a CPU build) and megatron-core (plus Triton, which ``megatron.core`` imports) in the environment;
dse's own dependencies are not needed. One rank of a ``WORLD_SIZE``-rank layout on PyTorch's fake process group (its
collectives serve CPU tensors), the payload's own configuration (local layer spec), parameters in fp32 and made on
the CPU (``use_cpu_initialization``). Prints, per step, OK or FAIL with the exception and the line of megatron-core
that raised it (measured). docs/probe.md lists what this found for megatron-core 0.19.2.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def step(name: str, fn):
    """Run ``fn``; print OK, or FAIL with the exception and the innermost megatron-core frame that raised it."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the point is to report whatever megatron-core raises
        frames = traceback.extract_tb(e.__traceback__)
        inner = [f for f in frames if "megatron" in f.filename] or frames
        where = inner[-1].filename.split("megatron/core/")[-1]
        print(
            f"FAIL {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]} (megatron/core/{where}:{inner[-1].lineno})"
        )
        return None
    print(f"OK   {name}")
    return out


def init(argv: list[str]):
    """The payload's checked configuration, the fake process group and Megatron's parallel state (gloo off)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from recipes.mcore.config import check, config_from_argv

    world, rank = int(os.environ.get("WORLD_SIZE", "64")), int(os.environ.get("RANK", "0"))
    cfg, _ = config_from_argv(["--layer-spec", "local", *argv])
    cfg = check(cfg, world, te_available=False)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.tp,
        pipeline_model_parallel_size=cfg.pp,
        expert_model_parallel_size=cfg.ep,
        expert_tensor_parallel_size=cfg.etp,
        create_gloo_process_groups=False,
    )
    print(f"rank {rank} of {world}: pipeline stage {parallel_state.get_pipeline_model_parallel_rank()} of {cfg.pp}")
    return cfg


def build(cfg):
    """The rank's GPTModel from the payload's config and layer spec, in fp32 on the CPU."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    from recipes.mcore import train

    config = train._transformer_config(cfg, fake=True)
    config.use_cpu_initialization = True
    config.bf16, config.params_dtype, config.pipeline_dtype = False, torch.float32, torch.float32
    config.autocast_dtype = torch.float32
    model = GPTModel(
        config=config,
        transformer_layer_spec=train.layer_spec(cfg, config, None),
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=500000,
    )
    return config, model


def forward_backward(cfg, model) -> None:
    """One micro-batch through the stage and back (a random input where the stage is not the first)."""
    import torch
    from megatron.core import parallel_state

    tokens = torch.randint(0, cfg.vocab_size, (cfg.mbs, cfg.seq_length))
    positions = torch.arange(cfg.seq_length).unsqueeze(0)
    if not parallel_state.is_pipeline_first_stage():
        model.set_input_tensor(torch.randn(cfg.seq_length, cfg.mbs, cfg.hidden_size, requires_grad=True))
    labels = tokens if parallel_state.is_pipeline_last_stage() else None
    model(tokens, positions, None, labels=labels).float().sum().backward()


def main() -> None:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from recipes.mcore import train

    cfg = init(sys.argv[1:])
    step("model_parallel_cuda_manual_seed (Megatron's RNG tracker)", lambda: model_parallel_cuda_manual_seed(1234))
    built = step("GPTModel of the rank's stage (use_cpu_initialization, fp32)", lambda: build(cfg))
    if built is None:
        return
    config, model = built
    step("forward and backward of one micro-batch", lambda: forward_backward(cfg, model))
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=cfg.distributed_optimizer)
    ddp = step(
        "DistributedDataParallel (gradient buffers)",
        lambda: DistributedDataParallel(config=config, ddp_config=ddp_config, module=model),
    )
    if ddp is not None:
        step("get_megatron_optimizer (distributed optimizer)", lambda: train._optimizer(cfg, [ddp], fake=True))
    step(
        "get_forward_backward_func (the pipeline schedule)",
        lambda: get_forward_backward_func()(
            forward_step_func=train._forward_step,
            data_iterator=[iter([])],
            model=[ddp or model],
            num_microbatches=1,
            seq_length=cfg.seq_length,
            micro_batch_size=cfg.mbs,
            decoder_seq_length=cfg.seq_length,
            forward_only=False,
        ),
    )


if __name__ == "__main__":
    main()
