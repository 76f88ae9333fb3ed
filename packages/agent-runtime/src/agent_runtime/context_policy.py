"""What an episode does as its context grows: a `ContextPolicy`, chosen by the recipe (`Recipe.context`).

A policy is a strategy object asked at the two points where a context grows, and it answers with a decision:

- `on_feedback(context)`: a turn's feedback (tool results, a user message) is rendered and about to be appended;
  `context.tokens` is what the context would hold with it. `Continue()` appends it (the episode still ends with
  ``context_exhausted`` when it does not fit), `End(...)` ends the episode, `Summarize(...)` appends it with an
  instruction asking the model for a summary (the next generation is a summary turn), and `NewSegment(messages)`
  starts a new context (a new token segment, trained on its own) rendered from the messages the policy returns.
- `on_summary(reply, context)`: a summary turn came back; `NewSegment` goes on from it, `End` ends the episode.

The policies shipped here:

- `BudgetPolicy` (the default): always `Continue()`. When the next turn or its feedback does not fit, the episode
  ends with ``context_exhausted``.
- `CompactionPolicy`: when the context would pass `compact_at_tokens` after a turn's feedback (default: 3/4 of
  the context), the feedback also carries an instruction (a user message, rendered through the protocol like
  any other) asking the model for a summary. The summary turn is generated and trained like any other turn
  (loss mask 1) and does not step the environment. A new segment then starts from the system prompt and tools,
  the original task and the summary (`resume_template`). After `max_compactions`, it behaves as `BudgetPolicy`.

A policy of one's own is a small class (`tests/support/drop_tool_results.py` drops the oldest tool results and
goes on in a new segment, in twenty lines). A policy holds settings only, never episode state: one policy serves
every episode of a recipe, and what an episode did (its compactions, summaries) is in the `ContextView` it is
shown (`agent_runtime.context_state` keeps it and applies the decisions). This module knows messages and numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from agent_protocol import Action, Message

__all__ = [
    "CONTINUE",
    "DEFAULT_COMPACTION_INSTRUCTION",
    "DEFAULT_RESUME_TEMPLATE",
    "BudgetPolicy",
    "CompactionPolicy",
    "ContextDecision",
    "ContextPolicy",
    "ContextView",
    "Continue",
    "End",
    "NewSegment",
    "Summarize",
]

DEFAULT_COMPACTION_INSTRUCTION: Final = (
    "Your context is nearly full. Summarize the task and everything you have learned so far (facts found, tool "
    "results that matter, what is left to do) in a few sentences. Reply with the summary only; do not call tools."
)
DEFAULT_RESUME_TEMPLATE: Final = "Summary of your work on this task so far:\n{summary}\n\nContinue the task from here."


class ContextView(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy is shown at a point where the context grows (built per turn, so a Struct: cheap to make)."""

    #: tokens the current context would hold with the feedback (after a summary: the context as it is)
    tokens: int
    max_new_tokens: int
    max_context_tokens: int | None
    #: new segments this episode has started so far (compactions)
    compactions: int
    #: the episode's prompt (system prompt and task), as `reset` was given it
    prompt: Sequence[Message]
    #: the episode's messages so far (every segment's), without the feedback
    history: Sequence[Message]
    #: the feedback about to be appended (empty after a summary)
    feedback: Sequence[Message] = ()

    @property
    def messages(self) -> list[Message]:
        """The whole conversation as it would stand with the feedback (a new list: built only when asked)."""
        return [*self.history, *self.feedback]


@dataclass(frozen=True)
class Continue:
    """Append the feedback and go on."""


@dataclass(frozen=True)
class End:
    """End the episode with `code` (its stop reason), recorded with `message`."""

    message: str
    code: Literal["context_exhausted", "compaction_failed"] = "context_exhausted"


@dataclass(frozen=True)
class Summarize:
    """Append the feedback and `instruction`; the next generation is a summary turn of `max_new_tokens`."""

    instruction: Message
    max_new_tokens: int


@dataclass(frozen=True)
class NewSegment:
    """Start a new context rendered from `messages` (as a prompt: the next turn follows them). The episode's
    messages gain the feedback and `added` (a compaction's resume message): the record keeps everything."""

    messages: Sequence[Message]
    added: Sequence[Message] = field(default=())
    #: the summary the new segment goes on from (compaction), kept on the episode
    summary: str | None = None


ContextDecision = Continue | End | Summarize | NewSegment

CONTINUE: Final = Continue()


@dataclass(frozen=True)
class ContextPolicy:
    """The interface; on its own the plain budget. Subclass it and override `on_feedback` (and `on_summary` when
    the policy asks for summaries)."""

    def on_feedback(self, context: ContextView) -> ContextDecision:
        """A turn's feedback would bring the context to `context.tokens`: what now?"""
        return CONTINUE

    def on_summary(self, reply: Action, context: ContextView) -> ContextDecision:
        """A summary turn (asked for by `Summarize`) came back as `reply`: what now?"""
        return End(f"{type(self).__name__} got a summary it never asked for", code="compaction_failed")

    def generation_cap(self, max_new_tokens: int) -> int:
        """The most new tokens one generation of an episode may ask for (a summary may ask more than a turn)."""
        return max_new_tokens


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
        """Whether a context of `context_tokens` (and the next turn's `max_new_tokens`) passes the threshold."""
        threshold = self.threshold(max_context_tokens)
        if threshold is None or compactions >= self.max_compactions:
            return False
        return context_tokens + max_new_tokens > threshold

    def on_feedback(self, context: ContextView) -> ContextDecision:
        asks = self.wants_summary(
            context_tokens=context.tokens,
            max_new_tokens=context.max_new_tokens,
            max_context_tokens=context.max_context_tokens,
            compactions=context.compactions,
        )
        return Summarize(self.instruction(), self.summary_max_new_tokens) if asks else CONTINUE

    def on_summary(self, reply: Action, context: ContextView) -> ContextDecision:
        summary = reply.content.strip() or (reply.reasoning_content or "").strip()
        if not summary:
            return End("the model's summary was empty", code="compaction_failed")
        resume = self.resume_message(summary)
        return NewSegment([*context.prompt, resume], added=[resume], summary=summary)

    def generation_cap(self, max_new_tokens: int) -> int:
        return max(max_new_tokens, self.summary_max_new_tokens)

    def instruction(self) -> Message:
        return Message(role="user", content=self.instruction_text)

    def resume_message(self, summary: str) -> Message:
        return Message(role="user", content=self.resume_template.format(summary=summary))
