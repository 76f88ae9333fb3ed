"""The think tool: a scratchpad kept in the episode's own state."""

from __future__ import annotations

import asyncio

from agent_env.tool import ToolContext
from agent_env.tools.think import think


def test_think_notes_the_thought_in_episode_state() -> None:
    context = ToolContext(state={})
    reply = asyncio.run(think.call(think.parse_arguments({"thought": "try 6*7"}), context))
    assert reply == "Thought noted."
    assert context.state["thoughts"] == ["try 6*7"]
    assert think.spec.parameters["required"] == ["thought"]
    assert "context" not in think.spec.parameters["properties"]
