"""The training loop: Megatron-core's GPTModel with the local layer spec, its optimizer and schedules.

A minimal stand-in for ``megatron.training.pretrain`` (the megatron-core wheel ships only
``megatron.core``), built the way ``megatron/training/training.py`` builds things: model chunks wrapped in
``Float16Module`` and Megatron's ``DistributedDataParallel``, ``get_megatron_optimizer`` (distributed
optimizer by default), ``OptimizerParamScheduler``, ``get_forward_backward_func`` for the pipeline
schedule, and its ``training_log`` / ``report_memory`` lines. Data are mock token sequences made on the GPU.
torch and megatron are imported inside functions, so that importing this module needs neither.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import datetime
from types import SimpleNamespace

from .config import (
    LossAverager,
    RunConfig,
    format_iteration_line,
    format_memory_line,
    format_timers,
    header_lines,
    model_flops_per_step,
    probe_line,
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _print(text: str) -> None:
    print(text, flush=True)


def _init_distributed(cfg: RunConfig, fake: bool = False):
    """torch.distributed from torchrun's environment, or a one-process group when run without torchrun.

    ``fake``: one rank (``RANK``) of a ``WORLD_SIZE``-rank job in this one process, on PyTorch's ``fake``
    process group (as Megatron-LM's ``--fake-process-group``): every collective returns at once, so the rank
    builds and runs its own stage with real weights, optimizer states, activations and kernels. Megatron's gloo
    groups are off there (``new_group`` on a fake store fails)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if fake:
        os.environ["LOCAL_RANK"] = "0"
    elif "RANK" not in os.environ:  # plain `python -m recipes.mcore`: one process, one GPU
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    if fake and not dist.is_initialized():
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    elif not dist.is_initialized():
        dist.init_process_group(backend="nccl", device_id=torch.device("cuda", local_rank))
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=cfg.tp,
        pipeline_model_parallel_size=cfg.pp,
        virtual_pipeline_model_parallel_size=cfg.vp if cfg.vp > 1 else None,
        context_parallel_size=cfg.cp,
        expert_model_parallel_size=cfg.ep,
        expert_tensor_parallel_size=cfg.etp,
        create_gloo_process_groups=not fake,
    )
    # As megatron.training.initialize._set_random_seed: a different seed per pipeline stage.
    seed = cfg.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    return dist.get_rank(), dist.get_world_size()


def _moe_config(cfg: RunConfig) -> dict:
    """TransformerConfig's MoE fields, as Megatron-Bridge's MoE model providers set them (router in fp32, as its
    performance configs: ``moe_router_dtype="fp32"``); dropless unless a capacity factor is given."""
    extra = dict(
        num_moe_experts=cfg.num_experts,
        moe_router_topk=cfg.moe_topk,
        moe_ffn_hidden_size=cfg.expert_ffn,
        moe_router_score_function=cfg.moe_router_score,
        moe_router_load_balancing_type=cfg.moe_load_balancing,
        moe_aux_loss_coeff=cfg.moe_aux_loss_coeff if cfg.moe_load_balancing != "none" else 0.0,
        moe_token_dispatcher_type=cfg.moe_dispatcher,
        moe_grouped_gemm=bool(cfg.moe_grouped_gemm),
        moe_permute_fusion=cfg.moe_permute_fusion,
        moe_router_dtype="fp32",
        expert_model_parallel_size=cfg.ep,
        expert_tensor_parallel_size=cfg.etp,
    )
    if cfg.moe_shared_expert_size:
        extra["moe_shared_expert_intermediate_size"] = cfg.moe_shared_expert_size
    if cfg.moe_first_dense_layers:
        k = cfg.moe_first_dense_layers
        extra["moe_layer_freq"] = [0] * k + [1] * (cfg.num_layers - k)
    if cfg.moe_capacity_factor is not None:
        extra.update(
            moe_expert_capacity_factor=cfg.moe_capacity_factor, moe_pad_expert_input_to_capacity=cfg.moe_pad_to_capacity
        )
    if cfg.moe_expert_bias:
        # DeepSeek-V3's aux-loss-free balancing (Megatron-Bridge's DeepSeek-V3 provider: bias update rate 1e-3)
        extra.update(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3)
    return extra


