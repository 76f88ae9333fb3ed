"""Moved to `agent_demo.recipe` (the agent-demo package, below agent-train, so serving needs no training layer).
This re-export keeps `agent_train.local.trainer`'s import working until it imports `agent_demo` directly."""

from agent_demo.recipe import *  # noqa: F403
from agent_demo.recipe import __all__ as __all__
