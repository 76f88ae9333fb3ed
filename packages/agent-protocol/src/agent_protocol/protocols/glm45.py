"""The GLM-4.5 family's chat format (GLM-4.5, GLM-4.5-Air; GLM-4.6 as `glm-4.6`), in Python.

    [gMASK]<sop><|system|>
    # Tools ... <tools>{spec}</tools> ...<|user|>
    What's the weather in Paris?<|assistant|>
    <think>reasoning</think>
    content
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call><|observation|>
    <tool_response>
    {"temperature": 18}
    </tool_response><|assistant|>

Mirrors the official Jinja template (`tests/data/golden/templates/glm4.5.jinja`) statement by statement, its
quirks included: a null content prints as ``None`` (Jinja's text for None), reasoning is shown only for
assistant turns after the last user message (earlier ones get an empty ``<think></think>``), content and
reasoning are stripped, and with `enable_thinking=False` every user message ends with ``/nothink`` and the
generation prompt carries an empty ``<think></think>``. A tool message with null content makes the template
fail (it iterates the content), so it raises `MessageError` here. Content given as a list of text parts is
joined into one string at the boundary (`coerce_messages`), as for every family; for a *tool* message the
template would print each part's Python repr instead.

Turn boundaries. GLM has no end-of-turn token: the model ends its turn by writing the next role's token,
``<|observation|>`` before tool results or ``<|user|>`` (its generation config also stops on
``<|endoftext|>``). That token is sampled (part of the action) *and* the first token of what the template
renders next, so `render_feedback(ended_by=...)` leaves it out when it is the token the feedback starts with;
after a turn cut off by the length limit (`turn_closed=False`) no role token was sampled, and the feedback
writes it. Seams (the transcript differs from the official render), each pinned in the tests:
- the model wrote a role token that is not the one the feedback needs (``<|user|>`` but tool results follow,
  ``<|observation|>`` but a user message follows, ``<|endoftext|>``, or a system message follows): the sampled
  token stays and the feedback writes the needed one after it;
- an episode that ends on a generated turn ends on its sampled role token; the official render of the finished
  conversation stops before it;
- a new user message makes the template drop the reasoning of earlier turns; the transcript keeps it;
- with `enable_thinking=False` the model writes no reasoning (the prompt holds the empty block), so
  `render_generation` leaves a message's reasoning out where the template would show it.

GLM-4.6 (`glm-4.6`, golden `glm4.6`) renders every conversation this package sends exactly as GLM-4.5: its
template differs only in text that gives the same bytes (the user turn calls `visible_text` twice instead of
setting a variable) and in how it takes tool-call arguments that are not a mapping, which `coerce_messages`
never passes. It is the same class under its own name, so detection and the README can tell the two apart.

Parsing follows vLLM's ``glm45`` tool parser (`Glm4MoeModelToolParser`, vllm/tool_parsers/glm4_moe_tool_parser.py)
and ``glm45`` reasoning parser (vllm/reasoning/glm4_moe_reasoning_parser.py). Reasoning is the text between
``<think>`` and ``</think>``, stripped; unlike vLLM, reasoning never closed is the coded issue
``missing_think_end`` (vLLM returns it all as content), and text before a lone ``</think>`` is reasoning, as
the template reads it back (the shared `hermes_parser.split_reasoning`). The call name is the first line of a
``<tool_call>`` block, stripped; arguments are ``<arg_key>``/``<arg_value>`` pairs (whitespace allowed between
them), keys stripped; a value is stripped and decoded as JSON, else as a Python literal (what vLLM's
`_deserialize` does), else kept as the string. The tools of the request type the values, as vLLM's
`_is_string_type` does: `with_tools(tools)` returns a copy whose parser keeps the value of a parameter whose
schema says ``"type": "string"`` as the raw text between the tags, not stripped and not decoded (so "391" stays
the string "391"; as vLLM's parser at commit 081866a6, whose streaming rework keeps such values unstripped, where
earlier versions stripped them), and decodes every other value as above (a number, object or array by its JSON);
a protocol without tools (vLLM with no `tools` in the request) decodes every value. Content is the text before
the first call, stripped; text after a call is dropped, as vLLM does. Stricter than vLLM, which
skips or half-reads them: an unclosed call, a block without a name line and arguments outside the pair
structure become coded issues, so a malformed call is never run.
"""

from __future__ import annotations

