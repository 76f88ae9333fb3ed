"""A context policy as a user writes one: past `at_tokens`, drop the oldest tool results and go on in a new
segment. It holds settings only; what it decides comes from the `ContextView` it is shown."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from agent_runtime import CONTINUE, ContextDecision, ContextPolicy, ContextView, NewSegment

__all__ = ["DropOldestToolResults"]


@dataclass(frozen=True)
class DropOldestToolResults(ContextPolicy):
    at_tokens: int
    keep_last: int = 1
    placeholder: str = "[an older tool result, dropped to save context]"

    def on_feedback(self, context: ContextView) -> ContextDecision:
        if context.tokens + context.max_new_tokens <= self.at_tokens:
            return CONTINUE
        messages = context.messages
        results = [i for i, m in enumerate(messages) if m.role == "tool" and m.content != self.placeholder]
        dropped = results[: max(0, len(results) - self.keep_last)]
        if not dropped:
            return CONTINUE
        for i in dropped:
            messages[i] = msgspec.structs.replace(messages[i], content=self.placeholder)
        return NewSegment(messages)
