"""What a payload's training code does that no knob says: its loss, its FP8 weights and gradients, its gradient
accumulation, and whether it runs the architecture's own activation and dropout.

The knobs say *what* runs (precision, recipe, layout); these choices, which move the peak by gigabytes or the
step time by percents, are made by the payload's own code and differ between the payloads dse drives:

* **the loss.** Megatron-Bridge's Llama providers set ``cross_entropy_loss_fusion=True`` with
  ``cross_entropy_fusion_impl="te"``: Transformer Engine's parallel cross entropy reads the bf16 logits and
  writes their gradient in place (2 bytes per logit at the last stage's peak; ``Params.logits_bytes``);
  recipes.nemo2 sets the same, as NeMo's performance scripts do. Without that impl, ``cross_entropy_loss_fusion``
  runs Megatron-Core's own fused loss (``native_fused``), which older containers ran (PUBLISHED_STACKS).
  ``recipes.mcore`` leaves the fusion off, so ``GPTModel.compute_language_model_loss`` calls
  ``tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels)``: an fp32 copy beside the bf16
  logits (2 + 4 = 6 bytes; ``Params.logits_bytes_native``). The 70B-width TE study's out-of-memory trial
  died allocating the logits, and with 6 the model calls it (docs/payloads.md, "The first H200 studies on the
  TE stack"). recipes.mcore could switch TE's fused loss on when TE imports (``cross_entropy_loss_fusion=True,
  cross_entropy_fusion_impl="te"`` in its TransformerConfig, as Bridge does); that is not done here because it
  was not measured on a GPU.
* **FP8 weights.** NeMo's and Bridge's FP8 precision recipes (``bf16_with_fp8_*_mixed`` in
  ``nemo.collections.llm.recipes.precision.mixed_precision`` and ``megatron.bridge.training.mixed_precision``)
  set ``fp8_param_gather=True``: the model is built under TE's ``fp8_model_init``, each linear weight *is* an
  FP8 tensor (1 byte, plus the 1-byte transpose TE makes for the Hopper dgrad/wgrad GEMMs, which only take
  the TN layout, and none on Blackwell, whose FP8 GEMMs take any layout; MXFP8 keeps two copies everywhere):
  :func:`dse.perfmodel.memory.resident_weight_bytes`. Without it (recipes.mcore) the
  weights stay bf16 and Transformer Engine keeps a quantised copy of each linear weight for the whole step:
  ``TransformerEngineBaseModule.get_weight_workspace(..., cache_name="weight", update_workspace=
  is_first_microbatch)`` in ``transformer_engine/pytorch/module/{linear,layernorm_linear,layernorm_mlp}.py``
  caches the FP8 weight with row-wise and column-wise (transposed) data, and Megatron-Core's TE wrappers
  (``megatron/core/extensions/transformer_engine.py``: ``is_first_microbatch`` passed unless
  ``disable_parameter_transpose_cache``, default False) ask for that cache: 2 more bytes per linear weight
  element (:func:`fp8_weight_cache_bytes`). The output layer is Megatron's own ColumnParallelLinear, never
  FP8, and has no cache.
* **FP8 gradients.** NVIDIA's FP8 performance recipes reduce gradients in bf16 (``grad_reduce_in_fp32=False``,
  2 bytes per parameter); recipes.mcore's DistributedDataParallelConfig keeps ``grad_reduce_in_fp32=True``
  whatever the precision (4 bytes). In bf16 the recipes dse writes keep fp32 gradients (Megatron's default), but
  Megatron-Bridge's performance scripts reduce them in bf16 whatever the precision (each model family's
  ``set_*_common_configs`` in ``scripts/performance/configs/``, from v0.2.1: ``cfg.ddp.grad_reduce_in_fp32 =
  False``), as does NeMo 2's Mixtral performance mode (``recipe.trainer.plugins.grad_reduce_in_fp32 = False``):
  the published stacks ``published:<cross_entropy>:bf16-grads`` (:func:`published_stack_name`).
* **master weights.** NeMo 1's ``distributed_fused_adam`` over a bf16 model (the NeMo launcher's recipes, as the DGX
  Cloud benchmarking recipes ran them) keeps the fp32 master weight as its low 16 bits beside the bf16 weight
  (``store_param_remainders=True``): 2 bytes per parameter in the optimizer shard instead of 4
  (``Stack.master_param_bytes``; the published stacks ``...:remainders``).
* **gradient accumulation.** NVIDIA's recipes set ``gradient_accumulation_fusion=True``: the weight-gradient
  GEMMs accumulate into the fp32 gradient buffer. recipes.mcore turns it off (Megatron's output layer would need
  Apex's fused_weight_gradient_mlp_cuda), so each micro-batch writes every weight gradient (the routed experts' too)
  as a bf16 tensor that Megatron's DDP hook then adds to the buffer: a memory-bound pass over all parameters per
  micro-batch (``time.grad_accumulation_s`` of the prediction).
* **the architecture's activation and dropout.** NeMo 2's and Bridge's model providers run what the architecture
  says (``recipes.models.ModelArch.activation``: Nemotron's eager squared ReLU; ``ModelArch.dropout``), time terms
  of dse.perfmodel.model (``SQUARED_RELU_EXTRA_BYTES``, ``HIDDEN_DROPOUT_BYTES``, unfused attention's score bytes);
  recipes.mcore runs ``F.silu`` / ``F.gelu`` and sets both dropouts to 0 whatever the arch.
* **the optimizer.** NVIDIA's containers step with Transformer Engine's FusedAdam (``Stack.optimizer_bytes``, 36
  bytes per parameter); recipes.mcore with megatron-core alone (no Transformer Engine, no Apex) steps with torch's
  AdamW, 3.5-3.7 times as long measured (:data:`TORCH_ADAMW_BYTES`), the stack ``mcore:torch-adamw``
  (:data:`PAYLOAD_VARIANTS`) that the benches and ``dse calibrate`` read from a TSV's ``payload`` column. A study of
  the ``mcore`` payload is priced with the fused Adam of NVIDIA's containers, where the payload runs; where it runs
  without Transformer Engine, its refit's ``step_overhead_s`` takes the difference.
* **CUDA graphs are a knob, not a stack fact.** Whether a step is captured in CUDA graphs is a choice every
  payload that can run graphs offers (Bridge's ``model.cuda_graph_impl`` / ``cuda_graph_scope``, NeMo 2's
  ``model.config.enable_cuda_graph``), so it is the catalogue's ``cuda_graph`` and ``cuda_graph_scope``
  (dse.facts.knobs), priced by the model's host-time term (``Params.host_layer_s_grace`` for the share of a layer the
  scope leaves outside the graph) and memory (static buffers, the graph pool); published rows carry them as the
  script of each row's container set them (the tables' ``cuda_graph`` and ``cuda_graph_scope`` columns).

Decision: the payload is recorded on the trial (:attr:`dse.rules.trial.TrialConfig.payload`, from the space's
``[backend] payload``) and this table says what each one does; no new knob, because none of these is a choice
dse offers: they are facts about a payload's code. ``tests/test_perfmodel_stack.py`` reads recipes/mcore's
source so that the table cannot drift from it silently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal


@dataclass(frozen=True)
class Stack:
    """The choices of one payload's training code that move its memory or its time (see the module docstring)."""

    # TE's in-place fused loss; Megatron-Core's own fused one (cross_entropy_loss_fusion with the "native" impl);
    # or Megatron's unfused fp32 loss (cross_entropy_bytes)
    cross_entropy: Literal["te", "native_fused", "native"] = "te"
    fp8_param_gather: bool = True  # FP8 runs keep the linear weights as FP8 tensors (no bf16 weight + FP8 cache)
    fp8_grad_reduce_in_fp32: bool = False  # FP8 runs keep fp32 gradient buffers (True) or bf16 ones
    bf16_grad_reduce_in_fp32: bool = True  # bf16 runs keep fp32 gradient buffers (True) or bf16 ones
    grad_accumulation_fusion: bool = True  # the wgrad GEMMs accumulate into the gradient buffer (no extra pass)
    # the payload runs the architecture's own activation (ModelArch.activation: Nemotron's eager squared ReLU
    # in NeMo 2 and Megatron-Bridge); recipes.mcore runs F.silu when gated and F.gelu otherwise, whatever the arch
    arch_activation: bool = True
    # the payload trains with the architecture's dropout (ModelArch.dropout); recipes.mcore sets hidden_dropout and
    # attention_dropout to 0 whatever the arch
    arch_dropout: bool = True
    # bytes per parameter of the fp32 master weight in the optimizer shard: 4, or 2 where the optimizer keeps only the
    # low 16 bits beside the bf16 weight (NeMo 1's distributed_fused_adam: MegatronBaseModel.setup_optimization sets
    # store_param_remainders=True for an fp32 optimizer over a bf16 model; Megatron-Core's OptimizerConfig has the
    # same switch for its precision-aware optimizer)
    master_param_bytes: float = 4.0
    # GiB the payload's processes hold outside PyTorch's caching allocator beyond the model's reserve
    # (Params.memory_reserve_gib, 3 GiB: the CUDA context, NCCL's and the libraries' workspaces), where it was measured
    outside_extra_gib: float = 0.0
    # HBM bytes per parameter of the optimizer step (dse.perfmodel.model.optimizer_time): a fused Adam (Transformer
    # Engine's or Apex's FusedAdam, what NVIDIA's containers run) reads and writes each fp32 weight, gradient and moment
    # once, with the gradient norm, the clip and the bf16 weight copy beside it
    optimizer_bytes: float = 36.0


