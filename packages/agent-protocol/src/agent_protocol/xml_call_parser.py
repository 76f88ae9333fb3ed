"""Tool calls written as XML, the way Qwen3-Coder writes them, read with the semantics of vLLM's `qwen3_coder`
tool parser (`vllm/tool_parsers/qwen3coder_tool_parser.py`, non-streaming `extract_tool_calls`):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

- A call is a `<tool_call>` block holding `<function=NAME>`; a `<tool_call>` block without one is text. Only
  when the text holds no `<tool_call>` at all is a bare `<function=NAME>...</function>` a call (models drop
  the opening tag).
- Tags are *structural* only where the format puts them: a `</parameter>` ends a value only when what follows
  (after whitespace) is the next `<parameter=`, `</function>`, `</tool_call>` or the end of the text, so a value
  may hold code that contains these strings; a `<parameter=` opens one only at the start of a line. A value whose
  `</parameter>` is missing ends at the next such `<parameter=` (one of the tool's own parameter names when the
  schema is known). One newline is removed at each end of a value.
- Values are untyped text, converted by the JSON-schema type of the parameter (`convert_value`); a parameter the
  schema does not name, or any parameter when the tool's schema is not known, stays a string.

Where this differs from vLLM, on purpose: a call that is cut off before `</function>` and `</tool_call>` is
kept as an `unclosed_tag` error (vLLM runs whatever it got, a truncated command included); a bad function name
is a `missing_name` error and a value beyond the JSON limits an `invalid_arguments` error (vLLM drops both
silently); text after the calls is kept as content (vLLM drops it). Content next to calls is stripped, as the
Qwen3-Coder template trims it when rendering, so parse(render(turn)) == turn. Nothing here raises on model
output. This module knows the tags and JSON schemas; it knows nothing about tokens or chat templates.
"""

from __future__ import annotations

import ast
import json
import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any, Final

from agent_protocol.broken_call import raw_preview
from agent_protocol.errors import JsonLimitError
from agent_protocol.json_limits import check_json_value, loads_bounded
from agent_protocol.types import ParseIssue, ToolCall, ToolSpecLike, coerce_tools

__all__ = ["convert_value", "parse_xml_calls", "schemas_of"]

CALL_OPEN: Final = "<tool_call>"
CALL_CLOSE: Final = "</tool_call>"
FUNCTION_OPEN: Final = "<function="
FUNCTION_CLOSE: Final = "</function>"
PARAMETER_OPEN: Final = "<parameter="
PARAMETER_CLOSE: Final = "</parameter>"
_SPACE: Final = " \t\n\r"
_NAME_FORBIDDEN: Final = frozenset("{}<>\"' \t\n\r")  # a stray template token or prose, not a function name
_STRING_TYPES: Final = ("string", "str", "text", "varchar", "char", "enum")
_INTEGER_PREFIXES: Final = ("int", "uint", "long", "short", "unsigned")

#: tool name -> the `properties` of its JSON schema
Schemas = Mapping[str, Mapping[str, Any]]


def schemas_of(tools: Iterable[ToolSpecLike]) -> dict[str, Mapping[str, Any]]:
    """Each tool's parameter `properties` (`{}` where it has none), the schemas `parse_xml_calls` types values by, as
    vLLM takes them from the tools of the request (a later tool of the same name wins)."""
    schemas: dict[str, Mapping[str, Any]] = {}
    for spec in coerce_tools(tools):
        parameters = spec.function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        schemas[spec.name] = properties if isinstance(properties, Mapping) else {}
    return schemas


def parse_xml_calls(
    text: str, *, schemas: Schemas | None = None, call_id_prefix: str = "call"
) -> tuple[str, list[ToolCall]]:
    """Cut every call out of `text`; return the remaining text (the content) and the calls in order.
    `schemas` gives the parameter types of the tools the model was shown (none: every value stays a string)."""
    if FUNCTION_OPEN not in text:
        return text, []
    tags = _Tags(text)
    bare = CALL_OPEN not in text  # models that drop the opening tag: the <function=...> itself starts a call
    pieces: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        found = _next_call(tags, pos, bare=bare)
        if found is None:
            pieces.append(text[pos:])
            break
        start, function_at = found
        pieces.append(text[pos:start])
        call, end = _read_call(tags, start, function_at, schemas or {}, f"{call_id_prefix}_{len(calls)}")
        calls.append(call)
        if end is None:  # cut off: the rest of the text belonged to the call
            break
        pos = end
    if not calls:
        return text, []
    return "\n".join(piece.strip() for piece in pieces if piece.strip()), calls