def _mla_config(cfg: RunConfig) -> dict:
    """MLATransformerConfig's fields for multi-latent attention, as Megatron-Bridge's DeepSeek-V3 provider sets
    them (YaRN RoPE of base 10000, scaling factor 40 over 4096 positions, mscale 1); the latent q and kv norms
    (qk_layernorm) are off: the local layer spec has no fused norm-linear to put them in."""
    return dict(
        q_lora_rank=cfg.q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_head_dim=cfg.qk_nope_head_dim,
        qk_pos_emb_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.v_head_dim,
        rope_type="yarn",
        rotary_base=10000,
        rotary_scaling_factor=40,
        original_max_position_embeddings=4096,
        mscale=1.0,
        mscale_all_dim=1.0,
    )


def _transformer_config(cfg: RunConfig, fake: bool = False):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    recompute = None if cfg.recompute == "none" else cfg.recompute
    te = cfg.layer_spec == "te"
    fp8 = cfg.precision == "fp8"
    extra = {}
    if fp8:
        # NeMo's bf16_with_fp8_*_mixed recipes: hybrid (E4M3 forward, E5M2 gradients); delayed scaling with
        # their amax history (1024, max), tensorwise = TE's current scaling.
        extra.update(fp8="hybrid", fp8_recipe=cfg.fp8_recipe, fp8_margin=0)
        if cfg.fp8_recipe == "delayed":
            extra.update(fp8_amax_history_len=1024, fp8_amax_compute_algo="max")
    if cfg.is_moe:
        extra.update(_moe_config(cfg))
        if fake:
            # A probe's other stages receive no activations (the fake group's receives leave their buffers as they
            # were), so its router would see noise: route evenly instead, as Megatron's benchmarking option does.
            extra["moe_router_force_load_balancing"] = True
    if cfg.is_mla:
        extra.update(_mla_config(cfg))
        # the unfused core attention's context width (heads x kv_channels) is the value head's (_unfused_attention)
        extra["kv_channels"] = cfg.v_head_dim
    if cfg.cpu_offloading:
        extra.update(
            cpu_offloading=True,
            cpu_offloading_num_layers=cfg.cpu_offloading_num_layers,
            cpu_offloading_activations=True,
            cpu_offloading_weights=False,
        )
    config_class = MLATransformerConfig if cfg.is_mla else TransformerConfig
    return config_class(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups,
        kv_channels=extra.pop("kv_channels", cfg.head_dim),
        ffn_hidden_size=cfg.ffn_hidden_size,
        tensor_model_parallel_size=cfg.tp,
        pipeline_model_parallel_size=cfg.pp,
        virtual_pipeline_model_parallel_size=cfg.vp if cfg.vp > 1 else None,
        context_parallel_size=cfg.cp,
        sequence_parallel=bool(cfg.sp),
        # Llama-style block: RMSNorm, no biases, no dropout, SwiGLU (or GeLU) MLP, RoPE (set on the model).
        normalization="RMSNorm",
        add_bias_linear=False,
        gated_linear_unit=cfg.gated,
        activation_func=F.silu if cfg.gated else F.gelu,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        num_layers_in_first_pipeline_stage=cfg.pp_first_layers or None,
        num_layers_in_last_pipeline_stage=cfg.pp_last_layers or None,
        account_for_embedding_in_pipeline_split=cfg.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=cfg.account_for_loss_in_pipeline_split,
        autocast_dtype=torch.bfloat16,
        # The fusions NeMo's Llama recipes turn on (masked softmax, bias+SwiGLU/GeLU, bias+dropout+add, RoPE)
        # on the TE spec; off on the local spec, whose kernels would need Apex or TE. Gradient-accumulation
        # fusion stays off on both: Megatron's output layer needs Apex's fused_weight_gradient_mlp_cuda for it.
        masked_softmax_fusion=te,
        bias_activation_fusion=te,
        bias_dropout_fusion=te,
        apply_rope_fusion=te,
        gradient_accumulation_fusion=False,
        attention_backend=AttnBackend[cfg.attention_backend],
        recompute_granularity=recompute,
        recompute_method=cfg.recompute_method if recompute == "full" else None,
        recompute_num_layers=cfg.recompute_num_layers if recompute == "full" else None,
        recompute_modules=cfg.recompute_modules.split(",")
        if recompute == "selective" and cfg.recompute_modules
        else None,
        **extra,
    )


