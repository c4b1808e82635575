"""How the catalogue spells trials for each payload: hand-written expected command lines (no NeMo needed)."""

from __future__ import annotations

import pytest

from dse.errors import UserError
from dse.facts import knobs
from dse.recipes.models import RECIPES
from dse.recipes.nemo2 import userbuffers

BASE = {
    "tp": 1,
    "pp": 1,
    "vp": 1,
    "cp": 2,
    "ep": 1,
    "sp": None,
    "mbs": 1,
    "gbs": 128,
    "seq_length": 8192,
    "recompute": "none",
    "recompute_num_layers": 0,
    "precision": "bf16",
    "fp8_recipe": "tensorwise",
    "fsdp": False,
    "tp_comm_overlap": False,
    "num_nodes": 1,
    "max_steps": 50,
}


def test_nemo2_llama3_8b_bf16_defaults():
    assert knobs.overrides(BASE, "nemo2") == [
        "trainer.strategy.tensor_model_parallel_size=1",
        "trainer.strategy.pipeline_model_parallel_size=1",
        "trainer.strategy.virtual_pipeline_model_parallel_size=null",
        "trainer.strategy.context_parallel_size=2",
        "trainer.strategy.expert_model_parallel_size=1",
        "trainer.strategy.sequence_parallel=false",
        "data.micro_batch_size=1",
        "data.global_batch_size=128",
        "data.seq_length=8192",
        "model.config.seq_length=8192",
        "model.config.recompute_granularity=null",
        "model.config.recompute_method=null",
        "model.config.recompute_num_layers=null",
        "trainer.num_nodes=1",
        "trainer.max_steps=50",
    ]


def test_nemo2_fp8_tensorwise_full_recompute_interleaved():
    v = dict(
        BASE,
        tp=4,
        pp=4,
        vp=5,
        cp=1,
        recompute="full",
        recompute_num_layers=2,
        precision="fp8",
        fp8_recipe="tensorwise",
        num_nodes=8,
    )
    assert knobs.overrides(v, "nemo2") == [
        "trainer.strategy.tensor_model_parallel_size=4",
        "trainer.strategy.pipeline_model_parallel_size=4",
        "trainer.strategy.virtual_pipeline_model_parallel_size=5",
        "trainer.strategy.context_parallel_size=1",
        "trainer.strategy.expert_model_parallel_size=1",
        "trainer.strategy.sequence_parallel=true",
        "data.micro_batch_size=1",
        "data.global_batch_size=128",
        "data.seq_length=8192",
        "model.config.seq_length=8192",
        "model.config.recompute_granularity=full",
        "model.config.recompute_method=block",
        "model.config.recompute_num_layers=2",
        "trainer.plugins.fp8=hybrid",
        "trainer.plugins.fp8_recipe=tensorwise",
        "trainer.plugins.first_last_layers_bf16=false",
        "trainer.plugins.fp8_param_gather=true",
        "trainer.num_nodes=8",
        "trainer.max_steps=50",
    ]


@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        (
            "delayed",
            [
                "trainer.plugins.fp8=hybrid",
                "trainer.plugins.fp8_recipe=delayed",
                "trainer.plugins.fp8_margin=0",
                "trainer.plugins.fp8_amax_history_len=1024",
                "trainer.plugins.fp8_amax_compute_algo=max",
                "trainer.plugins.fp8_param_gather=true",
            ],
        ),
        (
            "mxfp8",
            [
                "trainer.plugins.fp8=e4m3",
                "trainer.plugins.fp8_recipe=mxfp8",
                "trainer.plugins.fp8_param_gather=true",
                "trainer.plugins.reuse_grad_buf_for_mxfp8_param_ag=true",
            ],
        ),
        (
            "blockwise",
            [
                "trainer.plugins.fp8=hybrid",
                "trainer.plugins.fp8_recipe=blockwise",
                "trainer.plugins.fp8_param_gather=false",
            ],
        ),
    ],
)
def test_nemo2_fp8_recipes(recipe, expected):
    assert knobs.overrides({"precision": "fp8", "fp8_recipe": recipe}, "nemo2") == expected