class _Tags:
    """Where the format's tags are in one text, found once and looked up by bisection, so that reading any text
    (a megabyte of `</parameter>`, say) stays linear: the parser asks for "the next tag after here" many times."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._at: dict[str, list[int]] = {}
        self._line_parameters: dict[frozenset[str] | None, list[int]] = {}
        self._function_ends: list[int] | None = None

    def find(self, needle: str, pos: int) -> int:
        """`text.find(needle, pos)`."""
        positions = self._at.get(needle)
        if positions is None:
            positions = []
            at = self.text.find(needle)
            while at >= 0:
                positions.append(at)
                at = self.text.find(needle, at + len(needle))
            self._at[needle] = positions
        return _next(positions, pos)

    def name_at(self, at: int, opener: str) -> str | None:
        """The name of the tag `opener` (`<parameter=`, `<function=`) at `at`: up to the next `>`."""
        end = self.find(">", at + len(opener))
        return None if end < 0 else self.text[at + len(opener) : end]

    def line_parameter(self, pos: int, names: set[str] | None = None, *, first: int = -1) -> int:
        """The next `<parameter=` at or after `pos` that starts a line (or sits at `first`), named in `names`
        when given; -1 if none."""
        key = None if names is None else frozenset(names)
        positions = self._line_parameters.get(key)
        if positions is None:
            self.find(PARAMETER_OPEN, 0)
            positions = [
                at
                for at in self._at[PARAMETER_OPEN]
                if at > 0 and self.text[at - 1] == "\n" and (names is None or self.name_at(at, PARAMETER_OPEN) in names)
            ]
            self._line_parameters[key] = positions
        found = _next(positions, pos)
        at_first = first >= pos and (found < 0 or first < found) and self.text.startswith(PARAMETER_OPEN, first)
        if at_first and (names is None or self.name_at(first, PARAMETER_OPEN) in names):
            return first
        return found

    def function_end(self, pos: int) -> int:
        """The first `</function>` at or after `pos` followed only by whitespace and then `</tool_call>` or the end
        of the text; -1 if none."""
        if self._function_ends is None:
            self.find(FUNCTION_CLOSE, 0)
            self._function_ends = [at for at in self._at[FUNCTION_CLOSE] if self._closes_call(at + len(FUNCTION_CLOSE))]
        return _next(self._function_ends, pos)

    def _closes_call(self, pos: int) -> bool:
        nxt = _skip_space(self.text, pos)
        return nxt >= len(self.text) or self.text.startswith(CALL_CLOSE, nxt)


def _next(positions: list[int], pos: int) -> int:
    index = bisect_left(positions, pos)
    return positions[index] if index < len(positions) else -1


def _next_call(tags: _Tags, pos: int, *, bare: bool) -> tuple[int, int] | None:
    """(where the call starts, where its `<function=` is) of the next call at or after `pos`."""
    if bare:
        at = tags.find(FUNCTION_OPEN, pos)
        return None if at < 0 else (at, at)
    while True:
        start = tags.find(CALL_OPEN, pos)
        if start < 0:
            return None
        body = start + len(CALL_OPEN)
        function_at = tags.find(FUNCTION_OPEN, body)
        close = tags.find(CALL_CLOSE, body)
        if function_at >= 0 and (close < 0 or function_at < close):
            return start, function_at
        if close < 0:  # an unclosed <tool_call> with no function in it: text
            return None
        pos = close + len(CALL_CLOSE)  # a <tool_call> block without a function is text (vLLM keeps it too)


def _read_call(
    tags: _Tags, start: int, function_at: int, schemas: Schemas, call_id: str
) -> tuple[ToolCall, int | None]:
    """The call whose `<function=` is at `function_at`, and the index after it (None: it runs to the end)."""
    text = tags.text
    name = tags.name_at(function_at, FUNCTION_OPEN)
    if name is None:
        issue = ParseIssue(code="unclosed_tag", message="The tool call was cut off before its function name ended.")
        return ToolCall(id=call_id, name="", error=issue, raw=raw_preview(text[start:])), None
    properties = schemas.get(name) or {}
    body_start = function_at + len(FUNCTION_OPEN) + len(name) + 1
    raw_values, body_end, closer = _read_parameters(tags, body_start, set(properties) or None)
    end: int | None = None
    if body_end is not None:
        end = body_end + len(closer)
        after = _skip_space(text, end)
        if closer == FUNCTION_CLOSE and text.startswith(CALL_CLOSE, after):
            end = after + len(CALL_CLOSE)
    raw = raw_preview(text[start:end])
    if not _valid_name(name):
        issue = ParseIssue(
            code="missing_name",
            message="The tool call has no valid function name. Write <function=NAME> with the tool's name.",
        )
        return ToolCall(id=call_id, name="", error=issue, raw=raw), end
    arguments: dict[str, Any] = {}
    try:
        for key, value in raw_values.items():
            arguments[key] = convert_value(value, properties.get(key)) if key in properties else value
        check_json_value(arguments)
    except JsonLimitError as e:
        issue = ParseIssue(code="invalid_arguments", message=f"The tool call's arguments cannot be read: {e}.")
        return ToolCall(id=call_id, name=name, error=issue, raw=raw), end
    if body_end is None:
        issue = ParseIssue(
            code="unclosed_tag",
            message="The tool call was cut off before </function></tool_call>; nothing in it was run.",
        )
        return ToolCall(id=call_id, name=name, arguments=arguments, error=issue, raw=raw), None
    return ToolCall(id=call_id, name=name, arguments=arguments), end


def _read_parameters(tags: _Tags, pos: int, known: set[str] | None) -> tuple[dict[str, str], int | None, str]:
    """The raw parameter values of a function body starting at `pos`, the index of the tag that closes the
    body (`</function>`, or `</tool_call>` when `</function>` was left out) and that tag; None if unclosed."""
    text = tags.text
    values: dict[str, str] = {}
    while True:
        pos = _skip_space(text, pos)
        if pos >= len(text):
            return values, None, ""
        for closer in (FUNCTION_CLOSE, CALL_CLOSE):
            if text.startswith(closer, pos):
                return values, pos, closer
        if not text.startswith(PARAMETER_OPEN, pos):  # stray text in the body: skip to the next structural tag
            nxt = tags.line_parameter(pos)
            closes = [at for at in (tags.find(FUNCTION_CLOSE, pos), tags.find(CALL_CLOSE, pos)) if at >= 0]
            close = min(closes, default=-1)
            if nxt >= 0 and (close < 0 or nxt < close):
                pos = nxt
                continue
            if close < 0:
                return values, None, ""
            return values, close, FUNCTION_CLOSE if text.startswith(FUNCTION_CLOSE, close) else CALL_CLOSE
        name = tags.name_at(pos, PARAMETER_OPEN)
        if name is None:
            return values, None, ""
        start = pos + len(PARAMETER_OPEN) + len(name) + 1
        if text.startswith("\n", start):
            start += 1
        value_end, pos_after = _value_end(tags, start, known)
        value = text[start:value_end] if value_end is not None else text[start:]
        values[name] = value.removesuffix("\n")
        if pos_after is None:
            return values, None, ""
        pos = pos_after


def _value_end(tags: _Tags, start: int, known: set[str] | None) -> tuple[int | None, int | None]:
    """Where the value starting at `start` ends, and where parsing goes on (None, None: it runs to the end)."""
    text = tags.text
    pos, depth = start, 0
    while True:
        close = tags.find(PARAMETER_CLOSE, pos)
        if close < 0:
            break
        opener = tags.line_parameter(pos, first=start)
        if 0 <= opener < close:  # a literal <parameter=...> inside the value: its </parameter> is literal too
            depth += 1
            pos = opener + len(PARAMETER_OPEN)
            continue
        after = close + len(PARAMETER_CLOSE)
        if depth:
            depth -= 1
            pos = after
            continue
        nxt = _skip_space(text, after)
        if (
            nxt >= len(text)
            or text.startswith(FUNCTION_CLOSE, nxt)
            or text.startswith(CALL_CLOSE, nxt)
            or (text.startswith(PARAMETER_OPEN, nxt) and (known is None or tags.name_at(nxt, PARAMETER_OPEN) in known))
        ):
            return close, after
        pos = after
    # No structural </parameter>: the next parameter of the tool starts where this value ends ...
    nxt = tags.line_parameter(start, known, first=start)
    if nxt >= 0:
        return nxt, nxt
    # ... or the function's own end.
    end = tags.function_end(start)
    return (end, end) if end >= 0 else (None, None)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _SPACE:
        pos += 1
    return pos


def _valid_name(name: str) -> bool:
    if not name or any(c in _NAME_FORBIDDEN for c in name):
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- values ---------------------------------------------------------------------------------------------------


def convert_value(raw: str, schema: Any) -> Any:
    """`raw` converted by the JSON-schema `schema` of its parameter, as vLLM's qwen3_coder parser converts it:
    the `type` (or the first non-null type of an `anyOf`) decides; "null"/"None" is null for a nullable or
    non-string type; integers and numbers that do not parse, and containers that are neither JSON nor a Python
    literal, stay the text; a boolean is true only for "true" (any case). Raises `JsonLimitError` for a value
    that decodes to something beyond the JSON limits."""
    kind, nullable = _schema_type(schema)
    if nullable and raw.lower() in ("null", "none"):
        return None
    if kind in _STRING_TYPES:
        return raw
    if raw.lower() in ("null", "none"):
        return None
    if kind.startswith(_INTEGER_PREFIXES):
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind.startswith(("num", "float")):
        try:
            number = float(raw)
        except ValueError:
            return raw
        if not math.isfinite(number):
            return raw
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return raw.lower() == "true"
    container = kind in ("object", "array", "arr") or kind.startswith(("dict", "list"))
    if container:
        try:
            decoded = loads_bounded(raw)
        except json.JSONDecodeError:
            pass
        else:
            if isinstance(decoded, str):  # a JSON string holding a Python literal: one more decoding
                decoded = _literal(decoded, default=decoded)
            return decoded
    value = _literal(raw, default=raw)
    if container and isinstance(value, str):
        value = _literal(value, default=value)
    return value


def _schema_type(schema: Any) -> tuple[str, bool]:
    """(the lower-case type name, whether null is allowed) of a parameter's schema; "string" if it has none."""
    if isinstance(schema, Mapping) and "type" in schema:
        kind = str(schema["type"]).strip().lower()
        return kind, kind == "null"
    if isinstance(schema, Mapping) and "anyOf" in schema:
        kind, nullable = "", False
        options = schema["anyOf"] if isinstance(schema["anyOf"], list) else []
        for option in options:
            if isinstance(option, Mapping) and "type" in option:
                option_kind = str(option["type"]).strip().lower()
                if option_kind == "null":
                    nullable = True
                elif not kind:
                    kind = option_kind
        return kind or "string", nullable
    return "string", False


def _literal(text: str, *, default: Any) -> Any:
    """`ast.literal_eval(text)` if it gives a JSON value (tuples become arrays), else `default`."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return default
    try:
        return _as_json(value)
    except (TypeError, RecursionError):
        return default


def _as_json(value: Any) -> Any:
    """A Python literal as a JSON value; TypeError for what JSON cannot hold (sets, bytes, complex, inf)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError("not a finite number")
        return value
    if isinstance(value, (list, tuple)):
        return [_as_json(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _as_json(item) for key, item in value.items()}
    raise TypeError(f"{type(value).__name__} is not JSON")
