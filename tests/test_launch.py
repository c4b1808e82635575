"""dse.launch: overrides, PerfEnvPlugin environment, vboost pre-step, container gating, userbuffer rule."""

from __future__ import annotations

import pytest

from dse import launch
from dse.errors import UserError
from dse.launch import build_plan, perf_env, tp_comm_overlap_supported, userbuffer_config
from dse.recipes.sim.logwriter import SimRun
from tests.trials import system, trial

SIM = SimRun(step_time_s=2.0, tflops_per_gpu=500.0, gbs=64, max_steps=7, peak_memory_gib=40.0, seed=3)


@pytest.mark.parametrize(
    "gpu, tp, cp, expected",
    [
        ("h100", 1, 1, None),
        ("h100", 2, 1, "1"),
        ("h100", 1, 2, "1"),
        ("h200", 4, 1, "1"),
        ("a100", 2, 1, "1"),
        ("b200", 1, 1, None),
        ("b200", 2, 1, "32"),
        ("gb200", 1, 2, "32"),
        ("gb300", 4, 1, "32"),
    ],
)
def test_cuda_device_max_connections_follows_perf_env_plugin(gpu, tp, cp, expected):
    env = perf_env(trial(sys=system(gpu), tp=tp, cp=cp, pp=1, vp=1))
    assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == expected


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_nccl_chunksize_exactly_when_pipeline_parallel(pp):
    env = perf_env(trial(tp=1, cp=1, pp=pp, vp=1))
    assert ("NCCL_P2P_NET_CHUNKSIZE" in env) == (pp > 1)
    if pp > 1:
        assert env["NCCL_P2P_NET_CHUNKSIZE"] == "2097152"


def test_layernorm_margins_and_nccl_priority():
    env = perf_env(trial(tp=1, cp=1, pp=1, vp=1))
    assert env["NVTE_FWD_LAYERNORM_SM_MARGIN"] == env["NVTE_BWD_LAYERNORM_SM_MARGIN"] == "16"
    assert env["TORCH_NCCL_HIGH_PRIORITY"] == "1"


def test_vboost_adds_one_srun_per_node_before_training():
    plan = build_plan(trial(num_nodes=2, tp=2, pp=1, cp=1, vp=1, env_ENABLE_VBOOST="1"), payload="nemo2")
    (step,) = plan.pre_steps
    assert step.command == (
        "srun",
        "--ntasks=2",
        "--output=vboost.out",
        "--error=vboost.err",
        "bash",
        "-c",
        "sudo nvidia-smi boost-slider --vboost 1",
    )
    assert plan.env["ENABLE_VBOOST"] == "1"
    for value in (None, "0"):
        t = trial(tp=2, pp=1, cp=1, vp=1, **({} if value is None else {"env_ENABLE_VBOOST": value}))
        assert build_plan(t).pre_steps == ()


def test_space_env_and_allocator_settings_reach_the_job_environment():
    t = trial(
        tp=2,
        pp=1,
        cp=1,
        vp=1,
        env_PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True,max_split_size_mb:512",
        env_NCCL_NVLS_ENABLE="0",
        env_CUDA_DEVICE_MAX_CONNECTIONS="8",
    )
    env = build_plan(t).env
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:512"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"  # the space's explicit setting wins


@pytest.mark.parametrize(
    "version, flag", [("24.12", "0"), ("25.02", "0"), ("25.04", "1"), ("25.09", "1"), ("26.01", "1"), ("25.04.01", "1")]
)
def test_flops_callback_only_from_container_25_04(version, flag):
    t = trial(sys=system("h100", container=version), tp=2, pp=1, cp=1, vp=1)
    assert build_plan(t).env[launch.ENV_FLOPS_CALLBACK] == flag
    # the container argument overrides the system's version
    assert build_plan(trial(tp=2, pp=1, cp=1, vp=1), container=version).env[launch.ENV_FLOPS_CALLBACK] == flag


def test_bad_container_version_is_a_user_error():
    with pytest.raises(UserError, match="container version"):
        build_plan(trial(tp=2, pp=1, cp=1, vp=1), container="latest")


@pytest.mark.parametrize(
    "recipe, gpu, tp, cp, precision, name",
    [
        ("llama3_70b", "h100", 4, 1, "bf16", "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192"),
        ("llama3_70b", "h200", 4, 1, "fp8", "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"),
        ("llama3_70b_16l", "b200", 2, 1, "fp8", "userbuffers_fp8_b200_h8192_tp2_mbs1_seqlen8192"),
        ("llama3_70b", "gb200", 2, 1, "bf16", "userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192"),
        ("llama3_405b", "h100", 8, 2, "bf16", "userbuffers_bf16_h100_h16384_tp8_cp2_mbs1_seqlen8192"),
        ("llama3_405b", "h100", 8, 1, "fp8", "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192"),
        ("nemotron4_15b", "b200", 2, 1, "bf16", "userbuffers_bf16_b200_h6144_tp2_mbs1_seqlen4096"),
        ("nemotron4_340b", "b200", 8, 1, "bf16", "userbuffers_bf16_b200_h18432_tp8_mbs1_seqlen4096"),
    ],
)
def test_userbuffer_config_found(recipe, gpu, tp, cp, precision, name):
    t = trial(
        recipe, sys=system(gpu), num_nodes=16, tp=tp, cp=cp, pp=1, vp=1, precision=precision, tp_comm_overlap=True
    )
    assert userbuffer_config(t) == name
    assert tp_comm_overlap_supported(t) is None
    assert f'tp_comm_overlap_cfg="{name}"' in build_plan(t).argv[4]  # the factory loads it by name