# What recipes.mcore's real runs hold outside PyTorch's caching allocator (GiB): at every out-of-memory end PyTorch
# reports what the process has in use and what its allocator reserved, and the difference was 8.8-8.9 GiB on one
# H100 (bench/data/h100_mcore_grid, local layer spec, 4 runs) and 8.9 GiB on one H200 (bench/data/
# h200_te_70b_4l_study, Transformer Engine's spec), against 0.7 GiB in the probes of the same points
# (bench/data/h100_mcore_grid/probes: the same code on PyTorch's fake process group): the rest is NCCL's, the
# communicators of Megatron-Core's process groups, which torchrun's NCCL group creates at start. The model counts it
# as the stack's reserve (its 3 GiB and the difference: Stack.outside_extra_gib).
MCORE_OUTSIDE_ALLOCATOR_GIB = 8.9

# What recipes.mcore's optimizer step moves per parameter where neither Transformer Engine nor Apex imports
# (megatron-core alone): Megatron-Core falls back to torch's AdamW (``megatron/core/optimizer/__init__.py``: "Falling back
# to Torch optimizers"), whose foreach implementation makes a pass per operation (decay, first moment, second moment in
# two, its square root, the bias correction, epsilon, the update: 80 bytes per parameter), and to its own Python
# multi-tensor helpers for the gradient norm (a norm per tensor, 4 bytes) and the clip (``dst.copy_(src * scale)``, 16)
# beside the bf16 weight copy (6): 106 bytes by that count. Measured with the payload's level-1 timers
# (``--timing-log-level 1``) on one H100 (bench/moe_gpu_runs.py, the ``_timers_h100`` and ``_i30_h100`` runs): the
# optimizer phase took 55-71 ms a step for the small MoE (1.3 G parameters) and 16-17 ms for its dense twin, 3.5-3.7
# times the fused count of 36 bytes, so 128 bytes per parameter; the count's remainder is the helpers' Python loops
# over the tensors (a sync per tensor in the norm).
TORCH_ADAMW_BYTES = 128.0

