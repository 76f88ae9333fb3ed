"""`FunctionCallEnvironment`: tools, then a plain-text final answer.

The rule for one turn:

- The turn makes tool calls: every call is answered (in call order; valid calls run concurrently; broken,
  unknown, invalid, failing, slow calls are answered with error observations, see `tool_runner.py`) and the
  episode goes on.
- The turn makes no tool call: its content is the final answer and the episode ends
  (``stop_reason="final_answer"``).
- The turn has a turn-level parse problem (`Action.error`, e.g. ``missing_think_end``: reasoning opened and
  never closed). What the model wrote cannot be trusted as an answer, so with the default
  ``on_turn_error="feedback"`` the episode goes on and the model gets a notice, an observation without a
  `tool_call_id` carrying the parse code (after the answers to any calls). With ``on_turn_error="end"`` a
  turn without calls ends the episode as usual and the issue is only recorded in `info`. Either way nothing
  raises, and `max_steps` bounds an episode that keeps failing.

This module knows the protocol's `Action`; it knows nothing about chat formats or rewards.
"""

from __future__ import annotations

from typing import Any, Literal, Unpack

from agent_env.environment import Environment, EnvironmentOptions, StepResult
from agent_env.observation import Observation
from agent_protocol import Action

__all__ = ["FunctionCallEnvironment"]


class FunctionCallEnvironment(Environment):
    """Tools plus a plain-text final answer. See the module docstring for the rule of a turn.

    `on_turn_error` (``"feedback"`` or ``"end"``, see the module docstring); the other keyword arguments are
    `Environment`'s (`EnvironmentOptions`)."""

    def __init__(
        self, *, on_turn_error: Literal["feedback", "end"] = "feedback", **options: Unpack[EnvironmentOptions]
    ) -> None:
        super().__init__(**options)
        if on_turn_error not in ("feedback", "end"):
            raise ValueError(f"on_turn_error must be 'feedback' or 'end', got {on_turn_error!r}")
        self.on_turn_error = on_turn_error

    async def transition(self, action: Action) -> StepResult:
        info: dict[str, Any] = {}
        if action.issues:
            info["issues"] = [issue.code for issue in action.issues]
        if not action.tool_calls and (action.error is None or self.on_turn_error == "end"):
            return StepResult(done=True, final_answer=action.content.strip(), stop_reason="final_answer", info=info)
        observations = await self.run_tools(action) if action.tool_calls else []
        if action.error is not None:
            observations.append(Observation.from_parse_issue(action.error, tool_call_id=None, name=""))
        return StepResult(observations=tuple(observations), info=info)
