"""FunctionCallEnvironment and the Environment contract: steps, limits, turn errors, isolation."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent_env import (
    EnvironmentStateError,
    FunctionCallEnvironment,
    StepResult,
    ToolContext,
    calculator,
    think,
    tool,
)
from agent_env.environment import Environment
from agent_protocol.types import Action, ParseIssue, ToolCall


@tool
async def count(context: ToolContext) -> int:
    """Count calls in this episode."""
    context.state["count"] = context.state.get("count", 0) + 1
    await asyncio.sleep(0)
    return int(context.state["count"])


def calc_call(expression: str, call_id: str = "c1") -> ToolCall:
    return ToolCall(id=call_id, name="calculator", arguments={"expression": expression})


def test_manifest_lists_the_tools_in_order() -> None:
    env = FunctionCallEnvironment(tools=[calculator, think])
    assert [spec.name for spec in env.tools] == ["calculator", "think"]
    assert env.tools[0].parameters["required"] == ["expression"]


def test_tool_turns_continue_and_a_plain_turn_ends_with_the_answer() -> None:
    async def episode() -> tuple[StepResult, StepResult]:
        env = FunctionCallEnvironment(tools=[calculator])
        first = await env.step(Action(tool_calls=(calc_call("6*7"),)))
        second = await env.step(Action(content="  The answer is 42.  "))
        assert env.step_count == 2 and env.done
        return first, second

    first, second = asyncio.run(episode())
    observations, done = first
    assert not done and first.step == 1 and first.stop_reason is None
    assert [o.content for o in observations] == ["42"]
    assert first.messages()[0].role == "tool" and first.messages()[0].tool_call_id == "c1"
    assert second.done and second.final_answer == "The answer is 42." and second.stop_reason == "final_answer"
    assert second.observations == () and second.step == 2


def test_max_steps_ends_the_episode_after_running_the_last_tools() -> None:
    async def episode() -> list[StepResult]:
        env = FunctionCallEnvironment(tools=[calculator], max_steps=2)
        return [await env.step(Action(tool_calls=(calc_call("1+1"),))) for _ in range(2)]

    first, last = asyncio.run(episode())
    assert not first.done
    assert last.done and last.stop_reason == "max_steps" and last.final_answer is None
    assert last.observations[0].content == "2"


def test_stepping_a_finished_episode_is_a_caller_error() -> None:
    async def episode() -> None:
        env = FunctionCallEnvironment()
        await env.step(Action(content="done"))
        await env.step(Action(content="again"))

    with pytest.raises(EnvironmentStateError, match="is over"):
        asyncio.run(episode())


def test_reset_starts_over() -> None:
    async def episode() -> StepResult:
        env = FunctionCallEnvironment(tools=[count])
        await env.step(Action(tool_calls=(ToolCall(id="a", name="count"),)))
        await env.step(Action(content="done"))
        await env.reset({"question": "q"})
        assert env.step_count == 0 and not env.done and env.state == {} and env.task == {"question": "q"}
        return await env.step(Action(tool_calls=(ToolCall(id="b", name="count"),)))

    result = asyncio.run(episode())
    assert result.observations[0].content == "1" and result.step == 1


def test_broken_calls_are_answered_and_the_episode_goes_on() -> None:
    action = Action(
        tool_calls=(
            ToolCall(id="a", name="calculator", error=ParseIssue(code="invalid_json", message="bad")),
            calc_call("2**3", "b"),
        )
    )
    result = asyncio.run(FunctionCallEnvironment(tools=[calculator]).step(action))
    assert not result.done
    assert [o.code for o in result.observations] == ["invalid_json", None]
    assert result.info == {"issues": ["invalid_json"]}


def test_unclosed_reasoning_gets_a_notice_by_default() -> None:
    issue = ParseIssue(code="missing_think_end", message="reasoning was never closed")
    result = asyncio.run(FunctionCallEnvironment().step(Action(content="", error=issue)))
    assert not result.done and result.final_answer is None
    [notice] = result.observations
    assert notice.tool_call_id is None and notice.code == "missing_think_end"
    assert json.loads(notice.content)["error"]["message"] == "reasoning was never closed"


def test_unclosed_reasoning_can_end_the_episode_instead() -> None:
    issue = ParseIssue(code="missing_think_end", message="m")
    env = FunctionCallEnvironment(on_turn_error="end")
    result = asyncio.run(env.step(Action(content="42", error=issue)))
    assert result.done and result.final_answer == "42" and result.info == {"issues": ["missing_think_end"]}


def test_turn_notice_follows_the_tool_answers() -> None:
    issue = ParseIssue(code="missing_think_end", message="m")
    action = Action(tool_calls=(calc_call("1+2"),), error=issue)
    result = asyncio.run(FunctionCallEnvironment(tools=[calculator]).step(action))
    assert [o.code for o in result.observations] == [None, "missing_think_end"]


def test_an_environment_bug_ends_the_episode_instead_of_raising() -> None:
    class Buggy(Environment):
        async def transition(self, action: Action) -> StepResult:
            raise ZeroDivisionError("oops")

    env = Buggy()
    result = asyncio.run(env.step(Action(content="x")))
    assert result.done and result.stop_reason == "environment_error"
    assert result.info["error"] == "ZeroDivisionError: oops"
    assert env.done


def test_concurrent_episodes_share_tools_but_not_state() -> None:
    async def episode(calls: int) -> tuple[int, list[str]]:
        env = FunctionCallEnvironment(tools=[count, think])
        last = 0
        for i in range(calls):
            result = await env.step(
                Action(
                    tool_calls=(
                        ToolCall(id=f"c{i}", name="count"),
                        ToolCall(id=f"t{i}", name="think", arguments={"thought": f"{calls}-{i}"}),
                    )
                )
            )
            last = int(result.observations[0].content)
        return last, list(env.state["thoughts"])

    async def main() -> list[tuple[int, list[str]]]:
        return list(await asyncio.gather(episode(3), episode(5), episode(1)))

    results = asyncio.run(main())
    assert [last for last, _ in results] == [3, 5, 1]
    assert results[0][1] == ["3-0", "3-1", "3-2"]
    assert results[2][1] == ["1-0"]


def test_invalid_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        FunctionCallEnvironment(max_steps=0)
    with pytest.raises(ValueError, match="on_turn_error"):
        FunctionCallEnvironment(on_turn_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Action"):
        asyncio.run(FunctionCallEnvironment().step({"content": "x"}))  # type: ignore[arg-type]
