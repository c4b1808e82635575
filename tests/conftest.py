"""Shared fixtures. The test services (Slurm, PostgreSQL) live in tests/services.py and are loaded as a plugin."""

from __future__ import annotations

import pytest

from dse.recipes.models import RECIPES

pytest_plugins = ["tests.services"]


@pytest.fixture
def recipes():
    return RECIPES
