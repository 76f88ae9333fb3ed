"""The MiniMax-M2 chat format (MiniMaxAI/MiniMax-M2), in Python.

    ]~!b[]~b]system
    You are a helpful assistant.

    # Tools
    ... <tools>
    <tool>{spec}</tool>
    </tools> ...[e~[
    ]~b]user
    What's the weather in Paris?[e~[
    ]~b]ai
    <think>
    reasoning
    </think>

    Let me check.
    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>[e~[
    ]~b]tool
    <response>{"temperature": 18}</response>[e~[
    ]~b]ai
    <think>

Mirrors the official Jinja template (`tests/data/golden/templates/minimax_m2.jinja`) statement by statement, its
quirks included: the system block is always written (``You are a helpful assistant.`` when the first message is
not a system message or its content is empty); a system message anywhere else is dropped; a null content prints
as ``None`` (Jinja's text for None); reasoning is shown only for assistant turns after the last user message and
is not stripped (reasoning read out of a content's ``</think>`` is stripped of newlines, as the template does);
argument values are written raw when they are strings and as JSON otherwise; consecutive tool results share one
``]~b]tool`` turn, one ``<response>`` each. The template refuses (and so does `render_messages`, with a
`MessageError`): a tool message unless the last assistant turn before it had calls, a tool message with null
content (it iterates the content), and a tool given without a ``function`` object (it dumps ``tool.function``).
Content given as a list of text parts is joined into one string at the boundary (`coerce_messages`), as for
every family; for a *tool* message the template would write each part as its own ``<response>``, closed by
``\n</response>``. The system message's ``current_date``/``current_location`` keys, which the template prints,
are not message fields here.

Interleaved thinking: the generation prompt opens the reasoning (``]~b]ai\\n<think>\\n``), so the model writes its
reasoning, ``</think>``, then its answer or calls, then ``[e~[``. The template keeps the reasoning of every turn
after the last user message, so a tool-calling episode is append-only. Seams (the transcript differs from the
official render), each pinned in the tests:
- a turn the model wrote with empty reasoning: the transcript holds the prompt's ``<think>\\n`` and the model's
  ``</think>\\n\\n``; the template renders a turn without reasoning with no think block at all;
- a new user message makes the template drop the reasoning of the turns before it; the transcript keeps it;
- a turn re-rendered from its parse can differ from what was sampled where the parse normalizes (newlines around
  the reasoning and the content, whitespace around a value, ``null`` written for a string), as for Qwen3-Coder.

Parsing follows vLLM's ``minimax_m2`` tool parser (`MinimaxM2ToolParser`, vllm/tool_parsers/minimax_m2_tool_parser.py,
non-streaming `extract_tool_calls`) and its ``minimax_m2`` reasoning parser (vllm/reasoning/
minimax_m2_reasoning_parser.py, a `BaseThinkingReasoningParser` on ``<think>``/``</think>``). Reasoning is the text
before ``</think>`` (after a ``<think>`` the model may repeat), content the text after it; each is stripped of
newlines here (vLLM keeps them) so that a parsed turn renders back as it was written. Reasoning never closed is
the coded issue ``missing_think_end`` (vLLM returns it all as reasoning). Calls are read from every closed
``<minimax:tool_call>`` block: each ``<invoke name=NAME>`` up to its ``</invoke>`` is a call (the name stripped of
whitespace and of one pair of quotes), each ``<parameter name=KEY>VALUE</parameter>`` in it an argument (the
first ``</parameter>`` ends it; a repeated key: the last wins), the value stripped of whitespace and then typed
as vLLM types it: ``null``/``none``/``nil`` (any case) is null whatever the type; otherwise the types the
parameter's schema allows (``type``, a list of types, the types of its ``enum`` values, ``anyOf``/``oneOf``/
``allOf``) are tried in the order integer, number, boolean (``true/1/yes/on``, ``false/0/no/off``), object/array
(JSON), string; a parameter the schema does not name is a string; no type that fits: JSON, else the text. The
schemas are the tools of the request: `with_tools(tools)` returns a copy that knows them; without them (vLLM
with no `tools` in the request) every value but the null words is a string. Content is the text before the first
block; text after the blocks is dropped, as vLLM does. Stricter than vLLM, which skips them silently: a block or
an invoke that is never closed (``unclosed_tag``), an invoke without a name (``missing_name``), a parameter
without a name or never closed and a value beyond the JSON limits (``invalid_arguments``) become coded issues on
the call, so a malformed call is never run. A number too large for a float (``1e999``), which makes vLLM drop
every call of the turn, is tried as the next type here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from agent_protocol.broken_call import broken_call
from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import MessageError
from agent_protocol.json_limits import check_json_value, loads_bounded
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import (
    Action,
    Message,
    MessageLike,
    ParseIssue,
    ToolCall,
    ToolSpec,
    ToolSpecLike,
    coerce_tools,
)

__all__ = ["PROTOCOLS", "MiniMaxM2Protocol"]

BOS: Final = "]~!b["
ROLE: Final = "]~b]"
EOS: Final = "[e~["
AI: Final = ROLE + "ai\n"
THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
CALL_OPEN: Final = "<minimax:tool_call>"
CALL_CLOSE: Final = "</minimax:tool_call>"
INVOKE_OPEN: Final = "<invoke name="
INVOKE_CLOSE: Final = "</invoke>"
PARAMETER_OPEN: Final = "<parameter name="
PARAMETER_CLOSE: Final = "</parameter>"
DEFAULT_SYSTEM: Final = "You are a helpful assistant."

_TOOLS_HEADER: Final = (
    "\n\n# Tools\nYou may call one or more tools to assist with the user query.\n"
    "Here are the tools available in JSONSchema format:\n\n<tools>\n"
)
_TOOLS_FOOTER: Final = (
    "</tools>\n\nWhen making tool calls, use XML format to invoke tools and pass parameters:\n\n"
    f'{CALL_OPEN}\n<invoke name="tool-name-1">\n<parameter name="param-key-1">param-value-1</parameter>\n'
    f'<parameter name="param-key-2">param-value-2</parameter>\n...\n</invoke>\n{CALL_CLOSE}'
)
_FORMAT_HINT: Final = (
    f'Write {CALL_OPEN}, then <invoke name="NAME"> with one <parameter name="KEY">VALUE</parameter> per argument '
    f"and </invoke> for each call, then {CALL_CLOSE}."
)
_NULL_WORDS: Final = ("null", "none", "nil")
#: the types vLLM tries, in its order (a type not listed is not tried; then JSON, else the text)
_TYPE_ORDER: Final = (
    "integer",
    "int",
    "number",
    "float",
    "boolean",
    "bool",
    "object",
    "array",
    "string",
    "str",
    "text",
)
_NAME_FORBIDDEN: Final = frozenset("<>\"' \t\n\r")

#: tool name -> the `properties` of its parameters schema
Schemas = Mapping[str, Mapping[str, Any]]


class MiniMaxM2Protocol(ChatProtocol):
    name = "minimax-m2"
    end_of_turn = EOS
    stop_texts = (EOS,)

    #: the template's name in messages that say what it refuses
    template = "MiniMax-M2"

    def __init__(self, schemas: Schemas | None = None) -> None:
        #: tool name -> the `properties` of its parameters schema, for typing parsed values (see `with_tools`)
        self.schemas: dict[str, Mapping[str, Any]] = dict(schemas or {})

    @property
    def generation_prompt(self) -> str:
        return AI + THINK_OPEN + "\n"

    def __repr__(self) -> str:
        return f"MiniMaxM2Protocol(tools={sorted(self.schemas)!r})"

    def with_tools(self, tools: Iterable[ToolSpecLike]) -> MiniMaxM2Protocol:
        """A copy whose parser types argument values by the schemas of `tools` (the tools the model is shown), as
        vLLM's parser does with the tools of the request (the first tool of a name wins, as there)."""
        schemas: dict[str, Mapping[str, Any]] = {}
        for spec in coerce_tools(tools):
            parameters = spec.function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            schemas.setdefault(spec.name, properties if isinstance(properties, Mapping) else {})
        return type(self)(schemas)

    # -- rendering ---------------------------------------------------------------------------------------

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        system = msgs[0] if msgs and msgs[0].role == "system" else None
        offset = 1 if system is not None else 0
        turns = msgs[offset:]
        out = [BOS, ROLE, "system\n", system.content if system is not None and system.content else DEFAULT_SYSTEM]
        if specs:
            out.append(self._tools_block(specs))
        out.append(EOS + "\n")
        last_user = max((i for i, m in enumerate(turns) if m.role == "user"), default=-1)
        out.extend(self._render_turns(turns, offset=offset, last_user=last_user, after_calls=False))
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        reasoning, rest = _assistant_parts(msg)
        # the generation prompt opened the reasoning; the model closes it (an empty one too: a seam)
        return (f"{reasoning}\n{THINK_CLOSE}\n\n" if reasoning else f"{THINK_CLOSE}\n\n") + rest + EOS

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        msgs = feedback_messages(messages)
        # The model wrote "[e~[" (a closed turn); history has "[e~[\n". A turn cut off wrote neither. The turn
        # before the feedback is an assistant turn, so a leading tool result opens a tool turn, and whether it had
        # calls is not known here (the template refuses tool results after a turn without calls).
        body = self._render_turns(msgs, offset=0, last_user=-1, after_calls=None)
        return ("\n" if turn_closed else EOS + "\n") + "".join(body) + self.generation_prompt

    def _tools_block(self, specs: list[ToolSpec]) -> str:
        listed = []
        for index, spec in enumerate(specs):
            sent = spec.to_openai()
            function = sent.get("function")
            if function is None:
                raise MessageError(
                    f"tools[{index}]",
                    f"the official {self.template} template dumps each tool's `function` object, and this tool has "
                    'none; send it as {"type": "function", "function": {...}}',
                )
            listed.append(f"<tool>{tojson_kept(function)}</tool>\n")
        return _TOOLS_HEADER + "".join(listed) + _TOOLS_FOOTER

    def _render_turns(
        self,
        turns: list[Message],
        *,
        offset: int,
        last_user: int,
        after_calls: bool | None,
    ) -> list[str]:
        """The messages after the system block (`offset`: the index of `turns[0]` in the caller's messages).
        `after_calls`: whether the last assistant turn so far had calls (None: unknown, not checked)."""
        out: list[str] = []
        last = len(turns) - 1
        for index, msg in enumerate(turns):
            if msg.role == "assistant":
                reasoning, rest = _assistant_parts(msg)
                think = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n" if reasoning and index > last_user else ""
                out.append(f"{AI}{think}{rest}{EOS}\n")
                after_calls = bool(msg.tool_calls)
            elif msg.role == "user":
                out.append(f"{ROLE}user\n{_visible(msg.content)}{EOS}\n")
            elif msg.role == "tool":
                where = f"messages[{offset + index}]"
                if after_calls is False:
                    raise MessageError(
                        where,
                        f"the official {self.template} template refuses a tool message unless the last assistant "
                        "turn before it made tool calls",
                    )
                if msg.content is None:
                    raise MessageError(
                        f"{where}.content",
                        f"the official {self.template} template cannot render a tool message with null content "
                        "(it iterates the content as a list of results); send the result as a string",
                    )
                if index == 0 or turns[index - 1].role != "tool":
                    out.append(ROLE + "tool")
                out.append(f"\n<response>{msg.content}</response>")
                if index == last or turns[index + 1].role != "tool":
                    out.append(EOS + "\n")
            # a system message after the first is dropped, as the template's loop renders no system turn
        return out

    # -- parsing -----------------------------------------------------------------------------------------

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        text = text.removesuffix(EOS)
        reasoning, closed, after = text.partition(THINK_CLOSE)
        _, opened, repeated = reasoning.partition(THINK_OPEN)
        if opened:  # the model wrote the opening tag the prompt already holds (vLLM reads after it)
            reasoning = repeated
        if not closed:
            issue = ParseIssue(
                code="missing_think_end",
                message=f"Your reasoning was never closed with {THINK_CLOSE}; nothing after it was read or run.",
            )
            return Action(content="", reasoning_content=reasoning.strip("\n") or None, error=issue)
        thought = reasoning.strip("\n") or None
        first = after.find(CALL_OPEN)
        if first < 0:
            return Action(content=after.strip("\n"), reasoning_content=thought)
        calls = _read_calls(after, first, self.schemas, call_id_prefix)
        if not calls:  # blocks without a single invoke: vLLM keeps the whole text as content
            return Action(content=after.strip("\n"), reasoning_content=thought)
        return Action(content=after[:first].strip("\n"), reasoning_content=thought, tool_calls=tuple(calls))


