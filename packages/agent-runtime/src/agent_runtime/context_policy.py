"""What an episode does when its context fills up: a `ContextPolicy`, chosen by the recipe (`Recipe.compaction`).

- `BudgetPolicy` (the default): nothing. When the next turn or its feedback does not fit, the episode ends with
  ``context_exhausted``.
- `CompactionPolicy`: when the context would pass `compact_at_tokens` after a turn's feedback (default: 3/4 of
  the context), the feedback also carries an instruction (a user message, rendered through the protocol like
  any other) asking the model for a summary. The summary turn is generated and trained like any other turn
  (loss mask 1) and does not step the environment. A new segment then starts from the system prompt and tools,
  the original task and the summary (`resume_template`). After `max_compactions`, it behaves as `BudgetPolicy`.

`AgentSession` asks the policy two questions, at the two points where a context grows: after a turn's feedback
is rendered (`wants_summary`) and when a summary comes back (`resume_message`). The policy holds settings only,
never episode state, so one policy serves every episode of a recipe. This module knows messages and numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agent_protocol import Message

__all__ = [
    "DEFAULT_COMPACTION_INSTRUCTION",
    "DEFAULT_RESUME_TEMPLATE",
    "BudgetPolicy",
    "CompactionPolicy",
    "ContextPolicy",
]

DEFAULT_COMPACTION_INSTRUCTION: Final = (
    "Your context is nearly full. Summarize the task and everything you have learned so far (facts found, tool "
    "results that matter, what is left to do) in a few sentences. Reply with the summary only; do not call tools."
)
DEFAULT_RESUME_TEMPLATE: Final = "Summary of your work on this task so far:\n{summary}\n\nContinue the task from here."


@dataclass(frozen=True)
class ContextPolicy:
    """The interface, and the plain budget: never asks for a summary."""

    max_compactions: int = 0
    summary_max_new_tokens: int = 512

    def wants_summary(
        self, *, context_tokens: int, max_new_tokens: int, max_context_tokens: int | None, compactions: int
    ) -> bool:
        """After feedback that would leave the context at `context_tokens`: ask for a summary now?"""
        return False

    def instruction(self) -> Message:
        raise NotImplementedError(f"{type(self).__name__} never asks for a summary")

    def resume_message(self, summary: str) -> Message:
        raise NotImplementedError(f"{type(self).__name__} never resumes from a summary")


@dataclass(frozen=True)
class BudgetPolicy(ContextPolicy):
    """End the episode (``context_exhausted``) when the context is full."""


@dataclass(frozen=True)
class CompactionPolicy(ContextPolicy):
    """Summarize and continue from the summary (see the module docstring)."""

    compact_at_tokens: int | None = None
    max_compactions: int = 3
    summary_max_new_tokens: int = 512
    instruction_text: str = DEFAULT_COMPACTION_INSTRUCTION
    resume_template: str = DEFAULT_RESUME_TEMPLATE

    def __post_init__(self) -> None:
        if "{summary}" not in self.resume_template:
            raise ValueError("resume_template must contain '{summary}'")
        if self.max_compactions < 0:
            raise ValueError(f"max_compactions must be >= 0, got {self.max_compactions}")
        if self.summary_max_new_tokens < 1:
            raise ValueError(f"summary_max_new_tokens must be positive, got {self.summary_max_new_tokens}")

    def threshold(self, max_context_tokens: int | None) -> int | None:
        """The context size past which a summary is asked for: `compact_at_tokens`, else 3/4 of the context."""
        if self.compact_at_tokens is not None:
            return self.compact_at_tokens
        return None if max_context_tokens is None else max_context_tokens * 3 // 4

    def wants_summary(
        self, *, context_tokens: int, max_new_tokens: int, max_context_tokens: int | None, compactions: int
    ) -> bool:
        threshold = self.threshold(max_context_tokens)
        if threshold is None or compactions >= self.max_compactions:
            return False
        return context_tokens + max_new_tokens > threshold

    def instruction(self) -> Message:
        return Message(role="user", content=self.instruction_text)

    def resume_message(self, summary: str) -> Message:
        return Message(role="user", content=self.resume_template.format(summary=summary))