def _unfused_attention(cfg: RunConfig):
    """Megatron-Core's unfused DotProductAttention, for the local spec and the TE spec with attention_backend=local.

    Multi-latent attention builds its core attention with ``k_channels`` (the query/key head: nope + rope) and
    ``v_channels`` (the value head), which TEDotProductAttention takes and Megatron-Core 0.19.2's DotProductAttention
    does not (its local MLA spec fails to build). Its forward needs neither: the query/key head size is read from
    the tensors, the softmax scale comes from MLA, and the context's width is ``kv_channels`` x heads, which the MLA
    config sets to the value head (:func:`_transformer_config`). So for MLA the two arguments are checked and
    dropped."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    if not cfg.is_mla:
        return DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, config, *args, k_channels=None, v_channels=None, **kwargs):
            if v_channels is not None and v_channels != config.kv_channels:
                raise ValueError(f"v_channels={v_channels} differs from kv_channels={config.kv_channels}")
            super().__init__(config, *args, **kwargs)

    return MLADotProductAttention


def layer_spec(cfg: RunConfig, config=None, vp_stage: int | None = None):
    """The layer spec ``cfg.layer_spec`` names: TE's (core attention: TEDotProductAttention, whose kernel
    Megatron-Core picks from ``config.attention_backend``; megatron's unfused DotProductAttention for
    attention_backend=local, as Megatron-LM's model builder swaps it in), or the local one. Multi-latent attention
    (``multi_latent_attention``) replaces the self-attention where the model has it.

    An MoE gets the block spec Megatron-LM's GPT builder uses for ``--num-experts``
    (``get_gpt_decoder_block_spec``: the dense layers of ``moe_layer_freq`` and the MoE layers, whose experts are
    TEGroupedMLP with ``moe_grouped_gemm`` on the TE spec, else SequentialMLP), for this pipeline stage."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    unfused = cfg.layer_spec != "te" or cfg.attention_backend == "local"
    if cfg.is_moe:
        block = get_gpt_decoder_block_spec(
            config, use_transformer_engine=cfg.layer_spec == "te", normalization="RMSNorm", vp_stage=vp_stage
        )
        specs = block.layer_specs
    elif cfg.layer_spec != "te":
        block = get_gpt_layer_local_spec(normalization="RMSNorm", multi_latent_attention=cfg.is_mla)
        specs = [block]
    else:
        block = get_gpt_layer_with_transformer_engine_spec(multi_latent_attention=cfg.is_mla)
        specs = [block]
    if unfused and (cfg.layer_spec == "te" or cfg.is_mla):
        for spec in specs:
            spec.submodules.self_attention.submodules.core_attention = _unfused_attention(cfg)
    return block