def _visible(content: str | None) -> str:
    """The template's `visible_text`: the content, or Jinja's text for a null one."""
    return "None" if content is None else content


def _assistant_parts(msg: Message) -> tuple[str, str]:
    """(the reasoning, what follows the think block) of an assistant turn as the template reads it: the
    `reasoning_content` as given, else what the content holds before `</think>`."""
    content = _visible(msg.content)
    reasoning = ""
    if msg.reasoning_content is not None:
        reasoning = msg.reasoning_content
    elif THINK_CLOSE in content:
        reasoning = content.split(THINK_CLOSE)[0].strip("\n").split(THINK_OPEN)[-1].strip("\n")
        content = content.split(THINK_CLOSE)[-1].strip("\n")
    out = [content]
    if msg.tool_calls:
        out.append(f"\n{CALL_OPEN}\n")
        for call in msg.tool_calls:
            out.append(f'<invoke name="{call.name}">\n')
            for key, value in call.arguments.items():
                shown = value if isinstance(value, str) else tojson(value)
                out.append(f'<parameter name="{key}">{shown}{PARAMETER_CLOSE}\n')
            out.append(INVOKE_CLOSE + "\n")
        out.append(CALL_CLOSE)
    return reasoning, "".join(out)


# -- calls ----------------------------------------------------------------------------------------------------


