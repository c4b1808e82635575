"""The simulated trainer payload: the NeMo 2 command line, overrides on a dict config, the model's log."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dse.facts import knobs
from dse.launch import build_plan
from dse.recipes.models import RECIPES
from dse.recipes.sim import __main__ as sim
from dse.recipes.sim.logwriter import OOM_EXIT_CODE, SimRun
from tests.trials import system, trial


def _run(plan, monkeypatch, capsys, **env):
    for k, v in {**plan.env, **env}.items():
        monkeypatch.setenv(k, v)
    code = sim.main(list(plan.argv[3:]))
    return code, capsys.readouterr()


def _steps(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("Training epoch")]


@pytest.mark.parametrize(
    "gpu, values",
    [
        ("h100", dict(tp=2, pp=2, cp=1, vp=2, recompute="full", recompute_num_layers=1, precision="fp8")),
        ("b200", dict(tp=1, pp=1, cp=2, vp=1, recompute="selective", fsdp=True, sp=False, ep=1)),
    ],
)
def test_every_nemo2_override_applies_and_the_log_follows(gpu, values, monkeypatch, capsys):
    t = trial(sys=system(gpu), gbs=48, max_steps=6, **values)
    plan = build_plan(t, payload="sim", sim_run=SimRun(step_time_s=3.0, tflops_per_gpu=321.0, gbs=999, max_steps=99))
    code, out = _run(plan, monkeypatch, capsys)
    assert code == 0, out.err
    steps = _steps(out.out)
    assert len(steps) == 6  # trainer.max_steps from the override, not the SimRun's 99
    assert all("global_batch_size: 48 " in s for s in steps)
    assert "`max_steps=6` reached" in out.out


def test_sim_config_knows_every_catalogue_spelling():
    """Drift guard: an override or factory argument the catalogue spells for nemo2 that the simulated trainer
    lacks fails here (every value of every choice knob, and every bool both ways)."""
    import itertools

    base = {n: k.default for n, k in knobs.CATALOGUE.items()} | {"tp": 4}
    variants = [{}]
    for name, knob in knobs.CATALOGUE.items():
        if knob.kind == "choice":
            variants += [{name: c, "precision": "fp8"} if name == "fp8_recipe" else {name: c} for c in knob.choices]
        elif knob.kind == "bool":
            variants += [{name: True}, {name: False}]
    variants.append({"recompute": "full", "recompute_num_layers": 2})
    variants.append({"cpu_offload_layers": 4})
    variants.append({"recompute": "selective", "recompute_modules": "core_attn,layernorm,mlp"})
    variants.append({"nccl_ub": True, "fsdp": True, "tp": 1})
    for v, gpu in itertools.product(variants, ("h100", "b200")):
        values = base | v
        args = knobs.payload_args("sim", RECIPES["llama3_70b"], values, gpu=gpu, gpus_per_node=8)
        name, fargs = sim.parse_factory(args[1])
        sim.apply_overrides(sim.base_config(), [a for a in args[3:]])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--factory", "llama3_8b_recipe", "-y", "trainer.strategy.no_such_field=1"], "unknown override path"),
        (["--factory", "llama3_8b_recipe", "-y", "nothing_here"], "not path=value"),
        (["--factory", "llama3_8b_recipe", "-y", "trainer.strategy=1"], "names a section"),
        (["--factory", "llama3_8b", "-y"], "unknown factory"),
        (["--factory", "llama3_8b_recipe(gpus=8)", "-y"], "takes no argument gpus"),
        (["--factory", "llama3_8b_recipe(fsdp=__import__('os'))", "-y"], "not keyword=literal"),
        (["--factory", 'llama3_8b_recipe(attention_backend="cudnn")', "-y"], "unknown attention_backend"),
    ],
)
def test_bad_command_lines_exit_2(argv, message, capsys):
    assert sim.main(argv) == 2
    assert message in capsys.readouterr().err


def test_missing_factory_exits_2(capsys):
    assert sim.main(["-y"]) == 2


def test_oom_run_prints_the_traceback_and_fails(monkeypatch, capsys):
    plan = build_plan(
        trial(tp=2, pp=1, cp=1, vp=1),
        payload="sim",
        sim_run=SimRun(step_time_s=1.0, tflops_per_gpu=1.0, gbs=1, peak_memory_gib=120.0, oom=True, oom_after=2),
    )
    code, out = _run(plan, monkeypatch, capsys)
    assert code == OOM_EXIT_CODE
    assert "torch.OutOfMemoryError: CUDA out of memory" in out.out and len(_steps(out.out)) == 2


def test_only_rank_zero_prints(monkeypatch, capsys):
    plan = build_plan(trial(tp=2, pp=1, cp=1, vp=1), payload="sim", sim_run=SimRun(1.0, 1.0, 1, max_steps=3))
    code, out = _run(plan, monkeypatch, capsys, SLURM_PROCID="1")
    assert code == 0 and out.out == ""


def test_process_exit_code_is_write_logs(tmp_path):
    env = {"DSE_SIM_OOM": "1", "DSE_SIM_OOM_AFTER": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-m", "recipes.sim", "--factory", "llama3_8b_recipe", "-y", "trainer.max_steps=3"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == OOM_EXIT_CODE, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "recipes.sim", "--factory", "x_recipe", "-y", "bogus.path=1"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "unknown override path 'bogus.path'" in r.stderr


def test_sim_payload_and_sim_backend_print_the_same_figures_under_the_space_convention(tmp_path):
    """One call (dse.perfmodel.simulate) for both simulated paths, with the space's FLOPs convention."""
    from dse.backends.sim import SimBackend
    from dse.perfmodel.simulate import simulate

    t = trial(tp=2, pp=1, cp=1, vp=1)
    for convention in ("causal", "noncausal"):
        expected = simulate(t, 3, flops_convention=convention)
        payload_plan = build_plan(t, payload="sim", seed=3, flops_convention=convention)
        assert float(payload_plan.env["DSE_SIM_TFLOPS_PER_GPU"]) == expected.tflops_per_gpu
        backend_plan = build_plan(
            t, payload="nemo2", seed=3, flops_convention=convention, simulated=SimBackend.simulated
        )
        assert backend_plan.sim_run == expected
    assert simulate(t, flops_convention="noncausal").tflops_per_gpu > simulate(t).tflops_per_gpu