def _build_model(cfg: RunConfig, config):
    """Model chunks (one per virtual stage) wrapped as megatron.training.get_model wraps them."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.module import Float16Module

    vp = cfg.vp if cfg.vp > 1 else None
    chunks = []
    for i in range(vp or 1):
        stage = i if vp else None
        spec = layer_spec(cfg, config, stage)
        pre = parallel_state.is_pipeline_first_stage(ignore_virtual=vp is None, vp_stage=stage)
        post = parallel_state.is_pipeline_last_stage(ignore_virtual=vp is None, vp_stage=stage)
        m = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=cfg.vocab_size,
            max_sequence_length=cfg.seq_length,
            pre_process=pre,
            post_process=post,
            parallel_output=True,
            share_embeddings_and_output_weights=False,
            position_embedding_type="rope",
            rotary_base=500000,
            vp_stage=stage,
        )
        chunks.append(m)
    n_params = sum(p.nelement() for m in chunks for p in m.parameters())
    if parallel_state.get_data_parallel_rank() == 0:
        tp_rank, pp_rank = (
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_pipeline_model_parallel_rank(),
        )
        _print(f" > number of parameters on (tensor, pipeline) model parallel rank ({tp_rank}, {pp_rank}): {n_params}")
    device = torch.cuda.current_device()
    chunks = [Float16Module(config, m.cuda(device)) for m in chunks]
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=bool(cfg.overlap_grad_reduce),
        use_distributed_optimizer=cfg.distributed_optimizer,
        check_for_nan_in_grad=False,
    )
    return [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=m, disable_bucketing=i > 0)
        for i, m in enumerate(chunks)
    ]


def _optimizer(cfg: RunConfig, chunks, fake: bool = False):
    import torch
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_eps=1e-8,
        clip_grad=cfg.clip_grad,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=cfg.distributed_optimizer,
    )
    optimizer = get_megatron_optimizer(opt_config, chunks, use_gloo_process_groups=not fake)
    # Sample-based schedule, as Megatron steps it (increment = global batch size).
    decay = cfg.lr_decay_iters or cfg.train_iters
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=cfg.lr,
        min_lr=cfg.min_lr,
        lr_warmup_steps=min(cfg.lr_warmup_iters, decay - 1) * cfg.gbs,  # must be < decay steps
        lr_decay_steps=decay * cfg.gbs,
        lr_decay_style="cosine",
        start_wd=cfg.weight_decay,
        end_wd=cfg.weight_decay,
        wd_incr_steps=max(cfg.train_iters, 1) * cfg.gbs,
        wd_incr_style="constant",
    )
    return optimizer, scheduler


def _mock_batches(cfg: RunConfig, dp_rank: int):
    """Endless micro-batches of arithmetic token sequences (random start and stride) made on the GPU.

    Learnable, so the loss falls as a real run's does; the same on every tensor- and pipeline-parallel rank
    of one data-parallel replica (same seed, same draws), different across replicas.
    """
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed * 1009 + dp_rank)
    steps = torch.arange(cfg.seq_length + 1, device=device, dtype=torch.int64)
    position_ids = torch.arange(cfg.seq_length, device=device, dtype=torch.int64).unsqueeze(0).expand(cfg.mbs, -1)
    loss_mask = torch.ones(cfg.mbs, cfg.seq_length, device=device, dtype=torch.float32)
    while True:
        start = torch.randint(0, cfg.vocab_size, (cfg.mbs, 1), generator=gen, device=device)
        stride = torch.randint(1, 8, (cfg.mbs, 1), generator=gen, device=device)
        seq = (start + stride * steps) % cfg.vocab_size
        yield {
            "tokens": seq[:, :-1].contiguous(),
            "labels": seq[:, 1:].contiguous(),
            "position_ids": position_ids,
            "loss_mask": loss_mask,
        }


def _forward_step(data_iterator, model):
    """As pretrain_gpt.forward_step: (output, loss_func); the loss is (sum, tokens, {"lm loss": [sum, tokens]})."""
    import torch

    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    mask = batch["loss_mask"]

    def loss_func(output_tensor):
        losses = output_tensor.float().view(-1)
        m = mask.view(-1)
        loss = torch.sum(losses * m)
        num_tokens = m.sum().to(torch.int)
        report = torch.stack([loss.detach(), num_tokens.detach().float()])
        return loss, num_tokens, {"lm loss": report}

    return output, loss_func


def _cuda_mem(torch):
    return (
        torch.cuda.memory_allocated(),
        torch.cuda.max_memory_allocated(),
        torch.cuda.memory_reserved(),
        torch.cuda.max_memory_reserved(),
    )


def host_cpu(cpuinfo: str = "/proc/cpuinfo") -> str:
    """This machine's CPU as the header names it: the first ``model name`` of ``cpuinfo`` (Linux) and the CPUs this
    process may use, e.g. "Intel(R) Xeon(R) Platinum 8480C, 16 CPUs"; the platform's processor string elsewhere."""
    import platform

    model = ""
    try:
        with open(cpuinfo) as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model or platform.processor() or 'unknown CPU'}, {cpus} CPUs"


