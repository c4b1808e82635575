"""The shipped MoE spaces: each loads and runs on the simulated backend, and ``dse dry-run`` writes NeMo 2 and
Megatron-Bridge scripts whose MoE arguments are those of NVIDIA's own performance scripts (golden files).

The golden point of each space is NVIDIA's published layout for that model, GPU and payload: NeMo's
``scripts/performance/llm/pretrain_*.py`` with ``recommended_model_configs/model_configs_{h100,gb200}.csv`` for NeMo
2, Megatron-Bridge's ``scripts/performance/configs/{deepseek,qwen}/*_workload_base_configs.py`` (``*_V1``) for Bridge.
Volatile bits are normalised (the run directory becomes /RUN_DIR). ``DSE_UPDATE_GOLDEN=1`` rewrites the files;
review the diff by eye before committing it.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from dse.dryrun import dry_run
from dse.rules.constraints import check
from dse.rules.counting import count_valid
from dse.rules.space import load_space
from dse.rules.trial import resolve
from tests.trials import system

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "moe"
SPACES = (
    "deepseek_v3_gb200_256",
    "deepseek_v3_h100_1024",
    "qwen3_30b_a3b_h100_8",
    "mixtral_8x7b_h100_64",
    "deepseek_v3_2node",
)
DSV3 = dict(etp=1, moe_a2a_overlap=False, recompute="none")
# Bridge's DeepSeek-V3 presets recompute MLA's up-projections (on H100 also the dense MLP)
DSV3_MB = dict(etp=1, moe_a2a_overlap=False, recompute="selective", recompute_modules="mla_up_proj")
# (space, payload) -> NVIDIA's layout for it (the knobs the space varies or sets; the rest is the recipe's)
POINTS: dict[tuple[str, str], dict[str, object]] = {
    # Bridge DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_V1: tp 1, pp 4, vp 4, ep 64, HybridEP; its layout for (pp 4, vp 4)
    ("deepseek_v3_gb200_256", "mbridge"): dict(
        tp=1, pp=4, vp=4, ep=64, pp_first_layers=16, pp_last_layers=13, **DSV3_MB
    ),
    # NeMo's GB200 row (256 GPUs): tp 2, pp 4, ep 64; all-to-all off Hopper (pretrain_deepseek_v3.py), layout (4, 1)
    ("deepseek_v3_gb200_256", "nemo2"): dict(
        tp=2, pp=4, vp=1, ep=64, pp_first_layers=16, pp_last_layers=13, moe_dispatcher="alltoall", **DSV3
    ),
    # NeMo's H100 row: tp 2, pp 16, ep 64, DeepEP; layout (16, 1): 4 + 4 x 14 + 1
    ("deepseek_v3_h100_1024", "nemo2"): dict(tp=2, pp=16, vp=1, ep=64, pp_first_layers=4, pp_last_layers=1, **DSV3),
    # Bridge DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1: tp 2, pp 8, vp 4, ep 64, HybridEP, "Et|(tt|)*30mL"
    ("deepseek_v3_h100_1024", "mbridge"): dict(
        tp=2,
        pp=8,
        vp=4,
        ep=64,
        pp_first_layers=7,
        pp_last_layers=6,
        **(DSV3_MB | {"recompute_modules": "mla_up_proj,mlp"}),
    ),
    # NeMo's 8-GPU row (GB200; its H100 row takes 16 GPUs): ep 8, all-to-all
    ("qwen3_30b_a3b_h100_8", "nemo2"): dict(tp=1, pp=1, ep=8, moe_dispatcher="alltoall", mbs=1, recompute="none"),
    # Bridge's base preset (ep 8, gbs 512) with HybridEP
    ("qwen3_30b_a3b_h100_8", "mbridge"): dict(tp=1, pp=1, ep=8, moe_dispatcher="flex", mbs=1, recompute="none"),
    # NeMo's H100 row: tp 1, pp 4, vp 8, ep 8 (Bridge has no Mixtral recipe)
    ("mixtral_8x7b_h100_64", "nemo2"): dict(tp=1, pp=4, vp=8, ep=8, mbs=1, recompute="none"),
    # the reproducer's own layout: tp 2, pp 2, ep 8, flex
    ("deepseek_v3_2node", "nemo2"): dict(
        tp=2, pp=2, ep=8, moe_dispatcher="flex", moe_a2a_overlap=False, mbs=1, recompute="none"
    ),
    ("deepseek_v3_2node", "mbridge"): dict(
        tp=2, pp=2, ep=8, moe_dispatcher="flex", moe_a2a_overlap=False, mbs=1, recompute="none"
    ),
}
SLURM = {"account": "perf", "partition": "batch", "container_mounts": ["/lustre/data:/data"]}


def _space(name: str):
    return load_space(ROOT / "conf" / "spaces" / f"{name}_space.toml")


@pytest.mark.parametrize("name", SPACES)
def test_each_moe_space_loads_with_valid_points_on_the_simulated_backend(name):
    space = _space(name)
    assert space.recipe_obj.arch.is_moe and space.backend.kind == "sim" and space.search.agent == "guided"
    counts = count_valid(space)
    assert 0 < counts.valid < space.size  # Megatron-Core's rules keep some points out, free


def golden_script(name: str, payload: str, out: Path) -> str:
    space = _space(name)
    point = POINTS[(name, payload)]
    pinned = space.model_copy(
        update={
            "knobs": {k: [v] for k, v in point.items()},
            "system": system(space.system.gpu, slurm=SLURM),
            "backend": space.backend.model_copy(update={"payload": payload}),
        }
    )
    trial = resolve(pinned, point)
    assert check(trial) is None, check(trial)
    rows = dry_run(pinned, "slurm", out).rows
    assert len(rows) == 1
    run_dir = rows[0].script.parent
    return rows[0].script.read_text().replace(str(run_dir), "/RUN_DIR").rstrip("\n") + "\n"


@pytest.mark.parametrize(("name", "payload"), sorted(POINTS))
def test_dry_run_matches_golden(name, payload, tmp_path):
    path = GOLDEN / f"{name}_{payload}.sbatch"
    text = golden_script(name, payload, tmp_path / "dry")
    if os.environ.get("DSE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with DSE_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text()


def _args(name: str, payload: str) -> set[str]:
    """The arguments of the golden script's payload command, as the shell passes them."""
    lines = (GOLDEN / f"{name}_{payload}.sbatch").read_text().splitlines()
    (command,) = [line for line in lines if " -m recipes." in line]
    return set(shlex.split(command))


