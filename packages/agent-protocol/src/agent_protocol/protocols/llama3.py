"""The Llama 3.1 / 3.2 instruct chat format (header blocks, JSON tool calls with `parameters`), in Python.

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\nCutting Knowledge
    Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n{system}<|eot_id|><|start_header_id|>user<|end_header_id|>
    \\n\\n{tool instructions and specs}{first user message}<|eot_id|>...<|start_header_id|>assistant<|end_header_id|>
    \\n\\n{"name": "f", "parameters": {...}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\\n\\n"{result}"
    <|eot_id|>

Mirrors the official templates statement by statement (3.1 prints "26 Jul 2024" unless given a date, 3.2 today's
date; otherwise they agree on custom tools): BOS in every render, the date line in the system block, the tool
specs (`tojson(indent=4)`) in the first user message by default (`tools_in_user_message=False`: in the system
block), a tool-call turn rendered as the JSON object alone (its content dropped), tool results in the `ipython`
role dumped as JSON strings. The template refuses an assistant turn with more than one call, and tools with no
message to carry them: both raise `MessageError`. The 3.1 template's `builtin_tools` (`<|python_tag|>`,
brave_search, wolfram_alpha) are not supported. Two places follow vLLM's chat preprocessing rather than the bare
Jinja: null content renders as empty text (Jinja would print "None"), and string arguments are parsed to the
object they hold (Jinja would dump the string).

Parsing follows vLLM's `llama3_json` tool parser (`Llama3JsonToolParser.extract_tool_calls`): every `{` not
inside an earlier object starts a JSON candidate (`raw_decode`), an object with `name` and `arguments` or
`parameters` is a call, several may follow one another (`; `-separated), a leading `<|python_tag|>` is dropped.
Where vLLM gives up and returns the whole text as content, this parser keeps the calls read before and reports a
candidate that was meant as a call (it starts `{"name":`, or follows `<|python_tag|>`) as a broken call with a
coded issue; a JSON object or brace in prose stays content, as in vLLM. Text around the calls is kept as content
(vLLM drops it; the template drops it on re-render anyway). Llama 3.x has no reasoning channel.

Turns end on `<|eot_id|>` (what the template writes after every turn, tool calls included) or `<|eom_id|>`
(what Llama 3.1 may emit after a call when the system block says `Environment: ipython`); engines also stop on
`<|end_of_text|>`. Seams, where the transcript keeps what was sampled and a re-render differs: a turn closed by
`<|eom_id|>` (re-rendered with `<|eot_id|>`), a `<|python_tag|>` before a call, text next to a call (dropped),
whitespace around an answer (trimmed), a turn ended by `<|end_of_text|>` or cut off (the feedback closes it with
`<|eot_id|>`), and two calls in one turn (the template refuses to render that history at all).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import date
from typing import Any, Final

from agent_protocol.broken_call import raw_preview
from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import JsonLimitError, MessageError
from agent_protocol.json_limits import MAX_JSON_DEPTH, check_json_value, loads_bounded
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import Action, Message, MessageLike, ParseIssue, ToolCall, ToolSpec

__all__ = ["PROTOCOLS", "Llama3Protocol", "parse_llama3_turn"]

BOS: Final = "<|begin_of_text|>"
EOT: Final = "<|eot_id|>"
EOM: Final = "<|eom_id|>"
END_OF_TEXT: Final = "<|end_of_text|>"
PYTHON_TAG: Final = "<|python_tag|>"
DEFAULT_DATE: Final = "26 Jul 2024"  # what both templates print without a date (3.2 only without strftime_now)
DATE_FORMAT: Final = "%d %b %Y"

_CALL_FORMAT: Final = (
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)
_SYSTEM_TOOLS: Final = (
    "You have access to the following functions. To call a function, please respond with JSON for a function call."
    + _CALL_FORMAT
)
_USER_TOOLS: Final = (
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n\n" + _CALL_FORMAT
)
_REFUSED_PARALLEL: Final = (
    "the official Llama 3.x template refuses an assistant turn with {n} tool calls "
    "('This model only supports single tool-calls at once!'); give each call its own assistant turn"
)
_CALL_START: Final = re.compile(r'\{\s*"name"\s*:')
_END_MARKERS: Final = (EOT, EOM, END_OF_TEXT)
_DECODER: Final = json.JSONDecoder()
_FORMAT_HINT: Final = 'Write {"name": <function-name>, "parameters": <args-json-object>} and nothing else.'


def _header(role: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n"


def _text(content: str | None) -> str:
    """The template's `content | trim`; null content is empty text, as vLLM's chat preprocessing passes it."""
    return (content or "").strip()


class Llama3Protocol(ChatProtocol):
    end_of_turn = EOT
    stop_texts = (EOT, EOM, END_OF_TEXT)

    def __init__(self, name: str, *, date_string: str, tools_in_user_message: bool = True) -> None:
        self.name = name
        self.date_string = date_string
        self.tools_in_user_message = tools_in_user_message

    def __repr__(self) -> str:
        return (
            f"Llama3Protocol(name={self.name!r}, date_string={self.date_string!r}, "
            f"tools_in_user_message={self.tools_in_user_message})"
        )

    @property
    def turn_end_texts(self) -> tuple[str, ...]:
        return (EOT, EOM)

    @property
    def generation_prompt(self) -> str:
        return _header("assistant")

    # -- rendering ---------------------------------------------------------------------------------------

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        # `specs` None: no tools given, which the template tells from an empty list
        if not msgs:
            raise MessageError("messages", "the official Llama 3.x template cannot render an empty conversation")
        first = 1 if msgs[0].role == "system" else 0
        out = [BOS, self._system_block(_text(msgs[0].content) if first else "", specs)]
        if specs is not None and self.tools_in_user_message:
            if first >= len(msgs):
                raise MessageError(
                    "messages",
                    "the official Llama 3.x template refuses tools without a first user message to put them in "
                    "('Cannot put tools in the first user message when there's no first user message!')",
                )
            out.append(_header("user") + _USER_TOOLS + _tool_listing(specs) + _text(msgs[first].content) + EOT)
            first += 1
        out.extend(_render_message(msg, f"messages[{index}]") for index, msg in enumerate(msgs) if index >= first)
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def _system_block(self, system: str, specs: list[ToolSpec] | None) -> str:
        out = [_header("system")]
        if specs is not None:
            out.append("Environment: ipython\n")
        out.append(f"Cutting Knowledge Date: December 2023\nToday Date: {self.date_string}\n\n")
        if specs is not None and not self.tools_in_user_message:
            out.append(_SYSTEM_TOOLS + _tool_listing(specs))
        out.append(system + EOT)
        return "".join(out)

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        """`ended_by` does not matter here: `<|eot_id|>` and `<|eom_id|>` both close the turn and are already in
        the transcript, and the next block starts with its own header."""
        msgs = feedback_messages(messages)
        body = "".join(_render_message(msg, f"messages[{index}]") for index, msg in enumerate(msgs))
        return ("" if turn_closed else EOT) + body + self.generation_prompt

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        return _render_message(msg, "message").removeprefix(_header("assistant"))

    # -- parsing -----------------------------------------------------------------------------------------

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        return parse_llama3_turn(text, call_id_prefix=call_id_prefix)


def _tool_listing(specs: list[ToolSpec]) -> str:
    return "".join(tojson_kept(spec.to_openai(), indent=4) + "\n\n" for spec in specs)


def _render_message(msg: Message, where: str) -> str:
    """One message after the system block and the tools' user message, as the template's loop renders it."""
    if msg.role == "tool":
        return _header("ipython") + tojson(msg.content or "") + EOT
    if not msg.tool_calls:
        return _header(msg.role) + _text(msg.content) + EOT
    if len(msg.tool_calls) != 1:
        raise MessageError(f"{where}.tool_calls", _REFUSED_PARALLEL.format(n=len(msg.tool_calls)))
    (call,) = msg.tool_calls
    return _header("assistant") + f'{{"name": "{call.name}", "parameters": {tojson(call.arguments)}}}' + EOT


# -- parsing -------------------------------------------------------------------------------------------------


def parse_llama3_turn(text: str, *, call_id_prefix: str = "call") -> Action:
    """One generated turn: its calls (see the module docstring for the rules) and the text around them."""
    closed = False
    for marker in _END_MARKERS:
        if text.endswith(marker):
            text, closed = text[: -len(marker)], True
            break
    tagged = text.lstrip().startswith(PYTHON_TAG)
    if tagged:
        text = text.lstrip().removeprefix(PYTHON_TAG)
    calls: list[ToolCall] = []
    pieces: list[str] = []
    pos = 0
    while (start := text.find("{", pos)) >= 0:
        call_id = f"{call_id_prefix}_{len(calls)}"
        meant = bool(_CALL_START.match(text, start)) or (tagged and not calls and not text[:start].strip())
        try:
            value, end = _decode_object(text, start)
        except json.JSONDecodeError as e:
            if meant:
                pieces.append(text[pos:start])
                ran_out = e.pos >= len(text) or e.msg.startswith("Unterminated string")
                cut_off = not closed and ran_out
                calls.append(_broken(call_id, text[start:], _decode_issue(e, cut_off=cut_off)))
                pos = len(text)
            break
        except JsonLimitError as e:
            if meant:
                pieces.append(text[pos:start])
                issue = ParseIssue(code="invalid_json", message=f"The tool call cannot be read: {e}. {_FORMAT_HINT}")
                calls.append(_broken(call_id, text[start:], issue))
                pos = len(text)
            break
        if "name" not in value and not meant:
            break  # a JSON object in prose: vLLM stops here too, and so does the search for calls
        pieces.append(text[pos:start])
        calls.append(_call_from_object(value, call_id, text[start:end]))
        pos = end
    if not calls:
        return Action(content=text)
    pieces.append(text[pos:])
    content = "\n".join(stripped for piece in pieces if (stripped := piece.strip(" \t\r\n;")))
    return Action(content=content, tool_calls=tuple(calls))


def _decode_object(text: str, start: int) -> tuple[dict[str, Any], int]:
    """The JSON object at `text[start]` and where it ends, within json_limits' limits: raises
    `json.JSONDecodeError` (not JSON) or `JsonLimitError` (too deep, a number too long, a lone surrogate)."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:  # a ValueError too: let it through before the limits below
        raise
    except RecursionError as e:
        raise JsonLimitError(f"it is nested too deeply (more than {MAX_JSON_DEPTH} levels are refused)") from e
    except ValueError as e:  # CPython's guard against converting huge integers
        raise JsonLimitError("it holds a number too long to read") from e
    check_json_value(value)
    return value, end


