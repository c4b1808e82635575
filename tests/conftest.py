"""Shared fixtures. Slurm fixtures live in tests/slurm_cluster.py and are loaded as a plugin."""

from __future__ import annotations

import pytest

from dse.recipes.models import RECIPES

pytest_plugins = ["tests.slurm_cluster"]


@pytest.fixture
def recipes():
    return RECIPES
