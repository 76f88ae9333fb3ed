"""ToolCallReward: per-call bonus with caps, penalties for parse errors and refused calls."""

from __future__ import annotations

import asyncio

import pytest

from agent_env import FunctionCallEnvironment, calculator
from agent_env.reward import EpisodeRecord, RewardScore, StepRecord
from agent_env.rewards.tool_call import ToolCallReward, count_calls
from agent_protocol.types import Action, ParseIssue, ToolCall


def calc(call_id: str, expression: str) -> ToolCall:
    return ToolCall(id=call_id, name="calculator", arguments={"expression": expression})


def play(*actions: Action) -> EpisodeRecord:
    """Run real steps through a real environment, so the observations are the environment's own."""

    async def main() -> EpisodeRecord:
        env = FunctionCallEnvironment(tools=[calculator])
        steps = []
        for action in actions:
            steps.append(StepRecord.from_step(action, await env.step(action)))
        return EpisodeRecord(steps=tuple(steps))

    return asyncio.run(main())


def step_scores(reward: ToolCallReward, episode: EpisodeRecord) -> list[float]:
    async def main() -> list[RewardScore]:
        return [await reward.score_step(step, episode) for step in episode.steps]

    return [round(score.value, 6) for score in asyncio.run(main())]


def test_counts_follow_the_observations() -> None:
    episode = play(
        Action(
            tool_calls=(
                calc("a", "1+1"),
                ToolCall(id="b", name="calculator", error=ParseIssue(code="invalid_json", message="m")),
                ToolCall(id="c", name="nope"),
                calc("d", "1/0"),
                ToolCall(id="e", name="calculator", arguments={"expr": "1"}),
            )
        )
    )
    counts = count_calls(episode.steps[0])
    assert (counts.succeeded, counts.parse_errors, counts.refused, counts.failed) == (1, 1, 2, 1)


def test_bonus_and_penalties() -> None:
    episode = play(
        Action(
            tool_calls=(
                calc("a", "1+1"),
                ToolCall(id="b", name="calculator", error=ParseIssue(code="invalid_json", message="m")),
                ToolCall(id="c", name="nope"),
                calc("d", "1/0"),
            )
        )
    )
    reward = ToolCallReward(per_call=0.1, parse_error_penalty=-0.2, refused_penalty=-0.1, failed_penalty=-0.05)
    assert step_scores(reward, episode) == [round(0.1 - 0.2 - 0.1 - 0.05, 6)]


def test_bonus_is_capped_per_step_and_per_episode() -> None:
    many = Action(tool_calls=tuple(calc(f"c{i}", "1") for i in range(5)))
    episode = play(many, many, many, Action(content="done"))
    reward = ToolCallReward(per_call=0.1, max_per_step=0.3, max_per_episode=0.5)
    assert step_scores(reward, episode) == [0.3, 0.2, 0.0, 0.0]


def test_penalties_are_not_capped_by_the_bonus_cap() -> None:
    good = Action(tool_calls=tuple(calc(f"g{i}", "1") for i in range(3)))
    bad = Action(tool_calls=(ToolCall(id="x", name="nope"), calc("y", "2")))
    episode = play(good, good, bad)
    assert step_scores(ToolCallReward(max_per_episode=0.5), episode) == [0.3, 0.2, -0.1]


def test_penalties_must_not_be_positive() -> None:
    with pytest.raises(ValueError, match="penalties"):
        ToolCallReward(refused_penalty=0.1)