def _decode_issue(error: json.JSONDecodeError, *, cut_off: bool) -> ParseIssue:
    if cut_off:
        return ParseIssue(code="unclosed_tag", message="The tool call was cut off before its JSON was complete.")
    return ParseIssue(
        code="invalid_json",
        message=f"The tool call is not valid JSON ({error.msg} at character {error.pos}). {_FORMAT_HINT}",
    )


def _broken(call_id: str, raw: str, issue: ParseIssue, name: str = "") -> ToolCall:
    return ToolCall(id=call_id, name=name, error=issue, raw=raw_preview(raw))


def _call_from_object(value: dict[str, Any], call_id: str, raw: str) -> ToolCall:
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return _broken(call_id, raw, ParseIssue(code="missing_name", message='The tool call has no "name" string.'))
    if "arguments" in value:  # vLLM reads "arguments" first, then "parameters"
        arguments = value["arguments"]
    elif "parameters" in value:
        arguments = value["parameters"]
    else:
        issue = ParseIssue(
            code="invalid_arguments", message=f'The tool call has no "parameters" object. {_FORMAT_HINT}'
        )
        return _broken(call_id, raw, issue, name)
    if isinstance(arguments, str):  # a string holding the object: decoded once, as the Hermes parser does
        try:
            arguments = loads_bounded(arguments) if arguments.strip() else {}
        except JsonLimitError as e:
            message = f'"parameters" is a string that holds JSON that cannot be read: {e}.'
            return _broken(call_id, raw, ParseIssue(code="invalid_arguments", message=message), name)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        message = f'"parameters" must be a JSON object, not {type(arguments).__name__}. {_FORMAT_HINT}'
        return _broken(call_id, raw, ParseIssue(code="invalid_arguments", message=message), name)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _llama31(*, today: date | None = None, tools_in_user_message: bool = True) -> ChatProtocol:
    date_string = DEFAULT_DATE if today is None else today.strftime(DATE_FORMAT)
    return Llama3Protocol("llama3.1", date_string=date_string, tools_in_user_message=tools_in_user_message)


def _llama32(*, today: date | None = None, tools_in_user_message: bool = True) -> ChatProtocol:
    """Without `today` the template prints the current date (`strftime_now`): read once, here, so that one
    protocol instance renders one date for the whole episode."""
    date_string = (today or date.today()).strftime(DATE_FORMAT)
    return Llama3Protocol("llama3.2", date_string=date_string, tools_in_user_message=tools_in_user_message)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"llama3.1": _llama31, "llama3.2": _llama32}
