"""The `think` tool: a scratchpad. The model writes a thought; nothing happens; the thought is kept.

Useful for models without a native reasoning channel, and as the smallest example of a tool built with
`@tool`: a typed async function whose docstring is the description and whose `ToolContext` parameter
receives the episode's own state (thoughts are appended to ``context.state["thoughts"]``, so concurrent
episodes never see each other's notes).

This module knows nothing about episodes beyond `ToolContext.state`.
"""

from __future__ import annotations

from agent_env.tool import FunctionTool, ToolContext, tool

__all__ = ["think"]


async def _think(thought: str, context: ToolContext) -> str:
    """Think out loud: write down reasoning, a plan or a check. It changes nothing and looks nothing up.

    Args:
        thought: The thought to write down.
    """
    context.state.setdefault("thoughts", []).append(thought)
    return "Thought noted."


think: FunctionTool = tool(_think, name="think")
"""The scratchpad tool (stateless itself; safe to share across episodes)."""