def optimizer_class(optimizer) -> str:
    """The class that steps the weights under Megatron's wrappers (a chained optimizer's first, a mixed-precision or
    distributed optimizer's inner one), by module and name: Transformer Engine's FusedAdam, Apex's, or torch's AdamW
    where neither imports (then Megatron-Core's multi-tensor helpers are Python loops, a host cost per tensor)."""
    inner = getattr(optimizer, "chained_optimizers", [optimizer])[0]
    inner = getattr(inner, "optimizer", inner)
    return f"{type(inner).__module__}.{type(inner).__qualname__}"


class _Phases:
    """Megatron-LM's level-1 timers (``--timing-log-level 1``): the wall time of each phase of an iteration between
    ``torch.cuda.synchronize()`` calls, summed over the log interval; does nothing when not ``enabled``."""

    def __init__(self, enabled: bool, torch) -> None:
        self.enabled, self._torch = enabled, torch
        self._sums: dict[str, float] = {}
        self._t = 0.0

    def start(self) -> None:
        if self.enabled:
            self._torch.cuda.synchronize()
            self._t = time.perf_counter()

    def stop(self, name: str) -> None:
        """Close the phase ``name`` and start the next one at once."""
        if self.enabled:
            self._torch.cuda.synchronize()
            now = time.perf_counter()
            self._sums[name] = self._sums.get(name, 0.0) + now - self._t
            self._t = now

    def pop(self, iterations: int) -> dict[str, float]:
        """Each phase's ms per iteration over the last ``iterations``, then start a new interval."""
        out = {k: v * 1000.0 / max(1, iterations) for k, v in self._sums.items()}
        self._sums = {}
        return out


def _print_header(cfg: RunConfig, rank: int, world: int, dp: int, device: str, pp_rank: int | None) -> None:
    """The run's header lines, as rank 0 prints them; ``pp_rank``: a fake rank's pipeline stage (None for a real
    run), whose probe line (which rank of the larger job this process is) follows the header."""
    for line in header_lines(cfg, world, dp, device, host_cpu()):
        _print(line)
    if pp_rank is not None:
        _print(probe_line(cfg, rank, world, pp_rank))
    _print("building GPT model ...")


def _hook_grad_sync(cfg: RunConfig, config, chunks) -> None:
    """With ``overlap_grad_reduce``, hand the schedule each model chunk's ``no_sync`` and ``start_grad_sync`` (one
    callable for one chunk, a list for the interleaved schedule's chunks), as Megatron-LM's training.py does."""
    if not cfg.overlap_grad_reduce:
        return
    no_sync = [c.no_sync for c in chunks]
    grad_sync = [c.start_grad_sync for c in chunks]
    config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    config.grad_sync_func = grad_sync[0] if len(grad_sync) == 1 else grad_sync


def _log_iteration(cfg: RunConfig, iteration: int, n: int, per_iter_s: float, world: int, flops: float, step) -> None:
    """Print the iteration line of the ``n`` iterations that end at ``iteration`` (``per_iter_s`` each) and, with
    the level-1 timers on, their block. ``step``: what the loop holds: ``optimizer``, ``averager`` (the losses since
    the last line), ``grad_norm``, ``skipped`` (iterations whose step was skipped) and ``phases``."""
    scale = step.optimizer.get_loss_scale()
    _print(
        format_iteration_line(
            iteration=iteration,
            train_iters=cfg.train_iters,
            consumed_samples=iteration * cfg.gbs,
            elapsed_ms=per_iter_s * 1000.0,
            tflops_per_gpu=flops / (per_iter_s * 1e12 * world),
            learning_rate=step.optimizer.param_groups[0]["lr"],
            global_batch_size=cfg.gbs,
            losses=step.averager.pop(),
            loss_scale=float(scale.item() if hasattr(scale, "item") else scale),
            grad_norm=None if step.grad_norm is None else float(step.grad_norm),
            skipped=step.skipped,
            nan=0,
        )
    )
    if step.phases.enabled:
        _print(format_timers(step.phases.pop(n)))


