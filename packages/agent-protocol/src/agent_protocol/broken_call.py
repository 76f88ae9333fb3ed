"""A tool call that could not be read, as every family's parser keeps it: a `ToolCall` with a coded `ParseIssue`
and the start of the text it was read from, so the environment can answer it and a trajectory shows what the
model wrote without storing a runaway generation twice. This module knows `ToolCall`; the codes and messages are
each parser's.
"""

from __future__ import annotations

from typing import Final

from agent_protocol.types import IssueCode, ParseIssue, ToolCall

__all__ = ["RAW_PREVIEW_CHARS", "broken_call", "raw_preview"]

#: how much of a broken call's text is kept on it (`ToolCall.raw`)
RAW_PREVIEW_CHARS: Final = 200


def raw_preview(text: str) -> str:
    """`text`, cut to `RAW_PREVIEW_CHARS` characters with "..." when it is longer."""
    return text if len(text) <= RAW_PREVIEW_CHARS else text[:RAW_PREVIEW_CHARS] + "..."


def broken_call(call_id: str, raw: str, code: IssueCode, message: str, *, name: str = "") -> ToolCall:
    """The call `call_id` read from `raw`, which failed with `code` for the reason `message`; `name` when the
    function name was read before the failure."""
    return ToolCall(id=call_id, name=name, raw=raw_preview(raw), error=ParseIssue(code=code, message=message))
