"""Every agent in the ``dse.agents`` registry passes the agent contract (tests/contracts.py)."""

from __future__ import annotations

import pytest

from dse.agents.base import load_agents
from tests.contracts import AgentContract


@pytest.fixture(params=sorted(load_agents()))
def agent_name(request) -> str:
    return request.param


class TestRegisteredAgents(AgentContract):
    pass


def test_the_registry_offers_the_built_in_agents():
    assert {"grid", "random", "optuna", "guided"} <= set(load_agents())
