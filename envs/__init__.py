"""Gymnasium environments: one recipe run per step (:class:`RecipeEnv`, the study's), and one search per episode
(``dse/Recipe-v0``, :mod:`dse.envs.search`), and the benchmark suite's ids (``dse/Llama70B-H100-v0``, ...,
:mod:`dse.envs.suite`), registered with Gymnasium when this package is imported."""

from dse.envs import suite
from dse.envs.recipe_env import RecipeEnv
from dse.envs.search import ENV_ID, make_env, make_vec, register

register()
suite.register()

__all__ = ["ENV_ID", "RecipeEnv", "make_env", "make_vec", "register", "suite"]
