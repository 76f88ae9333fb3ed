"""The Qwen3-Coder chat format: ChatML with XML tool calls and no reasoning, in Python.

    <|im_start|>assistant
    I'll look.

    <tool_call>
    <function=grep>
    <parameter=pattern>
    class Base\\(
    </parameter>
    </function>
    </tool_call><|im_end|>

Mirrors the official Qwen3-Coder template statement by statement (golden: `qwen3_coder`): tools are listed in
its own XML-ish form (`<function><name>…<parameters><parameter><name>…<type>…`, every extra schema key as a tag
holding its JSON or its Python `str`), the default system prompt is written when tools come without one, the
content of a turn with calls is trimmed, argument values are written as text (objects and arrays as JSON,
anything else through Jinja's `string`: `True`, `None`, `1.5`), and `reasoning_content` is never rendered. A
null content, which the template cannot take, is rendered as "" the way vLLM passes it.

Parsing follows vLLM's `qwen3_coder` tool parser (`agent_protocol.xml_call_parser`): values are untyped text
converted by each parameter's JSON-schema type, so the parser needs the schemas of the tools the model was
shown. A protocol is shared between episodes and knows no tools; `with_tools(tools)` returns a copy that parses
with their schemas (the turn core calls it with the episode's tools); without them, as vLLM without tools in the
request, every value stays a string.

Seams: re-rendering a parsed turn can change its bytes (a boolean written `true` is rendered `True`, `1.50`
as a number is rendered `1.5`, content before a call is trimmed, a missing `</parameter>` is written back), so
the token transcript keeps each turn as sampled and differs from the official render of the conversation there.
A well-formed turn in the template's own layout re-renders to the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from agent_protocol.chat_protocol import generated_message
from agent_protocol.chatml import IM_END, IM_START, ChatMLProtocol, strip_end_marker
from agent_protocol.template_json import tojson
from agent_protocol.types import Action, Message, MessageLike, ToolCall, ToolSpec, ToolSpecLike
from agent_protocol.xml_call_parser import Schemas, parse_xml_calls, schemas_of

__all__ = ["PROTOCOLS", "Qwen3CoderProtocol"]

DEFAULT_SYSTEM: Final = "You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."
_TOOLS_HEADER: Final = "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>"
_TOOLS_FOOTER: Final = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer "
    "the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>"
)


class Qwen3CoderProtocol(ChatMLProtocol):
    name = "qwen3-coder"
    template = "Qwen3-Coder"

    def __init__(self, schemas: Schemas | None = None) -> None:
        #: tool name -> the `properties` of its parameters schema, for converting parsed values
        self.schemas: Schemas = dict(schemas or {})

    def __repr__(self) -> str:
        return f"Qwen3CoderProtocol(tools={sorted(self.schemas)!r})"

    def with_tools(self, tools: Iterable[ToolSpecLike]) -> Qwen3CoderProtocol:
        """A copy whose parser converts parameter values by the JSON-schema types of `tools` (the tools the
        model is shown), as vLLM does with the tools of the request."""
        schemas = schemas_of(tools)
        return Qwen3CoderProtocol(schemas)

    # -- rendering ---------------------------------------------------------------------------------------

    def _system_block(self, msgs: list[Message], specs: list[ToolSpec]) -> str:
        return _system_block(msgs[0].content or "" if msgs[0].role == "system" else None, specs)

    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        # the system block holds a leading system message; in feedback it is a turn
        return _render_body(msgs if feedback or msgs[0].role != "system" else msgs[1:], follows_turn=feedback)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        if not msg.tool_calls:
            return (msg.content or "") + IM_END
        # The history block is "<|im_start|>assistant" + this body + "<|im_end|>\n"; the body starts with the
        # newline the generation prompt already holds.
        return _calls_body(msg.content, msg.tool_calls).removeprefix("\n") + IM_END

    # -- parsing -----------------------------------------------------------------------------------------

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        content, calls = parse_xml_calls(strip_end_marker(text), schemas=self.schemas, call_id_prefix=call_id_prefix)
        return Action(content=content, tool_calls=tuple(calls))


def _jinja_string(value: Any) -> str:
    """Jinja's `string` filter (and `~`): Python's `str`."""
    return value if isinstance(value, str) else str(value)


def _text_or_json(value: Any) -> str:
    """How the template writes a value: objects and arrays (Jinja mappings and non-string sequences) as JSON,
    anything else through `string`."""
    return tojson(value) if isinstance(value, (Mapping, list, tuple)) else _jinja_string(value)


def _extra_keys(fields: Any, handled: tuple[str, ...]) -> str:
    """The template's `render_extra_keys` macro: every key not handled, as `<key>value</key>`."""
    if not isinstance(fields, Mapping):
        return ""
    return "".join(f"\n<{key}>{_text_or_json(value)}</{key}>" for key, value in fields.items() if key not in handled)


