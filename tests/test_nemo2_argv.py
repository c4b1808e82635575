"""The NeMo 2 entry point's own argument handling and plain data (no NeMo needed)."""

from __future__ import annotations

import pytest

from dse.recipes.models import RECIPES
from dse.recipes.nemo2 import spec
from dse.recipes.nemo2.argv import task_from_env, with_factory


def test_task_defaults_to_pretrain_and_accepts_finetune():
    assert task_from_env({}) == "pretrain"
    assert task_from_env({"DSE_NEMO_TASK": " Finetune "}) == "finetune"
    with pytest.raises(ValueError, match="DSE_NEMO_TASK='sft' is not a task"):
        task_from_env({"DSE_NEMO_TASK": "sft"})


def test_recipe_from_env_goes_first_as_an_explicit_factory():
    argv = ["-y", "trainer.strategy.tensor_model_parallel_size=2"]
    assert with_factory(argv, {"DSE_NEMO_RECIPE": "llama3_8b"}) == ["--factory", "llama3_8b_recipe", *argv]
    assert with_factory(argv, {"DSE_NEMO_RECIPE": "nemotron4_15b_recipe"})[:2] == ["--factory", "nemotron4_15b_recipe"]
    assert with_factory(argv, {}) == argv


@pytest.mark.parametrize(
    "given", [["--factory", "llama3_70b_recipe"], ["-f", "llama3_70b_recipe"], ["--factory=llama3_70b_recipe"]]
)
def test_argv_factory_wins_over_env(given):
    assert with_factory([*given, "-y"], {"DSE_NEMO_RECIPE": "llama3_8b"}) == [*given, "-y"]


def test_every_dse_model_has_a_factory_with_its_vocabulary():
    bases = {r.scaled_from or r.name for r in RECIPES.values()}
    assert bases == set(spec.MODELS)
    for name, model in spec.MODELS.items():
        assert model.vocab_size == RECIPES[name].arch.vocab_size
        assert model.factory == f"{name}_recipe"
        assert spec.model_for_factory(f"{name}_recipe(fsdp=True)") is model
