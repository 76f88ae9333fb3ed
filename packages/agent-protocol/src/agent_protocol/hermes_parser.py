"""Tolerant parsing of one generated assistant turn in the Hermes / Qwen JSON format.

    <think>reasoning</think>

    content
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Nothing here raises on model output: a broken block becomes a `ToolCall` carrying a `ParseIssue`, unclosed
reasoning becomes an `Action.error`. A `<tool_call>` written inside `<think>` is reasoning, not a call.

Choices, each the inverse of what the Qwen3 chat template renders, so that parse(render(turn)) == turn:
- reasoning is the text between `<think>` and the first `</think>`, stripped of newlines at both ends; content
  starts after `</think>` with leading newlines removed;
- the one newline the template puts between content and the first `<tool_call>` is removed from the content;
- only `<tool_call>` blocks are calls. Bare JSON, Markdown fences and `<function=...>` variants stay content:
  the template never renders them, so accepting them would train a format that the transcript cannot
  reproduce when the conversation is rendered again.
This module knows the tag strings and JSON; it knows nothing about tokens.
"""

from __future__ import annotations

import json
from typing import Final

from agent_protocol.broken_call import raw_preview
from agent_protocol.chatml import strip_end_marker
from agent_protocol.errors import JsonLimitError
from agent_protocol.json_call import arguments_object, json_kind
from agent_protocol.json_limits import loads_bounded
from agent_protocol.types import Action, ParseIssue, ToolCall

__all__ = ["MISSING_THINK_END", "parse_hermes_turn", "split_reasoning", "split_tool_calls"]

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
CALL_OPEN: Final = "<tool_call>"
CALL_CLOSE: Final = "</tool_call>"


#: the issue of a thinking turn whose reasoning has no `</think>`, for every family that reads `<think>` reasoning
MISSING_THINK_END: Final = ParseIssue(
    code="missing_think_end",
    message="Your reasoning was never closed with </think>, so no answer or tool call was read. "
    "Close the reasoning with </think> before answering or calling a tool.",
)


def parse_hermes_turn(text: str, *, reasoning_open: bool = False, call_id_prefix: str = "call") -> Action:
    """Parse one assistant turn. `reasoning_open` says the prompt already opened `<think>` (Qwen3 thinking
    models), so the text starts inside the reasoning."""
    reasoning, content, issue = split_reasoning(strip_end_marker(text), reasoning_open=reasoning_open)
    if issue is not None:
        return Action(content="", reasoning_content=reasoning, error=issue)
    content, calls = split_tool_calls(content, call_id_prefix=call_id_prefix)
    return Action(content=content, reasoning_content=reasoning, tool_calls=tuple(calls))


def split_reasoning(text: str, *, reasoning_open: bool = False) -> tuple[str | None, str, ParseIssue | None]:
    """Return (reasoning or None, content, issue). Unclosed reasoning keeps all the text as reasoning."""
    close_at = text.find(THINK_CLOSE)
    if close_at >= 0:
        before = text[:close_at]
        open_at = before.find(THINK_OPEN)
        reasoning = before[open_at + len(THINK_OPEN) :] if open_at >= 0 else before
        # Text before an explicit <think> (rare) is kept as content rather than dropped.
        lead = before[:open_at] if open_at > 0 else ""
        content = lead + text[close_at + len(THINK_CLOSE) :].lstrip("\n")
        return reasoning.strip("\n"), content, None
    open_at = text.find(THINK_OPEN)
    if open_at >= 0 or reasoning_open:
        reasoning = text[open_at + len(THINK_OPEN) :] if open_at >= 0 else text
        return reasoning.strip("\n"), "", MISSING_THINK_END
    return None, text, None


def split_tool_calls(content: str, *, call_id_prefix: str = "call") -> tuple[str, list[ToolCall]]:
    """Cut every `<tool_call>` block out of `content`; return the remaining text and the calls in order."""
    first = content.find(CALL_OPEN)
    if first < 0:
        return content, []
    pieces = [content[:first].removesuffix("\n")]
    calls: list[ToolCall] = []
    pos = first
    while pos >= 0:
        body_start = pos + len(CALL_OPEN)
        close = content.find(CALL_CLOSE, body_start)
        closed = close >= 0
        body = content[body_start:close] if closed else content[body_start:]
        calls.append(_parse_call_body(body, closed=closed, call_id=f"{call_id_prefix}_{len(calls)}"))
        if not closed:
            break
        after = close + len(CALL_CLOSE)
        pos = content.find(CALL_OPEN, after)
        between = content[after:pos] if pos >= 0 else content[after:]
        if between.strip():
            pieces.append(between.strip())
    return "\n".join(piece for piece in pieces if piece), calls


def _parse_call_body(body: str, *, closed: bool, call_id: str) -> ToolCall:
    raw = raw_preview(body)
    try:
        payload = loads_bounded(body)
    except JsonLimitError as e:
        issue = ParseIssue(
            code="invalid_json",
            message=f"The tool call cannot be read: {e}. Write a plain "
            '{"name": <function-name>, "arguments": <args-json-object>} inside <tool_call></tool_call>.',
        )
        return ToolCall(id=call_id, name="", error=issue, raw=raw)
    except json.JSONDecodeError as e:
        if closed:
            issue = ParseIssue(
                code="invalid_json",
                message=f"The tool call is not valid JSON ({e.msg} at character {e.pos}). Write "
                '{"name": <function-name>, "arguments": <args-json-object>} inside <tool_call></tool_call>.',
            )
        else:
            issue = ParseIssue(
                code="unclosed_tag",
                message="The tool call was cut off before </tool_call> and its JSON is incomplete.",
            )
        return ToolCall(id=call_id, name="", error=issue, raw=raw)
    if not isinstance(payload, dict):
        return ToolCall(
            id=call_id,
            name="",
            raw=raw,
            error=ParseIssue(
                code="invalid_json",
                message=f"The tool call must be a JSON object, not {json_kind(payload)}.",
            ),
        )
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCall(
            id=call_id,
            name="",
            raw=raw,
            error=ParseIssue(code="missing_name", message='The tool call has no "name" string.'),
        )
    arguments, problem = arguments_object(payload.get("arguments", {}))
    if problem is not None:
        return ToolCall(
            id=call_id,
            name=name,
            raw=raw,
            error=ParseIssue(code="invalid_arguments", message=problem),
        )
    return ToolCall(id=call_id, name=name, arguments=arguments)