# NeMo 2 and Megatron-Bridge: NVIDIA's recipes as dse spells them (dse.facts.knobs NEMO2_PRECISION / MBRIDGE_PRECISION
# set fp8_param_gather=true for delayed, tensorwise and mxfp8). The sim payload describes the same recipes
# (it writes the model's own figures). Blockwise sets fp8_param_gather=false there; it runs on Blackwell only,
# where no measurement has checked the cache, so it keeps the recipes' common value here.
NVIDIA_RECIPES = Stack()
STACKS: dict[str, Stack] = {
    "nemo2": NVIDIA_RECIPES,
    "mbridge": NVIDIA_RECIPES,
    "sim": NVIDIA_RECIPES,
    # recipes/mcore/train.py: no cross_entropy_loss_fusion, no fp8_param_gather, grad_reduce_in_fp32=True,
    # gradient_accumulation_fusion=False, its own activation (F.silu / F.gelu) and no dropout
    "mcore": Stack(
        cross_entropy="native",
        fp8_param_gather=False,
        fp8_grad_reduce_in_fp32=True,
        grad_accumulation_fusion=False,
        arch_activation=False,
        arch_dropout=False,
        outside_extra_gib=MCORE_OUTSIDE_ALLOCATOR_GIB - 3.0,
    ),
}


# A payload run as it was installed rather than as NVIDIA's container installs it, by the name
# ``<payload>:<variant>`` (a trial's payload field may carry it): recipes.mcore with megatron-core alone, whose
# optimizer is torch's AdamW (TORCH_ADAMW_BYTES). Its header says which ran (``> recipes.mcore: optimizer ...``);
# in NVIDIA's containers Transformer Engine imports and the plain ``mcore`` stack (a fused Adam) holds.
PAYLOAD_VARIANTS: dict[str, Stack] = {
    "mcore:torch-adamw": replace(STACKS["mcore"], optimizer_bytes=TORCH_ADAMW_BYTES),
}


