"""How users add a reward: subclass `ResultRewardStrategy` (scored once, at the end of an episode) or
`ProcessRewardStrategy` (scored at every step), and return a float or a `RewardScore`.

    class LengthPenalty(ResultRewardStrategy):
        name = "length_penalty"

        async def score(self, episode: EpisodeRecord) -> float:
            return -0.001 * len(episode.answer)

What a strategy sees is plain data: an `EpisodeRecord` (prompt, steps, final answer, references from the
dataset row) and, for process strategies, the `StepRecord` being scored. Strategies hold no per-episode
state, so one strategy object serves every episode, concurrently.

A strategy that cannot score (a judge that timed out, an answer that cannot be parsed) returns
`RewardScore(value=<fallback>, code="<why>")`; one that raises or hangs is caught by `RewardPipeline`, which
uses the strategy's `fallback` value and records the code ``reward_error`` or ``reward_timeout``.

This module knows the protocol's `Action` and `Message`, and the observations; it knows nothing about
engines or tokens.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any

import msgspec

from agent_env.environment import StepResult
from agent_env.observation import Observation
from agent_protocol import Action, Message

__all__ = [
    "EpisodeRecord",
    "ProcessRewardStrategy",
    "ResultRewardStrategy",
    "RewardScore",
    "StepRecord",
    "strategy_name",
]


class StepRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One step as rewards see it. `index` is 0-based; `observations` are what the environment answered."""

    index: int
    action: Action
    observations: tuple[Observation, ...] = ()
    done: bool = False

    @classmethod
    def from_step(cls, action: Action, result: StepResult) -> StepRecord:
        """The record of an environment step: `result` is what `Environment.step(action)` returned."""
        return cls(index=result.step - 1, action=action, observations=result.observations, done=result.done)


class EpisodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A whole episode (or the part of it played so far) as rewards see it.

    `references` are the dataset's reference answers (any one may match); `metadata` holds whatever else
    the dataset row carries.
    """

    prompt: tuple[Message, ...] = ()
    steps: tuple[StepRecord, ...] = ()
    final_answer: str | None = None
    references: tuple[str, ...] = ()
    stop_reason: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def answer(self) -> str:
        """The final answer, or the last turn's content when the episode ended without one."""
        if self.final_answer is not None:
            return self.final_answer
        return self.steps[-1].action.content if self.steps else ""

    @property
    def question(self) -> str:
        """The last user message of the prompt (empty when there is none)."""
        for message in reversed(self.prompt):
            if message.role == "user":
                return message.content or ""
        return ""


class RewardScore(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A strategy's score. `code` says why a fallback was used (machine-readable, for metrics)."""

    value: float
    code: str | None = None
    detail: str | None = None


class ResultRewardStrategy(ABC):
    """A reward computed once, when the episode is over. Set `name` (unique in a pipeline)."""

    name: str = ""
    fallback: float = 0.0

    @abstractmethod
    async def score(self, episode: EpisodeRecord) -> float | RewardScore:
        """Score the finished episode."""


class ProcessRewardStrategy(ABC):
    """A reward computed at every step. `episode.steps[:step.index]` are the steps before this one."""

    name: str = ""
    fallback: float = 0.0

    @abstractmethod
    async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> float | RewardScore:
        """Score one step."""


def strategy_name(strategy: ResultRewardStrategy | ProcessRewardStrategy) -> str:
    """The strategy's `name`, else its class name in snake_case."""
    if strategy.name:
        return strategy.name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(strategy).__name__).lower()