def _read_calls(text: str, pos: int, schemas: Schemas, prefix: str) -> list[ToolCall]:
    """Every invoke of every `<minimax:tool_call>` block from `pos` on, in order."""
    calls: list[ToolCall] = []
    while True:
        start = text.find(CALL_OPEN, pos)
        if start < 0:
            return calls
        body = start + len(CALL_OPEN)
        end = text.find(CALL_CLOSE, body)
        if end < 0:  # cut off: what it holds is not run
            message = f"The tool call was cut off before {CALL_CLOSE}; nothing in it was run."
            calls.append(broken_call(f"{prefix}_{len(calls)}", text[start:], "unclosed_tag", message))
            return calls
        _read_invokes(text[body:end], schemas, prefix, calls)
        pos = end + len(CALL_CLOSE)


def _read_invokes(block: str, schemas: Schemas, prefix: str, calls: list[ToolCall]) -> None:
    pos = 0
    while True:
        start = block.find(INVOKE_OPEN, pos)
        if start < 0:
            return
        end = block.find(INVOKE_CLOSE, start)
        call_id = f"{prefix}_{len(calls)}"
        if end < 0:
            message = f"The tool call was cut off before {INVOKE_CLOSE}; nothing in it was run."
            calls.append(broken_call(call_id, block[start:], "unclosed_tag", message))
            return
        calls.append(_read_invoke(block[start + len(INVOKE_OPEN) : end], block[start : end + len(INVOKE_CLOSE)],
                                  schemas, call_id))  # fmt: skip
        pos = end + len(INVOKE_CLOSE)


