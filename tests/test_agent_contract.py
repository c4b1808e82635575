"""Every agent in the ``dse.agents`` registry passes the agent contract (tests/contracts.py)."""

from __future__ import annotations

import importlib.util

import pytest

from dse.agents.base import agent_class, load_agents
from tests.contracts import AgentContract


@pytest.fixture(params=sorted(load_agents()))
def agent_name(request) -> str:
    """A registered agent; one that needs an optional extra (``requires``) is skipped where the extra is absent."""
    missing = [m for m in agent_class(request.param, load_agents()).requires if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"agent {request.param!r} needs {', '.join(missing)} (an optional extra)")
    return request.param


class TestRegisteredAgents(AgentContract):
    pass


def test_the_registry_offers_the_built_in_agents():
    assert {"grid", "random", "optuna", "guided", "policy"} <= set(load_agents())
