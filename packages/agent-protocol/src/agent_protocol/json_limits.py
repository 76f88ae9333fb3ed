"""JSON from untrusted text (model output, client requests), decoded with limits that keep it harmless.

`json.loads` itself raises more than `JSONDecodeError` on hostile input: `RecursionError` on a few thousand
nested brackets, `ValueError` on an integer of more than 4,300 digits (CPython's int-to-string guard), and it
happily returns lone UTF-16 surrogates (``"\\ud800"``) that cannot be encoded as UTF-8 later, when the value is
tokenized, logged or written to a trajectory. A value that decodes may also be nested so deeply that code
further down (a `json.dumps`, msgspec, a schema check) hits the recursion limit.

`loads_bounded` decodes (with msgspec's decoder, about five times faster than `json.loads` on a tool call; any
text it refuses is decoded again by `json.loads`, so what is accepted, and every error message, is `json.loads`'s)
and then checks the value, so every such input becomes one `JsonLimitError` (a
`ValueError`) with a message a model or a client can act on; `check_json_value` applies the same checks to a
value decoded elsewhere (an HTTP body, a caller's dict). Both walk the value iteratively and never recurse.
This module knows JSON; it knows nothing about tool calls or chat formats.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from agent_protocol.errors import JsonLimitError

__all__ = ["MAX_JSON_DEPTH", "check_json_value", "loads_bounded"]

MAX_JSON_DEPTH: Final = 100
"""Deepest nesting of objects and arrays accepted. Real tool arguments and JSON schemas stay far below it."""

# A \uD800-\uDFFF escape: the only way a lone surrogate gets into a decoded value (raw ones cannot be in a str
# that came from UTF-8). Only values whose text holds one need the full string check.
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def loads_bounded(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads(text)` that raises only `json.JSONDecodeError` (not JSON) or `JsonLimitError` (JSON that
    is too deep, has a number too long to convert, or holds a lone surrogate)."""
    try:
        value = _decoder.decode(text)  # valid JSON: the value json.loads gives (same numbers, last duplicate key)
    except (msgspec.DecodeError, RecursionError, UnicodeEncodeError):
        # Not JSON, or JSON msgspec refuses (NaN, 1e999, an escaped lone surrogate), or a raw lone surrogate in the
        # text (msgspec takes the text as UTF-8): json.loads decides, as it did alone.
        value = _loads(text, max_depth)
    strings = _SURROGATE_ESCAPE.search(text) is not None
    if strings or text.count("{") + text.count("[") > max_depth:  # else no container can nest that deep
        check_json_value(value, max_depth=max_depth, strings=strings)
    return value


_decoder: Final = msgspec.json.Decoder()


def _loads(text: str, max_depth: int) -> Any:
    """`json.loads`, with its RecursionError and its huge-integer ValueError as `JsonLimitError`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError as e:
        raise JsonLimitError(f"it is nested too deeply (more than {max_depth} levels are refused)") from e
    except ValueError as e:  # CPython's guard against converting huge integers
        raise JsonLimitError(f"it holds a number too long to read ({_first_line(e)})") from e


def check_json_value(value: Any, *, max_depth: int = MAX_JSON_DEPTH, strings: bool = True) -> None:
    """Raise `JsonLimitError` if `value` nests deeper than `max_depth` or (when `strings`) holds a string or
    key that is not valid Unicode text (a lone surrogate)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
            if strings:
                for key in item:
                    _check_text(key)
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            if strings and isinstance(item, str):
                _check_text(item)
            continue
        if depth >= max_depth:
            raise JsonLimitError(f"it is nested too deeply (more than {max_depth} levels are refused)")
        stack.extend((child, depth + 1) for child in children)


def _check_text(item: object) -> None:
    if isinstance(item, str):
        try:
            item.encode("utf-8")
        except UnicodeEncodeError as e:
            raise JsonLimitError(f"it holds a lone surrogate (\\u{ord(e.object[e.start]):04x}), not text") from e


def _first_line(error: Exception) -> str:
    return str(error).split(":", 1)[0]
