"""NeMo 2 recipe factories for the six dse models, registered with nemo-run as ``<model>_recipe``.

"Plan B" of ``shared/seeds``: every complex object (null tokenizer, callbacks, userbuffer config, FSDP
settings) is built here in Python, modelled on NVIDIA's ``scripts/performance/llm/pretrain_*.py`` and
``helpers.set_primary_perf_configs``, because nemo-run's CLI cannot pass such objects. The command line then
carries only parallel and batch knobs as dotted overrides, plus the few factory arguments below.

Runs inside the training container (or the test's NeMo environment) only: it imports NeMo and nemo-run.
"""

# No `from __future__ import annotations`: nemo-run parses factory arguments by their real (not string) types.
import inspect
import os

import fiddle as fdl
import nemo_run as run
from nemo.collections import llm
from nemo.lightning.pytorch.callbacks.garbage_collection import GarbageCollectionCallback
from nemo.lightning.pytorch.callbacks.megatron_comm_overlap import MegatronCommOverlapCallback
from nemo.utils.exp_manager import TimingCallback

from .spec import ENV_FLOPS, MODELS, TASKS, NemoModel

GC_INTERVAL = 100  # steps between Python garbage collections, as NeMo's performance recipes


def null_tokenizer(vocab_size: int) -> run.Config:
    """A NullTokenizer with the model's vocabulary, so mock data needs no tokenizer download."""
    try:  # NeMo 2.5+ moved the helper out of the (removed) nlp collection
        from nemo.collections.common.tokenizers.tokenizer_utils import get_nmt_tokenizer
    except ImportError:  # containers 24.12 - 25.07
        from nemo.collections.nlp.modules.common.tokenizer_utils import get_nmt_tokenizer
    return run.Config(get_nmt_tokenizer, library="null", model_name="NullTokenizer", vocab_size=vocab_size)


def flops_callback_class():
    """``FLOPsMeasurementCallback`` when the controller asked for it (``DSE_FLOPS_CALLBACK=1``) and NeMo has it.

    The callback exists in containers 25.04 and later; the controller knows the container version and sets the
    variable, and the import guard keeps an older container working when the variable is set by mistake.
    """
    if os.environ.get(ENV_FLOPS, "0") != "1":
        return None
    try:
        from nemo.lightning.pytorch.callbacks.flops_callback import FLOPsMeasurementCallback
    except ImportError:
        return None
    return FLOPsMeasurementCallback


def userbuffer_config(name: str) -> run.Config:
    """NeMo's tuned TP-overlap config ``name`` as a nemo-run Config (the dataclass itself does not serialise)."""
    import fiddle._src.experimental.dataclasses as fdl_dc
    from nemo.collections.llm.recipes.tp_overlap_configs import userbuffers

    cfg = getattr(userbuffers, name, None)
    if cfg is None:
        raise ValueError(f"NeMo has no userbuffer config {name!r} in tp_overlap_configs.userbuffers")
    return fdl.cast(run.Config, fdl_dc.convert_dataclasses_to_configs(cfg))


def _callback(recipe: run.Partial, cls) -> run.Config | None:
    for cb in recipe.trainer.callbacks or []:
        if getattr(cb, "__fn_or_cls__", None) is cls:
            return cb
    return None


def _ensure_callback(recipe: run.Partial, cls, **kwargs) -> run.Config:
    cb = _callback(recipe, cls)
    if cb is None:
        cb = run.Config(cls, **kwargs)
        recipe.trainer.callbacks.append(cb)
    return cb


def _base_recipe(model: NemoModel, task: str, peft_scheme: str) -> run.Partial:
    module = getattr(llm, model.module)
    if task == "pretrain":
        fn = getattr(module, "pretrain_recipe", None)
        if fn is None:  # NeMo 2 ships GPT-OSS for fine-tuning only
            raise ValueError(f"NeMo's {model.module} recipe module has no pretrain_recipe; use the mbridge payload")
        # not every pretrain recipe has performance_mode (Qwen3's MoE recipes have none)
        return fn(performance_mode=True) if "performance_mode" in inspect.signature(fn).parameters else fn()
    fn = module.finetune_recipe
    kwargs = {"peft_scheme": None if peft_scheme == "none" else peft_scheme}
    if "performance_mode" in inspect.signature(fn).parameters:  # not every finetune recipe has it
        kwargs["performance_mode"] = True
    return fn(**kwargs)


