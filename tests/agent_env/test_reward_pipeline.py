"""RewardPipeline: weighted totals, a breakdown Struct, and strategies that fail without breaking scoring."""

from __future__ import annotations

import asyncio
import math

import msgspec
import pytest

from agent_env import (
    EpisodeRecord,
    FormatReward,
    MatchingReward,
    ProcessRewardStrategy,
    ResultRewardStrategy,
    RewardBreakdown,
    RewardPipeline,
    RewardScore,
    StepRecord,
    ToolCallReward,
)
from agent_env.observation import Observation
from agent_protocol.types import Action, ParseIssue, ToolCall


class LengthPenalty(ResultRewardStrategy):
    name = "length_penalty"

    async def score(self, episode: EpisodeRecord) -> float:
        return -0.01 * len(episode.answer)


class StepCounter(ProcessRewardStrategy):
    async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> float:
        return float(step.index + 1)


class Exploding(ResultRewardStrategy):
    name = "exploding"
    fallback = -1.0

    async def score(self, episode: EpisodeRecord) -> float:
        raise RuntimeError("bug in reward")


class Exiting(ResultRewardStrategy):
    name = "exiting"

    async def score(self, episode: EpisodeRecord) -> float:
        raise SystemExit("a reward plug-in called sys.exit()")


class Hanging(ResultRewardStrategy):
    name = "hanging"

    async def score(self, episode: EpisodeRecord) -> float:
        await asyncio.sleep(30)
        return 1.0


class NotANumber(ResultRewardStrategy):
    name = "nan"

    async def score(self, episode: EpisodeRecord) -> float:
        return math.nan


class WrongType(ProcessRewardStrategy):
    name = "wrong_type"

    async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> float:
        return "high"  # type: ignore[return-value]


def episode() -> EpisodeRecord:
    calls = (
        ToolCall(id="a", name="calculator", arguments={"expression": "1"}),
        ToolCall(id="b", name="calculator", error=ParseIssue(code="invalid_json", message="m")),
    )
    first = StepRecord(
        index=0,
        action=Action(tool_calls=calls),
        observations=(
            Observation(tool_call_id="a", name="calculator", content="1"),
            Observation.from_parse_issue(calls[1].error, tool_call_id="b", name="calculator"),  # type: ignore[arg-type]
        ),
    )
    last = StepRecord(index=1, action=Action(content="\\boxed{Paris}"), done=True)
    return EpisodeRecord(steps=(first, last), final_answer="\\boxed{Paris}", references=("Paris",))


def test_total_and_breakdown() -> None:
    pipeline = RewardPipeline(
        result=[MatchingReward(), LengthPenalty()],
        process=[ToolCallReward(), FormatReward(), StepCounter()],
        weights={"matching": 2.0, "step_counter": 0.5},
    )
    breakdown = asyncio.run(pipeline.score(episode()))
    assert breakdown.result == {"matching": 1.0, "length_penalty": pytest.approx(-0.13)}
    assert breakdown.process == {
        "tool_calls": pytest.approx(0.1 - 0.2),
        "format": pytest.approx(-0.1),
        "step_counter": 3.0,
    }
    expected = 2.0 * 1.0 - 0.13 + (0.1 - 0.2) + (-0.1) + 0.5 * 3.0
    assert breakdown.total == pytest.approx(expected)
    assert [step.scores["step_counter"] for step in breakdown.steps] == [1.0, 2.0]
    assert breakdown.steps[0].total == pytest.approx(-0.1 - 0.1 + 0.5)
    assert breakdown.weights["matching"] == 2.0 and breakdown.weights["format"] == 1.0
    assert breakdown.codes == {"format": "invalid_json"}
    decoded = msgspec.json.decode(msgspec.json.encode(breakdown), type=RewardBreakdown)
    assert decoded.total == pytest.approx(breakdown.total)


def test_score_step_alone() -> None:
    pipeline = RewardPipeline(process=[ToolCallReward()], weights={"tool_calls": 10.0})
    record = episode()
    step = asyncio.run(pipeline.score_step(record.steps[0], record))
    assert step.total == pytest.approx(10 * (0.1 - 0.2)) and step.scores == {"tool_calls": pytest.approx(-0.1)}


def test_failing_strategies_fall_back_with_codes() -> None:
    pipeline = RewardPipeline(
        result=[MatchingReward(), Exploding(), Hanging(), NotANumber()],
        process=[WrongType()],
        timeout_s=0.2,
    )
    breakdown = asyncio.run(pipeline.score(episode()))
    assert breakdown.result == {"matching": 1.0, "exploding": -1.0, "hanging": 0.0, "nan": 0.0}
    assert breakdown.codes == {
        "exploding": "reward_error",
        "hanging": "reward_timeout",
        "nan": "reward_invalid",
        "wrong_type": "reward_error",
    }
    assert breakdown.total == pytest.approx(1.0 - 1.0)


def test_a_strategy_that_calls_sys_exit_falls_back_and_the_loop_survives() -> None:
    """Raised inside a task, SystemExit would leave asyncio's loop and end the server or the training step."""
    pipeline = RewardPipeline(result=[MatchingReward(), Exiting()])

    async def main() -> tuple[object, str]:
        breakdown = await pipeline.score(episode())
        await asyncio.sleep(0)  # the loop still runs
        return breakdown.codes, "alive"

    assert asyncio.run(main()) == ({"exiting": "reward_error"}, "alive")


def test_a_strategy_may_return_a_score_with_a_code() -> None:
    pipeline = RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()])
    breakdown = asyncio.run(pipeline.score(EpisodeRecord(final_answer="x")))
    assert breakdown.result == {"matching": 0.0} and breakdown.codes == {"matching": "no_reference"}
    assert breakdown.process == {"tool_calls": 0.0} and isinstance(breakdown.process["tool_calls"], float)
    assert isinstance(breakdown.total, float)
    assert RewardScore(value=1.0).code is None


def test_configuration_errors() -> None:
    with pytest.raises(ValueError, match="unique"):
        RewardPipeline(result=[MatchingReward(), MatchingReward()])
    RewardPipeline(result=[MatchingReward(), MatchingReward(mode="f1", name="f1")])
    with pytest.raises(ValueError, match="unknown strategies: typo"):
        RewardPipeline(result=[MatchingReward()], weights={"typo": 1.0})
    with pytest.raises(TypeError):
        RewardPipeline(result=[ToolCallReward()])  # type: ignore[list-item]


def test_one_pipeline_serves_concurrent_episodes() -> None:
    pipeline = RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()])

    async def main() -> list[float]:
        right = EpisodeRecord(final_answer="\\boxed{Paris}", references=("Paris",))
        wrong = EpisodeRecord(final_answer="\\boxed{Lyon}", references=("Paris",))
        results = await asyncio.gather(*(pipeline.score(e) for e in [right, wrong] * 5))
        return [r.total for r in results]

    assert asyncio.run(main()) == [1.0, 0.0] * 5
