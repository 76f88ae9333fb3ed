"""Tool calls written as a Python list of calls, `[get_weather(city="Paris"), now()]`: the reader with the semantics
of vLLM's `pythonic` tool parser, and the writer of a call list that reader reads back. This module knows no chat
format: a family strips its own turn tokens first.

Reading (`read_pythonic`), as vLLM's `PythonicToolParser.extract_tool_calls` reads a whole turn:
- a turn is a call list only when it starts with `[`, a function name, `(` and `)` or `key=`, and the
  whole text parses (with `ast.parse`, never evaluated) as one expression: a list whose every element is a call of
  a plain name with keyword arguments only. Anything else is content, as in vLLM.
- an argument's value is a literal: a string, a number, `True`/`False`/`None`, or a list or dict of literals (dict
  keys literal). The arguments are what `json.dumps` then `json.loads` make of them, as vLLM hands the client a
  JSON string (an integer dict key becomes a string).
- where vLLM gives up on a text that starts like a call list (a syntax error, a turn cut off by the length limit,
  text after the list, a value that is not a literal, such as JSON's `true` or a negative number, a positional
  argument) and returns it as content, this reader returns one broken call with a coded issue, so the environment
  can tell the model what was wrong; and it reads one expression only (vLLM takes the first of several).

Writing (`write_pythonic`): each call `name(key=value, ...)`, `, ` between calls, inside `[...]`; a value as JSON
(`json.dumps`, non-ASCII kept) except `True`, `False` and `None`, which JSON would spell as names that the reader
refuses. A key that is not a Python identifier, a keyword, or a value the reader would not read back (a negative
number: `-1` is an operation, not a literal, to vLLM's parser; NaN, the infinities, a lone surrogate) raises
`MessageError`.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from agent_protocol.broken_call import broken_call
from agent_protocol.errors import JsonLimitError, MessageError
from agent_protocol.json_limits import check_json_value, loads_bounded
from agent_protocol.types import IssueCode, ToolCall

__all__ = ["looks_like_calls", "read_pythonic", "write_pythonic"]

#: where vLLM's pattern starts: `[`, a function name, `(`, then `)` or a keyword argument's name and `=`
_CALL_START: Final = re.compile(r"\[[a-zA-Z]\w*\((?:\)|[a-zA-Z]\w*=)")
_FORMAT: Final = 'Write tool calls as a Python list of calls with keyword arguments, e.g. [f(a=1, b="x")].'


class _Unreadable(Exception):
    def __init__(self, code: IssueCode, message: str) -> None:
        self.code = code
        super().__init__(message)


def looks_like_calls(text: str) -> bool:
    """Whether `text` starts as vLLM's pythonic pattern does (`[name()` or `[name(key=`): a call list, or a broken
    one."""
    return _CALL_START.match(text) is not None


def read_pythonic(text: str, *, closed: bool, call_id_prefix: str = "call") -> tuple[str, list[ToolCall]]:
    """(content, calls) of a generated turn's text (its end token removed): the calls and no content when the text
    is a call list, the text and no calls when it does not start like one, else one broken call (see the module
    docstring); `closed` says whether the turn ended on its end token (else it was cut off)."""
    if not looks_like_calls(text):
        return text, []
    try:
        return "", _calls(text, call_id_prefix)
    except _Unreadable as e:
        name = text[1 : text.index("(")]
        code: IssueCode = e.code if closed else "unclosed_tag"
        message = str(e) if closed else "the call list was cut off before it closed"
        return "", [broken_call(f"{call_id_prefix}_0", text, code, f"{message}. {_FORMAT}", name=name)]


def _calls(text: str, call_id_prefix: str) -> list[ToolCall]:
    try:
        module = ast.parse(text, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise _Unreadable("malformed_turn", f"not a Python list of calls ({type(e).__name__})") from None
    if len(module.body) != 1 or not isinstance(module.body[0], ast.Expr):
        raise _Unreadable("malformed_turn", "text follows the list of calls")
    listed = module.body[0].value
    elements = listed.elts if isinstance(listed, ast.List) else []
    found = [e for e in elements if isinstance(e, ast.Call)]
    if not isinstance(listed, ast.List) or len(found) != len(elements):
        raise _Unreadable("malformed_turn", "not a list of function calls")
    calls = []
    for index, call in enumerate(found):
        if not isinstance(call.func, ast.Name):
            raise _Unreadable("missing_name", f"call {index} is not a call of a plain function name")
        if call.args:
            raise _Unreadable("invalid_arguments", f"{call.func.id}: positional arguments (give each by its name)")
        arguments: dict[Any, Any] = {}
        for kw in call.keywords:
            if kw.arg is None:
                raise _Unreadable("invalid_arguments", f"{call.func.id}: ** arguments (give each by its name)")
            arguments[kw.arg] = _literal(kw.value, call.func.id)
        try:
            normal = loads_bounded(json.dumps(arguments, ensure_ascii=False))
            check_json_value(normal)  # a `\ud800` escape in a Python string is a lone surrogate, not text
        except (TypeError, ValueError, JsonLimitError) as e:
            raise _Unreadable("invalid_arguments", f"{call.func.id}: arguments are not JSON ({e})") from None
        calls.append(ToolCall(id=f"{call_id_prefix}_{index}", name=call.func.id, arguments=normal))
    return calls


def _literal(node: ast.expr, name: str) -> Any:
    """A literal's value, as vLLM's `_get_parameter_value` reads it; anything else is refused."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (bytes, complex)) or node.value is Ellipsis:
            raise _Unreadable("invalid_arguments", f"{name}: a value that is not JSON")
        return node.value
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in node.keys):
            raise _Unreadable("invalid_arguments", f"{name}: dict keys must be literals")
        return {k.value: _literal(v, name) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[union-attr]
    if isinstance(node, ast.List):
        return [_literal(v, name) for v in node.elts]
    raise _Unreadable(
        "invalid_arguments",
        f"{name}: argument values must be literals (strings, numbers, True/False/None, lists, dicts)",
    )


def write_pythonic(calls: Sequence[ToolCall], *, location: str = "message.tool_calls") -> str:
    """`[name(key=value, ...), ...]`, which `read_pythonic` reads back to the same names and arguments."""
    out = []
    for index, call in enumerate(calls):
        where = f"{location}[{index}]"
        if not call.name.isidentifier() or keyword.iskeyword(call.name) or not call.name.isascii():
            raise MessageError(
                f"{where}.function.name", "not a Python identifier: vLLM's pythonic parser cannot read it"
            )
        pairs = []
        for key, value in call.arguments.items():
            if not (isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)):
                raise MessageError(
                    f"{where}.function.arguments",
                    f"{key!r} is not a Python identifier: a keyword argument cannot be written with it",
                )
            pairs.append(f"{key}={_python(value, f'{where}.function.arguments.{key}')}")
        out.append(f"{call.name}({', '.join(pairs)})")
    return "[" + ", ".join(out) + "]"


def _python(value: Any, where: str) -> str:
    if value is True:
        return "True"
    if value is False:
        return "False"
    if value is None:
        return "None"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_string(k, where)}: {_python(v, where)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_python(v, where) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        raise MessageError(where, f"{value} is not a Python literal (vLLM's pythonic parser cannot read it)")
    if isinstance(value, (int, float)) and math.copysign(1, value) < 0:
        raise MessageError(
            where, f"{value}: Python writes a negative number as an operation, which vLLM's pythonic parser refuses"
        )
    if isinstance(value, str):
        return _string(value, where)
    return json.dumps(value, ensure_ascii=False)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MessageError(where, f"dict key {value!r} is not a string")
    try:
        check_json_value(value)
    except JsonLimitError as e:
        raise MessageError(where, str(e)) from e
    return json.dumps(value, ensure_ascii=False)