# house: the NeMo 2 recipe built step by step as NVIDIA's performance scripts build it, in their order
def build_recipe(
    model: NemoModel,
    task: str = "pretrain",
    *,
    tp_comm_overlap: bool = False,
    tp_comm_overlap_cfg: str | None = None,
    fsdp: bool = False,
    attention_backend: str = "auto",
    peft_scheme: str = "lora",
) -> run.Partial:
    """The NeMo 2 recipe of ``model`` for ``task`` ("pretrain" or "finetune"), tuned as NVIDIA's performance scripts.

    ``tp_comm_overlap`` switches on userbuffer TP overlap, with NeMo's tuned config ``tp_comm_overlap_cfg`` (a
    name in ``tp_overlap_configs.userbuffers``) or Transformer Engine's defaults when None. ``fsdp`` selects
    Megatron FSDP with the settings of NVIDIA's ``set_mcore_fsdp_configs``. ``attention_backend`` is a name of
    Megatron-Core's ``AttnBackend`` (set here because nemo-run's CLI cannot parse an enum-typed override; "auto"
    leaves the recipe's own). ``peft_scheme`` applies to finetune.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; one of {', '.join(TASKS)}")
    recipe = _base_recipe(model, task, peft_scheme)
    # One callback per class: some NeMo finetune recipes add a second TimingCallback.
    seen: set = set()
    recipe.trainer.callbacks = [
        cb for cb in recipe.trainer.callbacks or [] if not (cb.__fn_or_cls__ in seen or seen.add(cb.__fn_or_cls__))
    ]

    # Mock data with a null tokenizer of the real vocabulary: no download, the real embedding/output size.
    if task == "pretrain":
        recipe.data.tokenizer = null_tokenizer(model.vocab_size)
        recipe.model.tokenizer = recipe.data.tokenizer

    # Measurement runs: no validation, no checkpoints, no TensorBoard (it costs step time), a log line per step.
    recipe.trainer.limit_val_batches = 0
    recipe.trainer.log_every_n_steps = 1
    recipe.trainer.enable_checkpointing = False
    recipe.log.ckpt = None
    recipe.log.tensorboard = None
    recipe.trainer.logger = False

    _ensure_callback(recipe, TimingCallback)
    if model.moe_experimental:  # NVIDIA's pretrain_deepseek_v3.py: MLA's fused rope is an experimental feature
        from nemo.lightning.pytorch.callbacks.megatron_enable_experimental_callback import (
            MegatronEnableExperimentalCallback,
        )

        _ensure_callback(recipe, MegatronEnableExperimentalCallback)
    _ensure_callback(recipe, GarbageCollectionCallback, gc_interval_train=GC_INTERVAL, gc_interval_val=GC_INTERVAL)
    overlap = _ensure_callback(recipe, MegatronCommOverlapCallback)
    overlap.tp_comm_overlap = bool(tp_comm_overlap)
    overlap.tp_comm_overlap_cfg = (
        userbuffer_config(tp_comm_overlap_cfg) if tp_comm_overlap and tp_comm_overlap_cfg else None
    )

    flops = flops_callback_class() if task == "pretrain" else None
    if flops is not None:
        # Shares the model and data Configs, so later dotted overrides (seq_length, gbs) reach it too.
        recipe.trainer.callbacks.append(
            run.Config(flops, model_config=recipe.model.config, data_config=recipe.data, model_name=model.flops_name)
        )

    # Transformer Engine's fused cross entropy, as NeMo's performance scripts set it (set_perf_optimization_configs
    # since 25.07): the recipes' GPTConfig leaves Megatron-Core's own fused loss ("native"), which streams an fp32 copy
    # of the logits (dse.perfmodel.stack.cross_entropy_bytes: 36 bytes per logit against 16, and 6 at the peak, not 2)
    recipe.model.config.cross_entropy_fusion_impl = "te"

    if attention_backend != "auto":
        from megatron.core.transformer.enums import AttnBackend

        try:
            recipe.model.config.attention_backend = AttnBackend[attention_backend]
        except KeyError:
            raise ValueError(
                f"unknown attention_backend {attention_backend!r}; one of {', '.join(b.name for b in AttnBackend)}"
            ) from None

    ddp = recipe.trainer.strategy.ddp
    if not isinstance(ddp, str):  # gradient checks cost time and are for debugging (set_perf_optimization_configs)
        ddp.check_for_nan_in_grad = False
        ddp.check_for_large_grads = False

    if fsdp:  # NVIDIA's set_mcore_fsdp_configs
        recipe.model.config.init_model_with_meta_device = True
        recipe.trainer.strategy.fsdp = "megatron"
        ddp.data_parallel_sharding_strategy = "optim_grads_params"
        ddp.average_in_collective = False
        recipe.model.config.gradient_accumulation_fusion = False
        if getattr(overlap, "defer_embedding_wgrad_compute", None):
            overlap.defer_embedding_wgrad_compute = False  # cannot work together with FSDP
    return recipe


def _make_factory(model: NemoModel, task: str):
    """A function with a plain signature that nemo-run can parse (``--factory "m_recipe(fsdp=True)"``).

    No parameter name starts with ``run``, ``executor`` or ``plugins``: nemo-run 0.11 takes such words for its
    own options.
    """

    def factory(
        tp_comm_overlap: bool = False,
        tp_comm_overlap_cfg: str | None = None,
        fsdp: bool = False,
        attention_backend: str = "auto",
        peft_scheme: str = "lora",
    ) -> run.Partial:
        return build_recipe(
            model,
            task,
            tp_comm_overlap=tp_comm_overlap,
            tp_comm_overlap_cfg=tp_comm_overlap_cfg,
            fsdp=fsdp,
            attention_backend=attention_backend,
            peft_scheme=peft_scheme,
        )

    factory.__name__ = factory.__qualname__ = model.factory
    factory.__module__ = __name__
    factory.__doc__ = f"{task.capitalize()} recipe for {model.name} (NeMo module {model.module}), performance settings."
    return factory


_REGISTERED: dict[tuple[str, str], object] = {}


def register() -> dict[tuple[str, str], object]:
    """Register every factory with nemo-run for ``llm.pretrain`` and ``llm.finetune``; idempotent.

    Called by the entry point rather than at import, so importing this module has no side effect.
    """
    if not _REGISTERED:
        for task, target in (("pretrain", llm.pretrain), ("finetune", llm.finetune)):
            for model in MODELS.values():
                fn = _make_factory(model, task)
                _REGISTERED[(task, model.factory)] = run.cli.factory(target=target, name=model.factory)(fn)
    return _REGISTERED
