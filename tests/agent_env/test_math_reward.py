"""MathReward: math-verify decides equivalence; failures are scores with codes."""

from __future__ import annotations

import asyncio
import time

import pytest

from agent_env.reward import EpisodeRecord, RewardScore
from agent_env.rewards.math import MathReward


def score(answer: str, *references: str, reward: MathReward | None = None) -> RewardScore:
    return asyncio.run((reward or MathReward()).score(EpisodeRecord(final_answer=answer, references=references)))


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("The answer is \\boxed{42}.", "42"),
        ("so $\\boxed{0.5}$", "\\frac{1}{2}"),
        ("Answer: \\boxed{\\frac{2}{4}}", "1/2"),
        ("\\boxed{1 + x^2}", "x^2+1"),
    ],
)
def test_equivalent_answers_score_one(answer: str, reference: str) -> None:
    assert score(answer, reference) == RewardScore(value=1.0)


def test_wrong_answer_scores_zero_without_a_code() -> None:
    assert score("\\boxed{41}", "42") == RewardScore(value=0.0)
    assert score("\\boxed{41}", "40", "41").value == 1.0


def test_defined_codes() -> None:
    assert score("\\boxed{1}") == RewardScore(value=0.0, code="no_reference")
    assert score("no maths at all", "42").code == "no_answer"


def test_a_slow_verification_is_abandoned_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent_env.rewards.math as module

    def stuck(answer: str, references: tuple[str, ...]) -> RewardScore:
        time.sleep(5)
        return RewardScore(value=1.0)

    monkeypatch.setattr(module, "_verify", stuck)
    started = time.monotonic()
    result = score("\\boxed{1}", "1", reward=MathReward(timeout_s=0.2))
    assert result == RewardScore(value=0.0, code="math_verify_timeout")
    assert time.monotonic() - started < 2


def test_an_error_inside_math_verify_is_a_code(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent_env.rewards.math as module

    def broken(text: str, **options: object) -> list[object]:
        raise RecursionError("too deep")

    monkeypatch.setattr(module, "parse", broken)
    result = score("\\boxed{1}", "1")
    assert result.value == 0.0 and result.code == "math_verify_error"
    assert result.detail == "RecursionError: too deep"
