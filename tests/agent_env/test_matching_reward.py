"""MatchingReward: exact, normalized, contains, F1; best over references; defined codes."""

from __future__ import annotations

import asyncio

import pytest

from agent_env.reward import EpisodeRecord, RewardScore
from agent_env.rewards.answer import ExtractMethod
from agent_env.rewards.matching import MatchingReward, MatchMode


def score(reward: MatchingReward, answer: str, *references: str) -> RewardScore:
    return asyncio.run(reward.score(EpisodeRecord(final_answer=answer, references=references)))


@pytest.mark.parametrize(
    ("mode", "answer", "reference", "value"),
    [
        ("exact", "\\boxed{Paris}", "Paris", 1.0),
        ("exact", "\\boxed{paris}", "Paris", 0.0),
        ("normalized", "The answer is: the Eiffel Tower.", "eiffel tower", 1.0),
        ("normalized", "\\boxed{Lyon}", "Paris", 0.0),
        ("contains", "It is in Paris, France", "paris", 1.0),
        ("contains", "It is in Parisville", "paris", 0.0),
        ("f1", "Paris France", "Paris", 2 / 3),
    ],
)
def test_modes(mode: MatchMode, answer: str, reference: str, value: float) -> None:
    extract: ExtractMethod = "none" if mode == "contains" else "auto"
    reward = MatchingReward(mode=mode, extract=extract)
    assert score(reward, answer, reference).value == pytest.approx(value)


def test_best_reference_wins() -> None:
    assert score(MatchingReward(), "\\boxed{NYC}", "New York", "NYC").value == 1.0


def test_missing_reference_and_missing_answer_have_codes() -> None:
    assert score(MatchingReward(), "x") == RewardScore(value=0.0, code="no_reference")
    assert score(MatchingReward(extract="boxed"), "no box", "x") == RewardScore(value=0.0, code="no_answer")


def test_falls_back_to_the_last_turn_when_there_is_no_final_answer() -> None:
    from agent_env.reward import StepRecord
    from agent_protocol.types import Action

    episode = EpisodeRecord(steps=(StepRecord(index=0, action=Action(content="\\boxed{3}")),), references=("3",))
    assert asyncio.run(MatchingReward().score(episode)).value == 1.0


def test_bad_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="mode"):
        MatchingReward(mode="fuzzy")  # type: ignore[arg-type]