def test_deepseek_v3_is_spelled_as_nvidias_scripts():
    nemo = _args("deepseek_v3_h100_1024", "nemo2")
    # pretrain_deepseek_v3.py on H100: flex with DeepEP, no shared-expert overlap, fused permutation; its layout for
    # (pp 16, vp 1) is 4 layers (and the embedding) first, 1 (and the loss) last
    assert {
        "model.config.moe_token_dispatcher_type=flex",
        "model.config.moe_enable_deepep=true",
        "model.config.moe_shared_expert_overlap=false",
        "model.config.moe_permute_fusion=true",
        "trainer.strategy.expert_model_parallel_size=64",
        "trainer.strategy.expert_tensor_parallel_size=1",
        "trainer.strategy.num_layers_in_first_pipeline_stage=4",
        "trainer.strategy.num_layers_in_last_pipeline_stage=1",
        "trainer.strategy.pipeline_model_parallel_layout=null",
    } <= nemo
    bridge = _args("deepseek_v3_h100_1024", "mbridge")
    # DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1 through apply_flex_dispatcher_backend
    assert {
        "model.moe_token_dispatcher_type=flex",
        "model.moe_flex_dispatcher_backend=hybridep",
        "model.moe_shared_expert_overlap=false",
        "model.expert_model_parallel_size=64",
        "model.expert_tensor_parallel_size=1",
        "model.virtual_pipeline_model_parallel_size=4",
        "model.pipeline_model_parallel_layout=Et|" + "tt|" * 30 + "mL",
        "model.recompute_granularity=selective",
        "model.recompute_modules=[mla_up_proj,mlp]",
    } <= bridge
    gb200 = _args("deepseek_v3_gb200_256", "mbridge")
    assert "model.pipeline_model_parallel_layout=Etttt|" + "tttt|" * 14 + "tmL" in gb200
    assert "model.config.moe_token_dispatcher_type=alltoall" in _args("deepseek_v3_gb200_256", "nemo2")


