"""The typed events `AgentRuntime` yields while an episode runs: a tagged union of msgspec Structs, so a server can
stream them as JSON (`{"type": "tool_call", ...}`) and a client can decode them back. Knows nothing about HTTP.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agent_protocol import ToolCall
from agent_runtime.trajectory import Usage

__all__ = [
    "AssistantEvent",
    "CompactionEvent",
    "ErrorEvent",
    "Event",
    "FinalEvent",
    "ToolCallEvent",
    "ToolResultEvent",
    "event_to_dict",
]


class AssistantEvent(msgspec.Struct, frozen=True, kw_only=True, tag="assistant"):
    """A generated turn: its visible content and reasoning (tool calls follow as their own events)."""

    turn: int
    content: str
    reasoning_content: str | None = None
    tokens: int = 0
    finish_reason: str = "stop"


class ToolCallEvent(msgspec.Struct, frozen=True, kw_only=True, tag="tool_call"):
    turn: int
    call: ToolCall


class ToolResultEvent(msgspec.Struct, frozen=True, kw_only=True, tag="tool_result"):
    turn: int
    tool_call_id: str | None
    name: str
    content: str
    ok: bool = True
    code: str | None = None


class CompactionEvent(msgspec.Struct, frozen=True, kw_only=True, tag="compaction"):
    """A new context segment starts: from the model's `summary` (compaction), or, with `summary` empty, from the
    messages the context policy rewrote at a turn's feedback (after that turn's tool results)."""

    segment: int
    summary: str
    prompt_tokens: int


class FinalEvent(msgspec.Struct, frozen=True, kw_only=True, tag="final"):
    """The episode is over. `answer` is None when it ended without one (see `stop_reason`)."""

    answer: str | None
    stop_reason: str | None
    reward: float
    usage: Usage


class ErrorEvent(msgspec.Struct, frozen=True, kw_only=True, tag="error"):
    """Something outside the model's control ended the episode (e.g. the engine failed)."""

    code: str
    message: str


Event = AssistantEvent | ToolCallEvent | ToolResultEvent | CompactionEvent | FinalEvent | ErrorEvent


def event_to_dict(event: Event) -> dict[str, Any]:
    """JSON-ready dict with the `type` tag."""
    return msgspec.to_builtins(event)  # type: ignore[no-any-return]