def _tool_listing(function: Mapping[str, Any]) -> str:
    out = [f"\n<function>\n<name>{_jinja_string(function.get('name'))}</name>"]
    if "description" in function:
        out.append(f"\n<description>{_jinja_string(function['description']).strip()}</description>")
    out.append("\n<parameters>")
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if isinstance(properties, Mapping):
        for name, fields in properties.items():
            out.append(f"\n<parameter>\n<name>{name}</name>")
            if isinstance(fields, Mapping) and "type" in fields:
                out.append(f"\n<type>{_jinja_string(fields['type'])}</type>")
            if isinstance(fields, Mapping) and "description" in fields:
                out.append(f"\n<description>{_jinja_string(fields['description']).strip()}</description>")
            out.append(_extra_keys(fields, ("name", "type", "description")))
            out.append("\n</parameter>")
    out.append(_extra_keys(parameters, ("type", "properties")))
    out.append("\n</parameters>")
    out.append(_extra_keys(function, ("type", "name", "description", "parameters")))
    out.append("\n</function>")
    return "".join(out)


def _system_block(system: str | None, specs: list[ToolSpec]) -> str:
    if system is None and not specs:
        return ""
    out = [f"{IM_START}system\n{DEFAULT_SYSTEM if system is None else system}"]
    if specs:
        out.append(_TOOLS_HEADER)
        out.extend(_tool_listing(spec.function) for spec in specs)
        out.append(_TOOLS_FOOTER)
    out.append(f"{IM_END}\n")
    return "".join(out)


def _calls_body(content: str | None, calls: tuple[ToolCall, ...]) -> str:
    """What the template writes between "<|im_start|>assistant" and "<|im_end|>" for a turn with calls."""
    trimmed = (content or "").strip()
    out = [f"\n{trimmed}\n" if trimmed else ""]
    for call in calls:
        out.append(f"\n<tool_call>\n<function={call.name}>\n")
        out.extend(
            f"<parameter={key}>\n{_text_or_json(value)}\n</parameter>\n" for key, value in call.arguments.items()
        )
        out.append("</function>\n</tool_call>")
    return "".join(out)


def _render_body(msgs: list[Message], *, follows_turn: bool) -> list[str]:
    """The messages after the system block. `follows_turn`: they continue a conversation after an assistant
    turn (feedback), which matters to a leading tool message: the template opens the user turn that wraps tool
    responses only when a message precedes it."""
    out: list[str] = []
    last = len(msgs) - 1
    for index, msg in enumerate(msgs):
        if msg.role == "assistant" and msg.tool_calls:
            out.append(f"{IM_START}assistant{_calls_body(msg.content, msg.tool_calls)}{IM_END}\n")
        elif msg.role in ("user", "system", "assistant"):
            out.append(f"{IM_START}{msg.role}\n{msg.content or ''}{IM_END}\n")
        elif msg.role == "tool":
            if (index > 0 and msgs[index - 1].role != "tool") or (index == 0 and follows_turn):
                out.append(f"{IM_START}user\n")
            out.append(f"<tool_response>\n{msg.content or ''}\n</tool_response>\n")
            if index == last or msgs[index + 1].role != "tool":
                out.append(f"{IM_END}\n")
    return out


def _qwen3_coder() -> ChatMLProtocol:
    return Qwen3CoderProtocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"qwen3-coder": _qwen3_coder}
