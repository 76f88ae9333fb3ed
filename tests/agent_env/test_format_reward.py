"""FormatReward: penalties per parse issue, optional final-answer form."""

from __future__ import annotations

import asyncio

import pytest

from agent_env.reward import EpisodeRecord, RewardScore, StepRecord
from agent_env.rewards.format import FormatReward
from agent_protocol.types import Action, ParseIssue, ToolCall


def score(reward: FormatReward, action: Action, *, done: bool = False) -> RewardScore:
    step = StepRecord(index=0, action=action, done=done)
    return asyncio.run(reward.score_step(step, EpisodeRecord(steps=(step,))))


BROKEN = ToolCall(id="b", name="x", error=ParseIssue(code="invalid_json", message="m"))
UNCLOSED = ParseIssue(code="missing_think_end", message="m")


def test_clean_turn_gets_the_ok_reward() -> None:
    assert score(FormatReward(ok_reward=0.1), Action(content="hi")) == RewardScore(value=0.1)


def test_each_issue_costs_and_the_floor_holds() -> None:
    reward = FormatReward(issue_penalty=-0.2, min_per_step=-0.3)
    assert score(reward, Action(tool_calls=(BROKEN,))) == RewardScore(value=-0.2, code="invalid_json")
    assert score(reward, Action(tool_calls=(BROKEN, BROKEN), error=UNCLOSED)).value == -0.3


def test_final_answer_form() -> None:
    reward = FormatReward(answer_format="boxed", missing_answer_penalty=-0.5)
    assert score(reward, Action(content="\\boxed{3}"), done=True) == RewardScore(value=0.0)
    assert score(reward, Action(content="3"), done=True) == RewardScore(value=-0.5, code="missing_answer_format")
    assert score(reward, Action(content="3"), done=False).value == 0.0  # not the final turn
    tagged = FormatReward(answer_format="answer_tag")
    assert score(tagged, Action(content="<answer>3</answer>"), done=True).value == 0.0


def test_rejects_positive_penalties() -> None:
    with pytest.raises(ValueError):
        FormatReward(issue_penalty=0.5)