def test_fp8_recipe_is_ignored_under_bf16():
    assert knobs.overrides({"precision": "bf16", "fp8_recipe": "mxfp8"}, "nemo2") == []  # the factory's bf16_mixed
    assert knobs.overrides({"fp8_recipe": "delayed", "precision": "bf16"}, "mbridge") == ["mixed_precision=bf16_mixed"]


def test_recompute_full_of_every_layer_and_selective():
    assert knobs.overrides({"recompute": "full", "recompute_num_layers": 0}, "nemo2") == [
        "model.config.recompute_granularity=full",
        "model.config.recompute_method=uniform",
        "model.config.recompute_num_layers=1",
    ]
    assert knobs.overrides({"recompute_num_layers": 0, "recompute": "selective"}, "mbridge") == [
        "model.recompute_granularity=selective",
        "model.recompute_method=null",
        "model.recompute_num_layers=null",
    ]


def test_cpu_offload_on_names_activations_only_and_off_is_explicit():
    assert knobs.overrides({"cpu_offload_layers": 40}, "mbridge") == [
        "model.cpu_offloading=true",
        "model.cpu_offloading_num_layers=40",
        "model.cpu_offloading_activations=true",
        "model.cpu_offloading_weights=false",
    ]
    assert knobs.overrides({"cpu_offload_layers": 0}, "nemo2") == [
        "model.config.cpu_offloading=false",
        "model.config.cpu_offloading_num_layers=0",
    ]
    with pytest.raises(UserError, match="must be >= 0"):
        knobs.get("cpu_offload_layers").coerce(-1)


def test_sp_explicit_value_wins_and_unknown_tp_leaves_it_to_the_payload():
    assert knobs.overrides({"tp": 2, "sp": False}, "nemo2")[-1] == "trainer.strategy.sequence_parallel=false"
    assert knobs.overrides({"sp": None}, "nemo2") == []


def test_mbridge_llama3_70b_fp8_fsdp():
    v = dict(BASE, tp=2, pp=1, cp=1, precision="fp8", fp8_recipe="mxfp8", fsdp=True, max_steps=30)
    assert knobs.overrides(v, "mbridge") == [
        "model.tensor_model_parallel_size=2",
        "model.pipeline_model_parallel_size=1",
        "model.virtual_pipeline_model_parallel_size=null",
        "model.context_parallel_size=1",
        "model.expert_model_parallel_size=1",
        "model.sequence_parallel=true",
        "train.micro_batch_size=1",
        "train.global_batch_size=128",
        "model.seq_length=8192",
        "dataset.sequence_length=8192",
        "model.recompute_granularity=null",
        "model.recompute_method=null",
        "model.recompute_num_layers=null",
        "mixed_precision=bf16_with_mxfp8_mixed",
        "ddp.use_megatron_fsdp=true",
        "ddp.data_parallel_sharding_strategy=optim_grads_params",
        "ddp.average_in_collective=false",
        "model.init_model_with_meta_device=true",
        "optimizer.use_precision_aware_optimizer=false",
        "comm_overlap.tp_comm_overlap=false",
        "train.train_iters=30",
        "scheduler.lr_decay_iters=30",
        "scheduler.lr_warmup_iters=10",
    ]


def test_mbridge_short_run_has_no_warmup_longer_than_the_run():
    assert knobs.overrides({"max_steps": 5}, "mbridge") == [
        "train.train_iters=5",
        "scheduler.lr_decay_iters=5",
        "scheduler.lr_warmup_iters=0",
    ]


def test_sim_takes_the_nemo2_spelling():
    assert knobs.overrides(BASE, "sim") == knobs.overrides(BASE, "nemo2")


def test_unknown_flavour_is_a_user_error():
    with pytest.raises(UserError, match="unknown payload flavour 'megatron'"):
        knobs.overrides(BASE, "megatron")


def test_factory_args_only_for_non_defaults_and_userbuffer_by_gpu():
    assert knobs.factory_args(BASE, gpu="h100", hidden_size=4096) == {}
    v = dict(BASE, tp=4, precision="fp8", tp_comm_overlap=True)
    assert knobs.factory_args(v, gpu="h200", hidden_size=8192) == {
        "tp_comm_overlap": True,
        "tp_comm_overlap_cfg": "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192",
    }
    # B200 has no tuned config for tp 4 at width 8192: Transformer Engine's defaults, no name
    assert knobs.factory_args(v, gpu="b200", hidden_size=8192) == {"tp_comm_overlap": True}
    assert knobs.factory_args(dict(BASE, fsdp=True), gpu="gb200", hidden_size=8192) == {"fsdp": True}