def _unquoted(text: str) -> str:
    """vLLM's `_extract_name`: stripped, and one pair of matching quotes removed."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def _read_invoke(inner: str, raw: str, schemas: Schemas, call_id: str) -> ToolCall:
    """One invoke: `inner` is what lies between `<invoke name=` and `</invoke>`."""
    close = inner.find(">")
    name = _unquoted(inner[:close]) if close > 0 else ""
    if not name or any(c in _NAME_FORBIDDEN for c in name):
        message = f"The tool call has no valid function name. {_FORMAT_HINT}"
        return broken_call(call_id, raw, "missing_name", message)
    properties = schemas.get(name) or {}
    arguments: dict[str, Any] = {}
    try:
        pos = close + 1
        while True:
            start = inner.find(PARAMETER_OPEN, pos)
            if start < 0:
                break
            end = inner.find(PARAMETER_CLOSE, start)
            if end < 0:
                raise ValueError(f"a {PARAMETER_OPEN}...> is never closed with {PARAMETER_CLOSE}")
            written = inner[start + len(PARAMETER_OPEN) : end]
            key_end = written.find(">")
            key = _unquoted(written[:key_end]) if key_end > 0 else ""
            if not key:
                raise ValueError(f"a parameter has no name ({_preview(written)})")
            arguments[key] = convert_value(written[key_end + 1 :].strip(), _param_types(properties, key))
            pos = end + len(PARAMETER_CLOSE)
        check_json_value(arguments)  # a key or a kept text may hold what no tokenizer or log can take
    except ValueError as e:  # JsonLimitError included
        message = f"The tool call cannot be read: {e}. {_FORMAT_HINT}"
        return broken_call(call_id, raw, "invalid_arguments", message, name=name)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _preview(text: str) -> str:
    return json.dumps(text[:40] + ("..." if len(text) > 40 else ""), ensure_ascii=False)


# -- values ---------------------------------------------------------------------------------------------------


def _param_types(properties: Mapping[str, Any], key: str) -> set[str]:
    """The types the schema of parameter `key` allows; {"string"} for a parameter it does not name."""
    return _schema_types(properties[key]) if key in properties else {"string"}


def _schema_types(schema: Any) -> set[str]:
    """vLLM's `_extract_types_from_schema`: `type` (a name or a list), the types of the `enum` values, and those
    of every `anyOf`/`oneOf`/`allOf` choice; {"string"} when none is found."""
    if not isinstance(schema, Mapping):
        return {"string"}
    types: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        types.add(kind)
    elif isinstance(kind, list):
        types.update(t for t in kind if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        types.update(_json_type(value) for value in enum)
    for choices in (schema.get("anyOf"), schema.get("oneOf"), schema.get("allOf")):
        if isinstance(choices, list):
            for choice in choices:
                types |= _schema_types(choice)
    return types or {"string"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "string"


def convert_value(value: str, types: set[str]) -> Any:
    """A parameter's text typed as vLLM's `_convert_param_value_with_types` types it (see the module docstring).
    Raises `JsonLimitError` for JSON beyond the limits."""
    if value.lower() in _NULL_WORDS:
        return None
    allowed = {t.lower() for t in types}
    for kind in _TYPE_ORDER:
        if kind not in allowed:
            continue
        if kind in ("string", "str", "text"):
            return value
        if kind in ("integer", "int"):
            try:
                return int(value)
            except ValueError:
                continue
        elif kind in ("number", "float"):
            try:
                number = float(value)
                return number if number != int(number) else int(number)
            except (ValueError, OverflowError):  # not a number, NaN, or an infinity (which vLLM fails on)
                continue
        elif kind in ("boolean", "bool"):
            word = value.lower().strip()
            if word in ("true", "1", "yes", "on"):
                return True
            if word in ("false", "0", "no", "off"):
                return False
        else:  # object, array
            try:
                return _json(value)
            except json.JSONDecodeError:
                continue
    try:
        return _json(value)
    except json.JSONDecodeError:
        return value


def _json(text: str) -> Any:
    """`json.loads` within the limits; JSON that decodes to NaN or an infinity (``1e999``, ``NaN``), which no
    JSON value can hold, counts as not JSON (the text is kept)."""
    value = loads_bounded(text)
    try:
        json.dumps(value, allow_nan=False)
    except ValueError as e:
        raise json.JSONDecodeError("not a finite JSON value", text, 0) from e
    return value


def _minimax_m2() -> ChatProtocol:
    return MiniMaxM2Protocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"minimax-m2": _minimax_m2}
