"""What an environment says back to the model: one `Observation` per tool call, as a tool message.

A successful call's observation carries the tool's output as plain text, and the images the tool returned
(`images`: data URLs or references, checked by the tool runner; the tool message shows them before the text).
Every failure carries JSON text the
model can read and a machine-readable `code` that rewards and metrics use::

    {"ok":false,"error":{"code":"unknown_tool","message":"no tool named 'serch'"},"hint":"Call one of: search."}

The codes are a closed set (`ObservationCode`):

=================  ========================================================================================
code               meaning
=================  ========================================================================================
output_truncated   the tool ran and succeeded, but its output was cut at the limit (``ok`` stays True)
unknown_tool       the call named a tool the environment does not have
invalid_arguments  the arguments failed the tool's schema (the message names the field), or the protocol
                   could not read them as a JSON object
too_many_calls     the turn made more calls than the environment runs in one step; the rest were refused
tool_error         the tool ran and failed (it raised; the message gives the exception type and text)
timeout            the tool did not finish within its time limit
invalid_json       passed through from the protocol: the call's body was not valid JSON
missing_name       passed through from the protocol: the call had no tool name
unclosed_tag       passed through from the protocol: the call was cut off before it was closed
missing_think_end  passed through from the protocol: the turn opened reasoning and never closed it
malformed_turn     passed through from the protocol: part of the turn was not in the model's format (e.g. an
                   unknown harmony channel); what could be read was kept
parse_error        any other protocol parse issue (a code this layer does not know yet)
tool_unavailable   the tool was not started: too many of its earlier calls still hang past their timeout,
                   or the process runs too many worker threads (the message says which cap)
invalid_image      the tool ran, but an image it returned cannot be shown: unreadable, not a PNG, JPEG,
                   GIF, WebP or BMP image, over the byte or pixel limit, or one image too many (the message
                   names the image, ``images[k]``, and what is wrong)
=================  ========================================================================================

This module knows the codes and the wire shape of an observation; it does not run tools or know any chat
format (the protocol renders `to_message()` the way the model's template does).
"""

from __future__ import annotations

from typing import Final, Literal, get_args

import msgspec

from agent_protocol import ImagePart, Message, ParseIssue

__all__ = [
    "FAILURE_CODES",
    "PARSE_CODES",
    "REFUSAL_CODES",
    "Observation",
    "ObservationCode",
    "error_content",
]

ObservationCode = Literal[
    "output_truncated",
    "unknown_tool",
    "invalid_arguments",
    "too_many_calls",
    "tool_error",
    "timeout",
    "invalid_json",
    "missing_name",
    "unclosed_tag",
    "missing_think_end",
    "malformed_turn",
    "parse_error",
    "tool_unavailable",
    "invalid_image",
]

_ALL_CODES: Final[frozenset[str]] = frozenset(get_args(ObservationCode))

PARSE_CODES: Final[frozenset[str]] = frozenset(
    {"invalid_json", "missing_name", "unclosed_tag", "missing_think_end", "malformed_turn", "parse_error"}
)
"""Codes that come from the protocol's parser: the model's output could not be read as a call."""

REFUSAL_CODES: Final[frozenset[str]] = frozenset({"unknown_tool", "invalid_arguments", "too_many_calls"})
"""Codes for a readable call that the environment refused to run."""

FAILURE_CODES: Final[frozenset[str]] = frozenset({"tool_error", "timeout", "tool_unavailable", "invalid_image"})
"""Codes for a call that failed through no fault of the call itself (it ran and failed, its tool is stuck, or
its tool returned an image that cannot be shown)."""

_DEFAULT_HINTS: Final[dict[str, str]] = {
    "unknown_tool": "Call one of the tools listed in the instructions.",
    "invalid_arguments": "Fix the arguments so they match the tool's parameters, then call it again.",
    "too_many_calls": "Make fewer tool calls in one turn.",
    "tool_error": "Check the arguments or try a different approach.",
    "timeout": "The tool took too long; try a smaller or simpler request.",
    "invalid_json": 'Write the call as a JSON object: {"name": "...", "arguments": {...}}.',
    "missing_name": 'Give the call a "name" that is one of the listed tools.',
    "unclosed_tag": "The call was cut off; write it again, complete and shorter.",
    "missing_think_end": "Close your reasoning before you call a tool or give the answer.",
    "malformed_turn": "Write every part of your turn in the format the instructions show.",
    "parse_error": "The tool call could not be read; write it again.",
    "tool_unavailable": "This tool is stuck right now; do not call it again soon: use another tool or answer.",
    "invalid_image": "The tool's image could not be shown; ask for a smaller region or fewer images, or go on "
    "without it.",
}


class _ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str


class _ErrorContent(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    error: _ErrorDetail
    hint: str


_encoder: Final = msgspec.json.Encoder()


def error_content(code: ObservationCode, message: str, hint: str | None = None) -> str:
    """The JSON text a failed observation shows the model. `hint` defaults to the code's standard hint."""
    body = _ErrorContent(
        ok=False,
        error=_ErrorDetail(code=code, message=message),
        hint=hint if hint is not None else _DEFAULT_HINTS.get(code, ""),
    )
    return _encoder.encode(body).decode()


class Observation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The result of one tool call (or a turn-level notice, which has no `tool_call_id`).

    `ok` is False exactly when the call failed or was refused; `code` is None for a clean success,
    ``output_truncated`` for a success whose output was cut (the text only; images are never cut), and an error
    code otherwise. `images` holds the image references a successful call returned (empty, and left out of the
    stored record, for a text-only one, so records written before images existed decode unchanged).
    """

    tool_call_id: str | None
    name: str
    content: str
    ok: bool = True
    code: ObservationCode | None = None
    elapsed_s: float = 0.0
    images: tuple[str, ...] = ()

    @classmethod
    def failure(
        cls,
        *,
        tool_call_id: str | None,
        name: str,
        code: ObservationCode,
        message: str,
        hint: str | None = None,
        elapsed_s: float = 0.0,
    ) -> Observation:
        return cls(
            tool_call_id=tool_call_id,
            name=name,
            content=error_content(code, message, hint),
            ok=False,
            code=code,
            elapsed_s=elapsed_s,
        )

    @classmethod
    def from_parse_issue(cls, issue: ParseIssue, *, tool_call_id: str | None, name: str) -> Observation:
        """Answer a call (or a turn) the protocol could not parse, passing its code through."""
        code: ObservationCode = issue.code if issue.code in _ALL_CODES else "parse_error"
        return cls.failure(tool_call_id=tool_call_id, name=name, code=code, message=issue.message)

    def to_message(self) -> Message:
        """The tool message this observation stands for: its images, in order, before its text."""
        return Message(
            role="tool",
            content=self.content,
            tool_call_id=self.tool_call_id,
            name=self.name or None,
            images=tuple(ImagePart(url=url, offset=0) for url in self.images),
        )
