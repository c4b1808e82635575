"""Gymnasium environments: one recipe run per step."""

from dse.envs.recipe_env import RecipeEnv

__all__ = ["RecipeEnv"]
