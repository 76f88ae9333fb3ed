"""`ToolCallReward`: a process reward for how a step used its tools.

Per step: ``per_call`` for every call that ran and succeeded (``ok`` observations, truncated output
included), at most ``max_per_step`` per step and ``max_per_episode`` over the episode (bonuses are granted in
step order until the episode cap is spent); plus a penalty for every call the protocol could not parse
(``parse_error_penalty``), every call the environment refused (unknown tool, invalid arguments, too many
calls: ``refused_penalty``) and every call that ran and failed (tool error, timeout: ``failed_penalty``, 0 by
default, since a failing tool is not always the model's fault). Penalties are not capped.

Calls are matched with their observations by position (the environment answers every call, in call order)
and checked by `tool_call_id`. This module knows observations and the protocol's `Action`; nothing else.
"""

from __future__ import annotations

import msgspec

from agent_env.observation import FAILURE_CODES, REFUSAL_CODES, Observation
from agent_env.reward import EpisodeRecord, ProcessRewardStrategy, RewardScore, StepRecord

__all__ = ["CallCounts", "ToolCallReward", "count_calls"]


class CallCounts(msgspec.Struct, frozen=True, kw_only=True):
    succeeded: int = 0
    parse_errors: int = 0
    refused: int = 0
    failed: int = 0


def count_calls(step: StepRecord) -> CallCounts:
    """How the calls of one step fared."""
    by_id: dict[str, Observation] = {}
    for observation in step.observations:
        if observation.tool_call_id is not None:
            by_id.setdefault(observation.tool_call_id, observation)
    succeeded = parse_errors = refused = failed = 0
    for position, call in enumerate(step.action.tool_calls):
        if call.error is not None:
            parse_errors += 1
            continue
        answer = step.observations[position] if position < len(step.observations) else None
        if answer is None or answer.tool_call_id != call.id:
            answer = by_id.get(call.id)
        if answer is None:
            continue
        if answer.ok:
            succeeded += 1
        elif answer.code in REFUSAL_CODES:
            refused += 1
        elif answer.code in FAILURE_CODES:
            failed += 1
        else:
            parse_errors += 1
    return CallCounts(succeeded=succeeded, parse_errors=parse_errors, refused=refused, failed=failed)


class ToolCallReward(ProcessRewardStrategy):
    """Reward per successful tool call, with caps; penalties for broken and refused calls."""

    name = "tool_calls"

    def __init__(
        self,
        *,
        per_call: float = 0.1,
        max_per_step: float = 0.3,
        max_per_episode: float = 0.5,
        parse_error_penalty: float = -0.2,
        refused_penalty: float = -0.1,
        failed_penalty: float = 0.0,
        name: str | None = None,
    ) -> None:
        if min(per_call, max_per_step, max_per_episode) < 0:
            raise ValueError("per_call, max_per_step and max_per_episode must not be negative")
        if max(parse_error_penalty, refused_penalty, failed_penalty) > 0:
            raise ValueError("penalties must be zero or negative")
        self.per_call = per_call
        self.max_per_step = max_per_step
        self.max_per_episode = max_per_episode
        self.parse_error_penalty = parse_error_penalty
        self.refused_penalty = refused_penalty
        self.failed_penalty = failed_penalty
        if name:
            self.name = name

    def _bonus(self, counts: CallCounts) -> float:
        return min(self.per_call * counts.succeeded, self.max_per_step)

    async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> RewardScore:
        counts = count_calls(step)
        granted = 0.0
        for earlier in episode.steps[: step.index]:
            granted = min(self.max_per_episode, granted + self._bonus(count_calls(earlier)))
        bonus = min(self._bonus(counts), self.max_per_episode - granted)
        penalty = (
            counts.parse_errors * self.parse_error_penalty
            + counts.refused * self.refused_penalty
            + counts.failed * self.failed_penalty
        )
        return RewardScore(value=bonus + penalty)