@pytest.mark.parametrize(
    "recipe, gpu, tp, precision",
    [
        ("llama3_70b", "h100", 2, "bf16"),  # no tp2 config for h8192 on H100
        ("llama3_70b", "a100", 4, "bf16"),  # no A100 configs at all
        ("llama3_8b", "h100", 2, "bf16"),  # no config for hidden 4096
        ("nemotron4_15b", "b200", 2, "fp8"),  # bf16 only for h6144
    ],
)  # tp=1 with overlap is the rule tp_comm_overlap_needs_tp (tests/test_constraints.py)
def test_tp_comm_overlap_without_userbuffer_config_is_rejected(recipe, gpu, tp, precision):
    t = trial(recipe, sys=system(gpu), num_nodes=16, tp=tp, pp=1, cp=1, vp=1, precision=precision, tp_comm_overlap=True)
    why = tp_comm_overlap_supported(t)
    assert why and "userbuffer config" in why.reason and f"tp {tp}" in why.reason
    assert why.knobs == ("tp_comm_overlap", "tp")
    with pytest.raises(UserError, match="userbuffer config"):
        build_plan(t)
    off = trial(recipe, sys=system(gpu), num_nodes=16, tp=tp, pp=1, cp=1, vp=1, precision=precision)
    assert tp_comm_overlap_supported(off) is None


def test_nemo2_argv_carries_factory_and_catalogue_overrides():
    t = trial(tp=2, pp=2, cp=1, vp=2, mbs=1, gbs=32, max_steps=9)
    plan = build_plan(t, payload="nemo2")
    assert plan.argv[:6] == ("python", "-m", "recipes.nemo2", "--factory", "llama3_70b_recipe", "-y")
    assert plan.argv[6:] == plan.overrides
    ov = dict(o.split("=", 1) for o in plan.overrides)
    assert ov["trainer.strategy.tensor_model_parallel_size"] == "2"
    assert ov["trainer.strategy.pipeline_model_parallel_size"] == "2"
    assert ov["trainer.strategy.virtual_pipeline_model_parallel_size"] == "2"
    assert ov["trainer.strategy.sequence_parallel"] == "true"  # effective: on because tp > 1
    assert ov["data.global_batch_size"] == "32" and ov["trainer.max_steps"] == "9"
    assert ov["trainer.num_nodes"] == "2" and ov["trainer.devices"] == "8"
    assert plan.env[launch.ENV_RECIPE] == "llama3_70b" and plan.env[launch.ENV_TASK] == "pretrain"


def test_mbridge_argv_names_the_bridge_recipe():
    plan = build_plan(trial(tp=2, pp=1, cp=1, vp=1), payload="mbridge")
    assert plan.argv[:5] == ("python", "-m", "recipes.mbridge", "--recipe", "llama3_70b_pretrain_config")
    assert "model.tensor_model_parallel_size=2" in plan.argv
    with pytest.raises(UserError, match="no Megatron-Bridge recipe"):
        build_plan(trial("nemotron4_15b", num_nodes=8, tp=4, pp=1, cp=1, vp=1), payload="mbridge")


def test_unknown_payload_is_a_user_error():
    with pytest.raises(UserError, match="unknown payload"):
        build_plan(trial(tp=2, pp=1, cp=1, vp=1), payload="megatron")


def test_sim_payload_gets_the_figures_in_its_environment():
    plan = build_plan(trial(tp=2, pp=1, cp=1, vp=1), payload="sim", sim_run=SIM)
    assert plan.argv[2] == "recipes.sim"
    env = plan.env
    assert float(env["DSE_SIM_STEP_TIME_S"]) == 2.0 and float(env["DSE_SIM_TFLOPS_PER_GPU"]) == 500.0
    assert env["DSE_SIM_OOM"] == "0" and env["DSE_SIM_SEED"] == "3" and env["DSE_SIM_MAX_STEPS"] == "7"
    assert "DSE_SIM_STEP_TIME_S" not in build_plan(trial(tp=2, pp=1, cp=1, vp=1), payload="nemo2").env


@pytest.mark.parametrize("value", ["$(touch /tmp/x)", "`id`", "a;b", "x y", "'q'"])
def test_build_plan_refuses_shell_syntax_in_env_values(value):
    t = trial(tp=2, pp=1, cp=1, vp=1)
    # bypass the space loader's validation: the plan builder checks again
    bad = type(t)(recipe=t.recipe, system=t.system, values=t.values, env={"NCCL_DEBUG": value})
    with pytest.raises(UserError, match="not allowed"):
        build_plan(bad)