def test_the_reproducer_is_deepseek_v3_with_fewer_layers_and_experts():
    for payload, model in (("nemo2", "model.config."), ("mbridge", "model.")):
        args = _args("deepseek_v3_2node", payload)
        assert {
            f"{model}num_layers=8",
            f"{model}num_moe_experts=64",
            f"{model}moe_layer_freq=[0,1,1,1,1,1,1,1]",
        } <= args
    assert "deepseek_v3_recipe" in _args("deepseek_v3_2node", "nemo2")
    assert "deepseek_v3_pretrain_config" in _args("deepseek_v3_2node", "mbridge")


@pytest.mark.parametrize("name", SPACES)
def test_dse_run_works_on_each_moe_space(name, tmp_path):
    from typer.testing import CliRunner

    from dse.cli import app

    out = tmp_path / "out"
    space = ROOT / "conf" / "spaces" / f"{name}_space.toml"
    r = CliRunner().invoke(app, ["run", "--space", str(space), "--trials", "3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    board = (out / "leaderboard.csv").read_text().splitlines()
    assert len(board) > 1 and any(",ok," in row for row in board[1:])


@pytest.mark.parametrize(("payload", "model"), [("nemo2", "model.config."), ("mbridge", "model.")])
def test_a_token_drop_point_is_spelled_in_its_script_and_graphs_the_whole_moe_layer(payload, model, tmp_path):
    """``moe_token_drop`` reaches the Slurm script as NVIDIA's token drop (capacity factor 1.0, padded experts) and
    lets Megatron-Bridge graph the whole MoE layer; the same point without it keeps the dropless recipe's script."""
    space = _space("qwen3_30b_a3b_h100_8")
    point = dict(tp=1, pp=1, ep=8, moe_dispatcher="alltoall", mbs=1, recompute="none", moe_token_drop=True)
    if payload == "mbridge":
        point |= dict(cuda_graph="transformer_engine", cuda_graph_scope="moe")
    pinned = space.model_copy(
        update={
            "knobs": {k: [v] for k, v in point.items()},
            "system": system(space.system.gpu, slurm=SLURM),
            "backend": space.backend.model_copy(update={"payload": payload}),
        }
    )
    assert check(resolve(pinned, point)) is None
    (row,) = dry_run(pinned, "slurm", tmp_path / "drop").rows
    (command,) = [line for line in row.script.read_text().splitlines() if " -m recipes." in line]
    args = set(shlex.split(command))
    assert {f"{model}moe_expert_capacity_factor=1.0", f"{model}moe_pad_expert_input_to_capacity=true"} <= args
    dropless = pinned.model_copy(update={"knobs": {**pinned.knobs, "moe_token_drop": [False]}})
    if payload == "mbridge":  # the whole MoE layer's graph needs the padded experts
        assert check(resolve(dropless, {**point, "moe_token_drop": False})).rule == "cuda_graph_scope_fits_arch"
        dropless = dropless.model_copy(update={"knobs": {**dropless.knobs, "cuda_graph": ["none"]}})
    (row,) = dry_run(dropless, "slurm", tmp_path / "dropless").rows
    assert "capacity" not in row.script.read_text()
