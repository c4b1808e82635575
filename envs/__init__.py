"""Gymnasium environments: one recipe run per step."""

from envs.recipe_env import RecipeEnv

__all__ = ["RecipeEnv"]
