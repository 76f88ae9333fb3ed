"""JudgeReward: an async generate callable grades; failures and garbage give the fallback and a code."""

from __future__ import annotations

import asyncio

import pytest

from agent_env.reward import EpisodeRecord, RewardScore
from agent_env.rewards.judge import JudgeReward, parse_judge_score
from agent_protocol.types import Message

EPISODE = EpisodeRecord(
    prompt=(Message(role="system", content="Be brief."), Message(role="user", content="Capital of France?")),
    final_answer="Paris",
    references=("Paris",),
)


class FakeJudge:
    """An honest stand-in for an engine: records what it was asked and answers from a script."""

    def __init__(self, reply: str | Exception, delay: float = 0.0) -> None:
        self.reply = reply
        self.delay = delay
        self.seen: list[list[Message]] = []

    async def __call__(self, messages: list[Message]) -> str:
        self.seen.append(messages)
        await asyncio.sleep(self.delay)
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


def grade(judge: FakeJudge, **options: object) -> RewardScore:
    reward = JudgeReward(judge, **options)  # type: ignore[arg-type]
    return asyncio.run(reward.score(EPISODE))


def test_the_judge_sees_question_reference_and_answer() -> None:
    judge = FakeJudge("Matches the reference.\nSCORE: 1")
    assert grade(judge) == RewardScore(value=1.0)
    [messages] = judge.seen
    assert [m.role for m in messages] == ["system", "user"]
    assert "SCORE:" in (messages[0].content or "")
    assert (
        messages[1].content == "Question:\nCapital of France?\n\nReference answer:\nParis\n\nCandidate answer:\nParis"
    )


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("SCORE: 0.25", 0.25),
        ("score = 1", 1.0),
        ("**Score:** 7/10", 0.7),
        ("SCORE: 0.1\n...on reflection\nSCORE: 0.9", 0.9),
        ("I think it is right", None),
        ("SCORE: 7", None),
        ("SCORE: -1", None),
        ("SCORE: 3/0", None),
    ],
)
def test_parse_judge_score(reply: str, value: float | None) -> None:
    assert parse_judge_score(reply) == (pytest.approx(value) if value is not None else None)


def test_garbage_gives_the_fallback_and_a_code() -> None:
    result = grade(FakeJudge("Looks fine to me!"), fallback_score=0.5)
    assert result.value == 0.5 and result.code == "judge_unparseable"
    assert result.detail == "Looks fine to me!"


def test_a_failing_judge_gives_the_fallback_and_a_code() -> None:
    result = grade(FakeJudge(ConnectionError("engine down")))
    assert result == RewardScore(value=0.0, code="judge_error", detail="ConnectionError: engine down")


def test_a_slow_judge_times_out() -> None:
    result = grade(FakeJudge("SCORE: 1", delay=5), timeout_s=0.1, fallback_score=0.25)
    assert result == RewardScore(value=0.25, code="judge_timeout")


def test_a_custom_template_must_name_every_field() -> None:
    with pytest.raises(ValueError, match="answer"):
        JudgeReward(FakeJudge("SCORE: 1"), template="Q: {question} R: {reference}")
    judge = FakeJudge("SCORE: 1")
    assert grade(judge, template="{question}|{reference}|{answer}").value == 1.0
    assert judge.seen[0][1].content == "Capital of France?|Paris|Paris"
