"""`SingleTurnEnvironment`: one generation, then done (plain RL with verifiable rewards on prompts).

The turn's content is the final answer, whatever else it holds: tool calls are not run (the environment
offers no tools) and parse issues are recorded in `info["issues"]` for rewards and metrics, never raised.

This module knows the protocol's `Action`; it knows nothing about chat formats or rewards.
"""

from __future__ import annotations

from typing import Any

from agent_env.environment import Environment, StepResult
from agent_protocol import Action

__all__ = ["SingleTurnEnvironment"]


class SingleTurnEnvironment(Environment):
    """One assistant turn is the whole episode; its content is the final answer."""

    def __init__(self, *, episode_id: str | None = None) -> None:
        super().__init__(tools=(), max_steps=1, episode_id=episode_id)

    async def transition(self, action: Action) -> StepResult:
        info: dict[str, Any] = {}
        if action.issues:
            info["issues"] = [issue.code for issue in action.issues]
        if action.tool_calls:
            info["ignored_tool_calls"] = len(action.tool_calls)
        return StepResult(done=True, final_answer=action.content.strip(), stop_reason="final_answer", info=info)
