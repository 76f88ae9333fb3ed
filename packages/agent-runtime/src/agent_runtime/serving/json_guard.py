"""The shape limits a request body must meet before any recursive decoder touches it: nesting no deeper than
`MAX_JSON_DEPTH`, numbers no longer than `MAX_NUMBER_DIGITS` digits, and no escape of half a UTF-16 surrogate
pair (``"\\ud800"``: not text; msgspec refuses it with a misleading message about truncated input).

msgspec (like `json`) decodes nested arrays and objects by recursion: a body nesting 100,000 brackets raises
`RecursionError` from inside the decoder, and an integer of thousands of digits either fails there or becomes a
Python int that later code cannot turn back into text (CPython refuses over 4,300 digits). `check_json_body`
finds both without recursing and without decoding: strings are cut out (split on the quotes once escapes are
dropped), the brackets left are summed into a running depth and the digits left are searched, all in C-speed
bytes operations. Only a body that breaks a limit
is walked token by token, to name the field the way a user writes it (``messages[0].content``), for a 400.

This module knows JSON's lexical structure and the error wire format; nothing about chat completions.
"""

from __future__ import annotations

import operator
import re
from itertools import accumulate, count
from typing import Final

from agent_runtime.serving.api_error import ApiError

__all__ = ["MAX_JSON_DEPTH", "MAX_NUMBER_DIGITS", "check_json_body"]

MAX_JSON_DEPTH: Final = 128
"""Deepest nesting of arrays and objects in a body, counted from the body itself (a request's own fields are at
depth 1, a tool's JSON schema starts at depth 5). Real requests stay far below it."""

MAX_NUMBER_DIGITS: Final = 256
"""Most digits in one run of a number (no int64 or float needs more than a few dozen)."""

_NOT_BRACKET: Final = bytes(b for b in range(256) if b not in b"[]{}")
_OPEN_AS_TWO: Final = bytes.maketrans(b"[]{}", b"\x02\x00\x02\x00")  # running sum = 2*opens = depth + position
_PRUNE_PASSES: Final = 2  # passes that drop leaf [] and {} pairs (each pass drops at most two levels)
_LONG_NUMBER: Final = re.compile(rb"[0-9]{%d}" % (MAX_NUMBER_DIGITS + 1))
_TOKEN: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]|[0-9]{%d,}' % (MAX_NUMBER_DIGITS + 1), re.S)
_MAX_PARAM: Final = 120  # the longest field path named in an error; a deeper one ends with "..."
_DEEP: Final = f"it is nested more than {MAX_JSON_DEPTH} levels deep"
_LONG: Final = f"it holds a number with more than {MAX_NUMBER_DIGITS} digits"
_SURROGATE_TEXT: Final = "it holds a lone UTF-16 surrogate, which is not text"
_SPLIT_CHUNK: Final = 1 << 16  # bytes split at a time when cutting out strings (see _outside_strings)
_LOCATE_TOKENS: Final = 200_000  # tokens walked to name the field; a body that hides it deeper gets no name
# A \uD800-\uDFFF escape (group 1: a hex digit 8-B for a high surrogate, C-F for a low one), preceded by an even
# number of backslashes so that it is an escape and not the text "\\ud800".
_SURROGATE: Final = re.compile(rb"(?<!\\)(?:\\\\)*\\u[dD]([89abAB]|[c-fC-F])[0-9a-fA-F]{2}")


def check_json_body(body: bytes) -> None:
    """Raise `ApiError` (400, naming the field) if `body` nests deeper than `MAX_JSON_DEPTH`, holds a number
    with more than `MAX_NUMBER_DIGITS` digits or a lone surrogate escape. Anything else, malformed JSON included,
    is left to the decoder. Costs a few passes of C-speed bytes operations over the body."""
    skeleton = _outside_strings(body)
    if _too_deep(skeleton.translate(None, _NOT_BRACKET)):
        raise _locate(body, _DEEP)
    if _LONG_NUMBER.search(skeleton) is not None:
        raise _locate(body, _LONG)
    if b"\\u" in body and (at := _lone_surrogate(body)) is not None:
        raise _locate(body, _SURROGATE_TEXT, string_at=at)


