"""Search agents. They see only the environment's action space and the rewards; they know no backend."""

from dse.agents.base import Agent, Forecast, load_agents

__all__ = ["Agent", "Forecast", "load_agents"]