def test_factory_call_is_nemo_run_syntax():
    assert knobs.factory_call("llama3_8b_recipe", {}) == "llama3_8b_recipe"
    assert (
        knobs.factory_call("llama3_70b_recipe", {"tp_comm_overlap": True, "tp_comm_overlap_cfg": "ub_x"})
        == 'llama3_70b_recipe(tp_comm_overlap=True,tp_comm_overlap_cfg="ub_x")'
    )


def test_payload_args_nemo2_scaled_reproducer():
    v = dict(BASE, tp=4, pp=2, vp=2, cp=1, gbs=64, precision="fp8", tp_comm_overlap=True, num_nodes=2)
    argv = knobs.payload_args("nemo2", RECIPES["llama3_70b_16l"], v, gpu="h100", gpus_per_node=8)
    assert argv[:3] == (
        "--factory",
        'llama3_70b_recipe(tp_comm_overlap=True,tp_comm_overlap_cfg="userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192")',
        "-y",
    )
    assert argv[3:-4] == tuple(knobs.overrides(v, "nemo2"))
    # 16 layers divide by pp*vp = 4: embedding and loss are not counted as layers (said explicitly)
    assert argv[-4:] == (
        "trainer.strategy.account_for_embedding_in_pipeline_split=false",
        "trainer.strategy.account_for_loss_in_pipeline_split=false",
        "trainer.devices=8",
        "model.config.num_layers=16",
    )


def test_payload_args_nemo2_full_model_has_no_layer_override():
    argv = knobs.payload_args("nemo2", RECIPES["nemotron4_15b"], BASE, gpu="gb200", gpus_per_node=4)
    assert argv[:3] == ("--factory", "nemotron4_15b_recipe", "-y")
    assert argv[-1] == "trainer.devices=4"
    assert not any(a.startswith("model.config.num_layers=") for a in argv)


def test_payload_args_mbridge():
    v = dict(BASE, tp=8, pp=8, vp=2, cp=2, tp_comm_overlap=True)
    argv = knobs.payload_args("mbridge", RECIPES["llama3_405b_8l"], v, gpu="h100", gpus_per_node=8)
    assert argv[:4] == (
        "--recipe",
        "llama3_405b_pretrain_config",
        "--tp-comm-overlap-cfg",
        "userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192",
    )
    assert argv[4:-3] == tuple(knobs.overrides(v, "mbridge"))
    assert argv[-3:] == (
        "model.account_for_embedding_in_pipeline_split=false",
        "model.account_for_loss_in_pipeline_split=false",
        "model.num_layers=8",
    )


@pytest.mark.parametrize(
    "recipe, pp, vp, on",
    [
        ("llama3_405b", 8, 8, True),  # 126 + 2 = 128 = 8 * 8 * 2: NVIDIA's layout
        ("llama3_405b", 16, 4, True),
        ("llama3_405b", 2, 1, False),  # 126 divides by 2
        ("llama3_405b", 1, 1, False),
        ("llama3_70b", 4, 5, False),
    ],
)
def test_pipeline_split_counts_embedding_and_loss_only_when_that_evens_it(recipe, pp, vp, on):
    word = "true" if on else "false"
    for flavour, prefix in (("nemo2", "trainer.strategy."), ("mbridge", "model.")):
        assert knobs.pipeline_split_overrides(RECIPES[recipe].arch.num_layers, {"pp": pp, "vp": vp}, flavour) == [
            f"{prefix}account_for_embedding_in_pipeline_split={word}",
            f"{prefix}account_for_loss_in_pipeline_split={word}",
        ]


def test_payload_args_mbridge_refuses_nemotron():
    with pytest.raises(UserError, match="no Megatron-Bridge recipe"):
        knobs.payload_args("mbridge", RECIPES["nemotron4_340b"], BASE, gpu="h100", gpus_per_node=8)


