"""Gymnasium environments: one recipe run per step (:class:`RecipeEnv`, the study's), and one search per episode
(``dse/Recipe-v0``, :mod:`dse.envs.search`), registered with Gymnasium when this package is imported."""

from dse.envs.recipe_env import RecipeEnv
from dse.envs.search import ENV_ID, make_env, make_vec, register

register()

__all__ = ["ENV_ID", "RecipeEnv", "make_env", "make_vec", "register"]
