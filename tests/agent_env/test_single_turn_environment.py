"""SingleTurnEnvironment: one generation, then done."""

from __future__ import annotations

import asyncio

import pytest

from agent_env import EnvironmentStateError, SingleTurnEnvironment
from agent_protocol.types import Action, ParseIssue, ToolCall


def test_one_turn_is_the_whole_episode() -> None:
    env = SingleTurnEnvironment()
    assert env.tools == [] and env.max_steps == 1
    result = asyncio.run(env.step(Action(content=" \\boxed{4} ", reasoning_content="2+2")))
    assert result.done and result.final_answer == "\\boxed{4}" and result.stop_reason == "final_answer"
    assert result.observations == ()
    with pytest.raises(EnvironmentStateError):
        asyncio.run(env.step(Action(content="again")))


def test_issues_and_calls_are_recorded_not_run() -> None:
    action = Action(
        content="4",
        tool_calls=(ToolCall(id="a", name="calculator", arguments={"expression": "2+2"}),),
        error=ParseIssue(code="missing_think_end", message="m"),
    )
    result = asyncio.run(SingleTurnEnvironment().step(action))
    assert result.done and result.final_answer == "4"
    assert result.info == {"issues": ["missing_think_end"], "ignored_tool_calls": 1}