import ast
import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from agent_protocol.broken_call import broken_call
from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.control_tokens import unmarked
from agent_protocol.errors import MessageError
from agent_protocol.hermes_parser import split_reasoning
from agent_protocol.json_limits import check_json_value, loads_bounded
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import Action, Message, MessageLike, ToolCall, ToolSpec, ToolSpecLike, coerce_tools

__all__ = ["PROTOCOLS", "Glm45Protocol", "Glm46Protocol"]

PREFIX: Final = "[gMASK]<sop>"
SYSTEM: Final = "<|system|>"
USER: Final = "<|user|>"
ASSISTANT: Final = "<|assistant|>"
OBSERVATION: Final = "<|observation|>"
ENDOFTEXT: Final = "<|endoftext|>"
EMPTY_THINK: Final = "\n<think></think>"
NOTHINK: Final = "/nothink"
CALL_OPEN: Final = "<tool_call>"
CALL_CLOSE: Final = "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"

_TOOLS_HEADER: Final = (
    f"{SYSTEM}\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_FOOTER: Final = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)
_FORMAT_HINT: Final = (
    "Write <tool_call>NAME, then one <arg_key>KEY</arg_key><arg_value>VALUE</arg_value> pair per argument, "
    "then </tool_call>."
)
#: longest argument value tried as a Python literal (vLLM's fallback after JSON); longer ones stay strings
_MAX_LITERAL: Final = 10_000


class Glm45Protocol(ChatProtocol):
    name = "glm-4.5"
    end_of_turn = ""  # a turn ends on the next role's token, which the model writes itself
    stop_texts = (USER, OBSERVATION, ENDOFTEXT)

    #: the template's name in messages that say what it refuses
    template = "GLM-4.5"

    def __init__(
        self, *, enable_thinking: bool = True, string_params: Mapping[str, frozenset[str]] | None = None
    ) -> None:
        self.enable_thinking = enable_thinking
        #: tool name -> its parameters whose schema type is "string" (kept raw by the parser, as vLLM does)
        self.string_params: dict[str, frozenset[str]] = dict(string_params or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(enable_thinking={self.enable_thinking}, tools={sorted(self.string_params)!r})"

    def with_tools(self, tools: Iterable[ToolSpecLike]) -> Glm45Protocol:
        """A copy whose parser types argument values by the schemas of `tools` (the tools the model is shown), as
        vLLM's parser does with the tools of the request: a parameter whose schema type is "string" keeps its
        raw text."""
        bound = copy.copy(self)
        bound.string_params = {
            spec.name: _string_params(spec.function.get("parameters")) for spec in coerce_tools(tools)
        }
        return bound

    @property
    def generation_prompt(self) -> str:
        return ASSISTANT if self.enable_thinking else ASSISTANT + EMPTY_THINK

    # -- rendering ---------------------------------------------------------------------------------------

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        out = [PREFIX, self._tools_block(specs or [])]
        last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
        for index, msg in enumerate(msgs):
            if msg.role == "assistant":
                out.append(ASSISTANT + self._history_turn(msg, after_last_user=index > last_user))
            else:
                out.append(self._render_other(msg, index, follows_tool=index > 0 and msgs[index - 1].role == "tool"))
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def _tools_block(self, specs: list[ToolSpec]) -> str:
        """The tool list as the template writes it (GLM-4.7 overrides this with its own layout)."""
        return _tools_block(specs)

    def _history_turn(self, msg: Message, *, after_last_user: bool) -> str:
        """An assistant turn in history; its reasoning shown after the last user message only (GLM-4.7 overrides
        this with its own layout and `clear_thinking`)."""
        return _render_assistant(msg, show_reasoning=after_last_user)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        # With thinking off the generation prompt already holds the empty reasoning block, and the model writes
        # no reasoning: a message's reasoning is left out (a seam where the template would show it).
        body = _render_assistant(msg, show_reasoning=self.enable_thinking)
        if not self.enable_thinking:
            body = body.removeprefix(EMPTY_THINK)
        # the model closes its turn with the next role's token: the observation after calls, else the user's
        return body + (OBSERVATION if msg.tool_calls else USER)

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        msgs = feedback_messages(messages)
        body = "".join(
            self._render_other(msg, index, follows_tool=index > 0 and msgs[index - 1].role == "tool")
            for index, msg in enumerate(msgs)
        )
        opening = _ROLE_TOKENS[msgs[0].role]
        # The role token a closed turn ended on is already in the transcript (None: the usual one, the token the
        # feedback opens with, when the model can write it). A cut-off turn sampled none, so it is written here;
        # after another sampled token it is written too (a seam: the official render has one role token there).
        written = ended_by if ended_by is not None else (opening if opening in self.stop_texts else None)
        if turn_closed and written == opening:
            body = body.removeprefix(opening)
        return body + self.generation_prompt

    def _render_other(self, msg: Message, index: int, *, follows_tool: bool) -> str:
        """A user, system or tool message (`follows_tool`: the message before it is a tool result too)."""
        content = visible(msg.content)
        if msg.role == "user":
            nothink = NOTHINK if not self.enable_thinking and not unmarked(content).endswith(NOTHINK) else ""
            return f"{USER}\n{content}{nothink}"
        if msg.role == "system":
            return f"{SYSTEM}\n{content}"
        self._refuse_null_tool_content(msg, index)
        return ("" if follows_tool else OBSERVATION) + f"\n<tool_response>\n{content}\n</tool_response>"

    def _refuse_null_tool_content(self, msg: Message, index: int) -> None:
        if msg.content is None:
            raise MessageError(
                f"messages[{index}].content",
                f"the official {self.template} template cannot render a tool message with null content "
                "(it iterates the content as a list of results); send the result as a string",
            )

    # -- parsing -----------------------------------------------------------------------------------------

    def _parse_call(self, body: str, call_id: str) -> ToolCall:
        """One closed `<tool_call>` block (its text between the tags)."""
        return _parse_call(body, call_id, self.string_params)

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        for marker in self.stop_texts:
            if text.endswith(marker):
                text = text[: -len(marker)]
                break
        reasoning, content, issue = split_reasoning(text)
        if reasoning is not None:
            reasoning = reasoning.strip()
        if issue is not None:
            return Action(content="", reasoning_content=reasoning, error=issue)
        first = content.find(CALL_OPEN)
        if first < 0:
            return Action(content=content.strip(), reasoning_content=reasoning)
        calls: list[ToolCall] = []
        pos = first
        while pos >= 0:
            body_start = pos + len(CALL_OPEN)
            close = content.find(CALL_CLOSE, body_start)
            call_id = f"{call_id_prefix}_{len(calls)}"
            if close < 0:
                calls.append(_unclosed_call(content[body_start:], call_id))
                break
            calls.append(self._parse_call(content[body_start:close], call_id))
            pos = content.find(CALL_OPEN, close + len(CALL_CLOSE))
        return Action(content=content[:first].strip(), reasoning_content=reasoning, tool_calls=tuple(calls))


_ROLE_TOKENS: Final = {"user": USER, "system": SYSTEM, "tool": OBSERVATION}


def visible(content: str | None) -> str:
    """The template's `visible_text`: the content, or Jinja's text for a null one (GLM-4.7's too)."""
    return "None" if content is None else content


def reasoning_and_content(msg: Message) -> tuple[str, str]:
    """The reasoning and content of an assistant turn as the GLM templates read them: `reasoning_content`, or
    the text before `</think>` in the content (the content is then what follows it)."""
    content = visible(msg.content)
    if msg.reasoning_content is not None:
        return msg.reasoning_content, content
    if "</think>" in content:
        return (
            content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n"),
            content.split("</think>")[-1].lstrip("\n"),
        )
    return "", content


def _tools_block(specs: list[ToolSpec]) -> str:
    if not specs:
        return ""
    return _TOOLS_HEADER + "".join(tojson_kept(spec.to_openai()) + "\n" for spec in specs) + _TOOLS_FOOTER


def _render_assistant(msg: Message, *, show_reasoning: bool) -> str:
    """An assistant turn after its `<|assistant|>` token, without the role token that ends it."""
    reasoning, content = reasoning_and_content(msg)
    out = [f"\n<think>{reasoning.strip()}</think>" if show_reasoning and reasoning else EMPTY_THINK]
    if content.strip():
        out.append("\n" + content.strip())
    for call in msg.tool_calls:
        out.append(f"\n{CALL_OPEN}{call.name}\n")
        for key, value in call.arguments.items():
            shown = value if isinstance(value, str) else tojson(value)
            out.append(f"{KEY_OPEN}{key}{KEY_CLOSE}\n{VALUE_OPEN}{shown}{VALUE_CLOSE}\n")
        out.append(CALL_CLOSE)
    return "".join(out)


def _unclosed_call(body: str, call_id: str) -> ToolCall:
    name = body.split("\n", 1)[0].split("<", 1)[0].strip() if "\n" in body else ""
    message = "The tool call was cut off before </tool_call>; nothing in it was run."
    return broken_call(call_id, body, "unclosed_tag", message, name=name)


def _string_params(parameters: Any) -> frozenset[str]:
    """The parameters whose JSON schema says `"type": "string"` (vLLM's `_is_string_type`: exactly that type;
    a union type or a schema without a type is not a string type)."""
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if not isinstance(properties, Mapping):
        return frozenset()
    return frozenset(
        name for name, schema in properties.items() if isinstance(schema, Mapping) and schema.get("type") == "string"
    )


def _parse_call(body: str, call_id: str, string_params: Mapping[str, frozenset[str]]) -> ToolCall:
    """One closed `<tool_call>` block: the name line, then the argument pairs (`string_params`: see `with_tools`)."""
    newline = body.find("\n")
    if newline < 0:
        message = f"The tool call cannot be read: the function name must be on its own line. {_FORMAT_HINT}"
        return broken_call(call_id, body, "invalid_arguments", message)
    name = body[:newline].strip()
    try:
        arguments = arguments_of(body[newline + 1 :], string_params.get(name))
    except ValueError as e:  # JsonLimitError included
        message = f"The tool call cannot be read: {e}. {_FORMAT_HINT}"
        return broken_call(call_id, body, "invalid_arguments", message, name=name)
    if not name:
        message = f"The tool call has no function name on its first line. {_FORMAT_HINT}"
        return broken_call(call_id, body, "missing_name", message)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def arguments_of(text: str, raw_keys: frozenset[str] | None = None) -> dict[str, Any]:
    """The `<arg_key>`/`<arg_value>` pairs of a call body, in order (a repeated key: the last value wins, as in
    vLLM); the value of a key in `raw_keys` (a string-typed parameter) is kept as written. Raises ValueError
    saying what is wrong when anything but whitespace lies outside the pairs."""
    arguments: dict[str, Any] = {}
    pos = _skip_space(text, 0)
    while pos < len(text):
        if not text.startswith(KEY_OPEN, pos):
            raise ValueError(f"it has text outside the <arg_key>/<arg_value> pairs ({_preview(text[pos:])})")
        key_end = text.find(KEY_CLOSE, pos)
        if key_end < 0:
            raise ValueError("an <arg_key> is never closed with </arg_key>")
        key = text[pos + len(KEY_OPEN) : key_end].strip()
        pos = _skip_space(text, key_end + len(KEY_CLOSE))
        if not text.startswith(VALUE_OPEN, pos):
            raise ValueError(f"the argument {_preview(key)} has no <arg_value> right after its key")
        value_end = text.find(VALUE_CLOSE, pos)
        if value_end < 0:
            raise ValueError(f"the value of {_preview(key)} is never closed with </arg_value>")
        written = text[pos + len(VALUE_OPEN) : value_end]
        arguments[key] = written if raw_keys and key in raw_keys else _value(written.strip())
        pos = _skip_space(text, value_end + len(VALUE_CLOSE))
    check_json_value(arguments)  # a value kept as text, or a key, may hold what no tokenizer or log can take
    return arguments


def _value(text: str) -> Any:
    """vLLM's `_deserialize`: JSON, else a Python literal (normalized to what JSON can hold, as vLLM's
    `json.dumps` of the arguments does), else the text itself."""
    try:
        return loads_bounded(text)
    except json.JSONDecodeError:
        pass
    if len(text) > _MAX_LITERAL:
        return text
    try:
        literal = ast.literal_eval(text)
        return loads_bounded(json.dumps(literal, ensure_ascii=False))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # JsonLimitError is a ValueError
        return text


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _preview(text: str) -> str:
    return json.dumps(text[:40] + ("..." if len(text) > 40 else ""), ensure_ascii=False)


class Glm46Protocol(Glm45Protocol):
    """GLM-4.6: GLM-4.5's format under its own name (see the module docstring)."""

    name = "glm-4.6"
    template = "GLM-4.6"


def _glm45(*, enable_thinking: bool = True) -> ChatProtocol:
    return Glm45Protocol(enable_thinking=enable_thinking)


def _glm46(*, enable_thinking: bool = True) -> ChatProtocol:
    return Glm46Protocol(enable_thinking=enable_thinking)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"glm-4.5": _glm45, "glm-4.6": _glm46}
