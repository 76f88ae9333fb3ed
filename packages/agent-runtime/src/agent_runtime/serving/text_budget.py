"""`check_text_fits`: refuse a conversation whose text cannot fit the model's context, by its length alone, before
any of it is tokenized.

Tokenizing is the expensive step of a request that will be refused anyway: a 4 MB message takes seconds of CPU
and hundreds of MB that the allocator keeps. A token covers a bounded number of characters, so a conversation of
`chars` characters needs at least ``chars / max_chars_per_token`` tokens, plus one of markup per message; when
that is already more than the context holds, the answer is a 400 at once. The bound is generous (32 by default:
ordinary text averages about 4 characters per token and code under 10), so a conversation that could fit is
refused here only if it is made mostly of the longest tokens a vocabulary has (runs of spaces, rule lines); the
exact check on the token count still follows for everything that passes.

This module knows messages, tool specs and the error wire format; nothing about tokenizers or HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import msgspec

from agent_protocol import Message, ToolSpec
from agent_runtime.serving.api_error import ApiError

__all__ = ["check_message_count", "check_text_fits", "text_length"]

_encoder: Final = msgspec.json.Encoder()


def text_length(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> int:
    """The characters of text the conversation's prompt will carry (the chat format's own markup not counted,
    so this is a lower bound)."""
    total = 0
    for m in messages:
        total += len(m.content or "") + len(m.reasoning_content or "") + len(m.name or "") + len(m.tool_call_id or "")
        for call in m.tool_calls:
            total += len(call.name) + len(_encoder.encode(call.arguments))
    for spec in tools:
        total += len(_encoder.encode(spec))
    return total


def check_message_count(count: int, *, context_tokens: int) -> None:
    """The cheapest check, before the messages are even converted: each needs at least one token of markup."""
    if count > context_tokens:
        raise ApiError(
            400,
            f"the conversation has {count} messages, each at least one token; the model's context holds "
            f"{context_tokens}; shorten it",
            param="messages",
            code="context_length_exceeded",
        )


def check_text_fits(
    messages: Sequence[Message], tools: Sequence[ToolSpec], *, context_tokens: int, max_chars_per_token: float
) -> None:
    """Raise `ApiError` 400 (`context_length_exceeded`) when the conversation needs more tokens than
    `context_tokens`, counting at most `max_chars_per_token` characters per token and at least one token of markup
    per message."""
    chars = text_length(messages, tools)
    least = math.ceil(chars / max_chars_per_token) + len(messages)
    if least > context_tokens:
        raise ApiError(
            400,
            f"the conversation ({len(messages)} messages, {chars} characters of text) needs at least {least} "
            f"tokens (at most {max_chars_per_token:g} characters per token, at least one token per message); "
            f"the model's context holds {context_tokens}; shorten it",
            param="messages",
            code="context_length_exceeded",
        )