def test_userbuffer_lookup():
    from dse.facts.hardware import userbuffer_config

    assert userbuffer_config("gb300", "bf16", 18432, 8) == "userbuffers_bf16_b200_h18432_tp8_mbs1_seqlen4096"
    assert userbuffer_config("h200", "fp8", 8192, 4) == "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"
    assert userbuffer_config("h100", "bf16", 18432, 8) is None
    assert userbuffer_config("a100", "bf16", 8192, 4) is None
    assert all(
        name.startswith(f"userbuffers_{p}_{fam}_h{h}_tp{tp}_")
        for (fam, p, h, tp), name in userbuffers.UB_CONFIGS.items()
    )


def test_attention_backend_auto_is_not_spelled_and_others_are():
    assert knobs.overrides({"attention_backend": "auto"}, "mbridge") == []
    assert knobs.overrides({"attention_backend": "unfused"}, "mbridge") == ["model.attention_backend=unfused"]
    # NeMo 2: nemo-run cannot parse an enum-typed override, so the factory sets it
    assert knobs.overrides({"attention_backend": "flash"}, "nemo2") == []
    assert knobs.factory_args({"attention_backend": "flash"}, gpu="h100", hidden_size=4096) == {
        "attention_backend": "flash"
    }
    assert knobs.factory_args({"attention_backend": "auto"}, gpu="h100", hidden_size=4096) == {}
    with pytest.raises(UserError, match="takes one of auto, flash, fused, unfused, local"):
        knobs.get("attention_backend").coerce("cudnn")


GRAPH = dict(BASE, cuda_graph="none", cuda_graph_scope="full")


def test_no_cuda_graph_is_not_spelled():
    """cuda_graph=none is every recipe's own default: ungraphed command lines stay as they were."""
    for flavour in ("nemo2", "mbridge"):
        assert not [o for o in knobs.overrides(GRAPH, flavour) if "graph" in o or "rng" in o]


def test_nemo2_spells_graphs_as_its_performance_scripts():
    """NeMo's scripts/performance helpers: enable_cuda_graph with TE's RNG tracker."""
    got = knobs.overrides(dict(GRAPH, cuda_graph="local"), "nemo2")
    assert [o for o in got if "graph" in o or "rng" in o] == [
        "model.config.enable_cuda_graph=true",
        "trainer.strategy.use_te_rng_tracker=true",
    ]


@pytest.mark.parametrize(
    ("impl", "scope", "expected"),
    [
        (
            "local",
            "full_iteration",
            [
                "model.cuda_graph_impl=local",
                "model.cuda_graph_scope=[full_iteration]",
                "model.use_te_rng_tracker=true",
                "rng.te_rng_tracker=true",
                "rerun_state_machine.check_for_nan_in_loss=false",
                "ddp.check_for_nan_in_grad=false",
            ],
        ),
        (
            "transformer_engine",
            "attn,mlp",
            [
                "model.cuda_graph_impl=transformer_engine",
                "model.cuda_graph_scope=[attn,mlp]",
                "model.use_te_rng_tracker=true",
                "rng.te_rng_tracker=true",
            ],
        ),
        (
            "local",
            "full",
            [
                "model.cuda_graph_impl=local",
                "model.cuda_graph_scope=[]",
                "model.use_te_rng_tracker=true",
                "rng.te_rng_tracker=true",
            ],
        ),
    ],
)
def test_mbridge_spells_graphs_as_bridges_performance_scripts(impl, scope, expected):
    """Bridge's _set_cuda_graph_overrides: impl, scope as a list, TE's RNG tracker in model and rng; with
    full_iteration the NaN checks off that Bridge's config validation asks for."""
    got = knobs.overrides(dict(GRAPH, cuda_graph=impl, cuda_graph_scope=scope), "mbridge")
    assert [o for o in got if "graph" in o or "rng" in o or "nan" in o] == expected


def test_payload_args_mbridge_with_full_iteration_graphs():
    """A whole command line: Bridge's Llama 3 8B GB200 preset (local, full_iteration)."""
    values = dict(GRAPH, cp=1, mbs=2, precision="fp8", cuda_graph="local", cuda_graph_scope="full_iteration")
    argv = knobs.payload_args("mbridge", RECIPES["llama3_8b"], values, gpu="gb200", gpus_per_node=4)
    assert argv[:2] == ("--recipe", RECIPES["llama3_8b"].mbridge_recipe)
    assert "model.cuda_graph_impl=local" in argv and "model.cuda_graph_scope=[full_iteration]" in argv
