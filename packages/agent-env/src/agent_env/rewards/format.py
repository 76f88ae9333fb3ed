"""`FormatReward`: a process reward for well-formed turns.

Per step: ``ok_reward`` (default 0.0) when the turn parsed cleanly, else ``issue_penalty`` for each parse
issue of the turn (unclosed reasoning, broken tool calls: `Action.issues`), floored at ``min_per_step``.
With ``answer_format`` set (``boxed`` or ``answer_tag``), the final turn (the step that ended the episode
without tool calls) must also carry its answer in that form, or ``missing_answer_penalty`` is added.

This module knows the protocol's `Action`; nothing else.
"""

from __future__ import annotations

from typing import Literal

from agent_env.reward import EpisodeRecord, ProcessRewardStrategy, RewardScore, StepRecord
from agent_env.rewards.answer import extract_answer_tag, extract_boxed

__all__ = ["FormatReward"]


class FormatReward(ProcessRewardStrategy):
    """Penalize malformed turns (and, optionally, a final answer in the wrong form)."""

    name = "format"

    def __init__(
        self,
        *,
        ok_reward: float = 0.0,
        issue_penalty: float = -0.1,
        min_per_step: float = -0.5,
        answer_format: Literal["boxed", "answer_tag"] | None = None,
        missing_answer_penalty: float = -0.2,
        name: str | None = None,
    ) -> None:
        if issue_penalty > 0 or missing_answer_penalty > 0 or min_per_step > 0:
            raise ValueError("issue_penalty, missing_answer_penalty and min_per_step must not be positive")
        if answer_format not in (None, "boxed", "answer_tag"):
            raise ValueError(f"answer_format must be None, 'boxed' or 'answer_tag', got {answer_format!r}")
        self.ok_reward = ok_reward
        self.issue_penalty = issue_penalty
        self.min_per_step = min_per_step
        self.answer_format = answer_format
        self.missing_answer_penalty = missing_answer_penalty
        if name:
            self.name = name

    async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> RewardScore:
        issues = step.action.issues
        value = self.ok_reward if not issues else max(self.min_per_step, len(issues) * self.issue_penalty)
        code: str | None = issues[0].code if issues else None
        if self.answer_format is not None and step.done and not step.action.tool_calls:
            extract = extract_boxed if self.answer_format == "boxed" else extract_answer_tag
            if extract(step.action.content) is None:
                value += self.missing_answer_penalty
                code = code or "missing_answer_format"
        return RewardScore(value=value, code=code)
