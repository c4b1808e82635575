"""Search agents. They see only the environment's action space and the rewards; they know no backend."""

from agents.base import Agent, load_agents

__all__ = ["Agent", "load_agents"]