# The stacks of published measurements that dse does not drive (bench/model_accuracy.py, bench/model_heldout.py):
# NVIDIA's recipes with the loss that the measurement's container ran (the tables' cross_entropy column), named
# "published:<cross_entropy>" so that a trial's payload field can carry one. Their CUDA graphs are knobs
# (cuda_graph, cuda_graph_scope), read from the tables' columns of those names.
def published_stack_name(cross_entropy: str, bf16_grads: bool = False, param_remainders: bool = False) -> str:
    """The name of the published stack that ran ``cross_entropy`` (a key of :data:`PUBLISHED_STACKS`), with
    gradients reduced in bf16 in bf16 runs too where ``bf16_grads`` (the performance scripts of the module
    docstring's "FP8 gradients"), and the master weights kept as 16-bit remainders where ``param_remainders``
    (:attr:`Stack.master_param_bytes`: NeMo 1's distributed_fused_adam)."""
    return (
        f"published:{cross_entropy}"
        + (":bf16-grads" if bf16_grads else "")
        + (":remainders" if param_remainders else "")
    )


PUBLISHED_STACKS: dict[str, Stack] = {
    published_stack_name(ce, g, r): Stack(
        cross_entropy=ce, bf16_grad_reduce_in_fp32=not g, master_param_bytes=2.0 if r else 4.0
    )
    for ce in ("te", "native_fused", "native")
    for g in (False, True)
    for r in (False, True)
}


def payload_stack(payload: str | None) -> Stack:
    """The :class:`Stack` of a payload name, a payload's variant (:data:`PAYLOAD_VARIANTS`) or a published stack's
    name (NVIDIA's recipes for an unknown or missing one)."""
    name = payload or ""
    return STACKS.get(name) or PAYLOAD_VARIANTS.get(name) or PUBLISHED_STACKS.get(name, NVIDIA_RECIPES)


def fp8_weight_cache_bytes(fp8: bool, stack: Stack) -> float:
    """Bytes per linear-layer weight element that Transformer Engine's FP8 weight cache adds: the FP8 copy and
    its transpose (1 + 1) when the weights are bf16 (no ``fp8_param_gather``); 0 otherwise."""
    return 2.0 if fp8 and not stack.fp8_param_gather else 0.0


def logits_peak_bytes(stack: Stack, params) -> float:
    """Bytes per logit element on the last stage at its peak (a :class:`dse.perfmodel.timing.Params` gives them):
    TE's in-place loss keeps the bf16 logits (``logits_bytes``); Megatron's native losses, fused or not, keep an
    fp32 copy or softmax beside them (``logits_bytes_native``)."""
    return params.logits_bytes if stack.cross_entropy == "te" else params.logits_bytes_native


def cross_entropy_bytes(stack: Stack) -> float:
    """HBM bytes per logit element of the loss, forward + backward (the model scales them by elementwise_scale).

    ``te``: 16, the model's long-standing count for a fused loss (Transformer Engine's parallel cross entropy reads
    the bf16 logits and writes the gradient in place). ``native_fused``: Megatron-Core's
    ``fused_vocab_parallel_cross_entropy`` (megatron/core/fusions/fused_cross_entropy.py, what
    ``cross_entropy_loss_fusion=True`` ran before ``cross_entropy_fusion_impl="te"`` existed, and its default since):
    the same steps in jit-fused kernels on the fp32 copy: ``.float()`` with the max (read 2, write 4), the in-place
    subtraction with ``exp`` and the sum (8), the division into the softmax (8); backward the in-place
    multiplication by the incoming gradient (8) and the cast to bf16 (6): 36. ``native``: Megatron's
    ``_VocabParallelCrossEntropy`` (megatron/core/tensor_parallel/cross_entropy.py) step by step on an fp32
    copy: ``.float()`` (read 2, write 4), max over the vocabulary (4), in-place subtraction of the max (8), ``exp`` (8), the sum (4), the in-place
    division into the softmax it saves (8); backward the in-place ``mul_`` by the incoming gradient (8) and the
    cast of the gradient back to bf16 (6): 52.
    """
    return {"te": 16.0, "native_fused": 36.0, "native": 52.0}[stack.cross_entropy]