def _outside_strings(body: bytes) -> bytes:
    """The body without its strings: escaped backslashes, then escaped quotes, are dropped, so every quote left
    opens or closes a string, and the pieces between them alternate outside and inside. Split a chunk at a time:
    a body of millions of tiny strings (``"",`` repeated) split whole made millions of objects, 30 times the
    body's size in memory."""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept: list[bytes] = []
    inside = False
    for start in range(0, len(body), _SPLIT_CHUNK):
        pieces = body[start : start + _SPLIT_CHUNK].split(b'"')
        kept.append(b"".join(pieces[1 if inside else 0 :: 2]))
        inside ^= len(pieces) % 2 == 0  # an odd number of quotes in the chunk
    return b"".join(kept)


def _running_max(brackets: bytes) -> int:
    """The greatest nesting depth along `brackets` (only []{} bytes)."""
    if not brackets:
        return 0
    depth: int = max(map(operator.sub, accumulate(brackets.translate(_OPEN_AS_TWO)), count(1)))
    return depth


def _too_deep(brackets: bytes) -> bool:
    """Whether the brackets nest deeper than `MAX_JSON_DEPTH`. Leaf pairs are dropped first (balanced pieces: the
    depth at every other position is unchanged), which leaves little of an ordinary body to sum over."""
    if brackets.count(b"[") + brackets.count(b"{") <= MAX_JSON_DEPTH:
        return False
    rest = brackets
    for _ in range(_PRUNE_PASSES):
        rest = rest.replace(b"[]", b"").replace(b"{}", b"")
    depth = _running_max(rest)  # what was dropped hung at most 2 * _PRUNE_PASSES levels below what is left
    if depth > MAX_JSON_DEPTH or depth + 2 * _PRUNE_PASSES <= MAX_JSON_DEPTH:
        return depth > MAX_JSON_DEPTH
    return _running_max(brackets) > MAX_JSON_DEPTH


def _lone_surrogate(body: bytes) -> int | None:
    """Where the first escape of half a UTF-16 surrogate pair is (msgspec refuses them with a message about
    truncated input; they are not text, and nothing downstream could encode them)."""
    pending_high: re.Match[bytes] | None = None
    for match in _SURROGATE.finditer(body):
        high = match.group(1) in b"89abAB"
        if pending_high is not None:
            if high or match.start() != pending_high.end():
                return pending_high.end() - 6
            pending_high = None
        elif high:
            pending_high = match
        else:
            return match.end() - 6
    return pending_high.end() - 6 if pending_high is not None else None


class _Frame:
    """One open array or object while walking the body: where in it the walk is."""

    __slots__ = ("index", "is_object", "key", "wants_key")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.index = 0
        self.key = ""
        self.wants_key = is_object


def _path(frames: list[_Frame]) -> str | None:
    """The field the innermost frame's current value sits in, e.g. ``messages[0].content``."""
    out = ""
    for frame in frames:
        if frame.is_object:
            out += f".{frame.key}" if out else frame.key
        else:
            out += f"[{frame.index}]"
        if len(out) > _MAX_PARAM:
            return out[:_MAX_PARAM] + "..."
    return out or None


def _error(frames: list[_Frame], problem: str) -> ApiError:
    param = _path(frames)
    where = f"`{param}`" if param else "the request body"
    return ApiError(400, f"invalid value for {where}: {problem}", param=param, code="invalid_value")


def _locate(body: bytes, problem: str, *, string_at: int | None = None) -> ApiError:
    """Walk the body's tokens to the first place it breaks a limit and name the field there (with `string_at`:
    the string holding that offset, a lone surrogate)."""
    frames: list[_Frame] = []
    for walked, match in enumerate(_TOKEN.finditer(body)):
        if walked >= _LOCATE_TOKENS:  # bounded work on a body built to be slow to walk: no field named
            return _error([], problem)
        token = match.group()
        first = token[0]
        if string_at is not None and match.end() > string_at:
            return _error(frames, f"{problem} ({body[string_at : string_at + 6].decode()})")
        if first == 0x22:  # a string: a key where an object expects one
            top = frames[-1] if frames else None
            if top is not None and top.wants_key:
                top.key = token[1:-1].decode("utf-8", "replace")[:_MAX_PARAM]
        elif first in b"[{":
            if len(frames) >= MAX_JSON_DEPTH:
                return _error(frames, _DEEP)
            frames.append(_Frame(is_object=first == 0x7B))
        elif first in b"]}":
            if frames:
                frames.pop()
        elif first == 0x2C:  # ,
            if frames:
                top = frames[-1]
                top.index += 1
                top.wants_key = top.is_object
        elif first == 0x3A:  # :
            if frames:
                frames[-1].wants_key = False
        else:
            return _error(frames, _LONG)
    return _error(frames, problem)