# house: over 80 lines (98): Megatron-LM's pretrain loop in its order (setup, schedule, step, log, memory report),
# which runs only on a GPU; what is left is the calls in that order and the loop's own state. What can live apart does,
# each tested on CPU: the header (_print_header), the gradient-sync hooks (_hook_grad_sync), the iteration line
# (_log_iteration), the level-1 timers (_Phases), the optimizer's name (optimizer_class), the lines' formats
# (config.py); the loop keeps only their calls
def train(cfg: RunConfig, fake: bool = False) -> int:
    """Run ``cfg`` to the end; print Megatron-LM's log lines; return the process exit status.

    ``fake``: run one rank of a larger job (:func:`_init_distributed`); that rank prints every line a real run
    prints on rank 0, the last rank and data-parallel rank 0 (header, iteration and memory lines), whichever
    stage it is; on a stage other than the last the iteration lines carry no loss."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    rank, world = _init_distributed(cfg, fake)
    dp = parallel_state.get_data_parallel_world_size()
    dp_rank = parallel_state.get_data_parallel_rank()
    num_micro = cfg.gbs // (cfg.mbs * dp)
    last_rank = world - 1
    if rank == 0 or fake:
        pp_rank = parallel_state.get_pipeline_model_parallel_rank() if fake else None
        _print_header(cfg, rank, world, dp, torch.cuda.get_device_name(), pp_rank)
    config = _transformer_config(cfg, fake)
    chunks = _build_model(cfg, config)
    optimizer, scheduler = _optimizer(cfg, chunks, fake)
    if rank == 0 or fake:
        _print(f"> recipes.mcore: optimizer {optimizer_class(optimizer)}")
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    _hook_grad_sync(cfg, config, chunks)

    iters = [_mock_batches(cfg, dp_rank) for _ in chunks]
    forward_backward = get_forward_backward_func()
    flops = model_flops_per_step(cfg)
    is_last_stage = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    averager = LossAverager()
    skipped_total = 0
    dist.barrier()
    if rank == 0 or fake:
        _print(
            f"[after model, optimizer, and learning rate scheduler are built] datetime: "
            f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')} "
        )
        _print("training ...")
    torch.cuda.synchronize()
    interval_start = time.perf_counter()
    phases = _Phases(cfg.timing_log_level > 0, torch)
    for iteration in range(1, cfg.train_iters + 1):
        for c in chunks:
            c.zero_grad_buffer()
        optimizer.zero_grad()
        phases.start()
        losses = forward_backward(
            forward_step_func=_forward_step,
            data_iterator=iters,
            model=chunks,
            num_microbatches=num_micro,
            seq_length=cfg.seq_length,
            micro_batch_size=cfg.mbs,
            decoder_seq_length=cfg.seq_length,
            forward_only=False,
        )
        phases.stop("forward-backward")
        ok, grad_norm, _zeros = optimizer.step()
        phases.stop("optimizer")
        if ok:
            scheduler.step(increment=cfg.gbs)
        else:
            skipped_total += 1
        if is_last_stage and losses:
            total = torch.stack([x["lm loss"] for x in losses]).sum(0)
            dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
            averager.add({"lm loss": (total[0] / total[1]).item()})
        if iteration % cfg.log_interval == 0 or iteration == cfg.train_iters:
            dist.barrier()
            torch.cuda.synchronize()
            now = time.perf_counter()
            n = iteration % cfg.log_interval or cfg.log_interval
            per_iter = (now - interval_start) / n
            if rank == last_rank or fake:
                held = SimpleNamespace(
                    optimizer=optimizer, averager=averager, grad_norm=grad_norm, skipped=skipped_total, phases=phases
                )
                _log_iteration(cfg, iteration, n, per_iter, world, flops, held)
                skipped_total = 0
            # As Megatron: memory after the first two logged iterations (optimizer state included from the
            # second), and at the end (its --log-memory-interval), by every rank of data-parallel rank 0.
            if (iteration in (cfg.log_interval, 2 * cfg.log_interval) or iteration == cfg.train_iters) and (
                dp_rank == 0 or fake
            ):
                _print(format_memory_line(rank, iteration, *_cuda_mem(torch)))
            dist.barrier()
            torch.cuda.synchronize()
            interval_start = time.perf_counter()
    dist.barrier()
    if rank == 0 or fake:
        _print(f"[after training is done] datetime: {datetime.now().strftime('%Y-%m-%d %H:%M:%S')} ")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # pragma: no cover - use python -m recipes.mcore
    sys.exit("run: python -m recipes.mcore --help")
