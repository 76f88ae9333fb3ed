"""Gemma 3 with tools, as vLLM serves it: `get_protocol("gemma3-vllm-pythonic")`.

Gemma 3 has no official tool format (its own template, `gemma3`, renders no tools). vLLM ships a tool template of
its own for it, NOT an official one: vllm-project/vllm examples/tool_chat_template_gemma3_pythonic.jinja
(tests/data/golden/templates/gemma3_vllm_pythonic.jinja, provenance in SOURCES.md), meant to be served with
vLLM's `pythonic` tool parser. This module renders that template byte for byte, as Hugging Face renders it:

    <bos><start_of_turn>user
    {system text}\\n\\n{the tool preamble and `tools | tojson(indent=4)`}\\n\\n{user text}<end_of_turn>
    <start_of_turn>model
    [lookup(q="x")]<end_of_turn>
    <start_of_turn>user
    <tool_response>
    {result}</tool_response><end_of_turn>
    <start_of_turn>model

- As in `gemma3`: `<bos>`; a first system message is a prefix of the first turn (its text untrimmed, or its first
  text part, and a blank line); every other message a `<start_of_turn>{role}` turn with its content trimmed,
  `assistant` written `model`; null content raises "Invalid content type".
- With tools (an empty list included: only None leaves it out) the first turn, after the system prefix, holds a
  fixed preamble and the tool list dumped with `tojson(indent=4)`, each tool as the client gave it.
- An assistant turn with calls is `[name(key=value...), ...]` (each value `tojson`), then its content trimmed. The
  template never writes the `, ` between two arguments (its `{% set first = false %}` does not outlive one loop
  iteration, as Jinja scopes it), so a call with several arguments is `f(a=1b="x")` in history.
- A tool message is a `user` turn: `<tool_response>\\n{content trimmed}</tool_response>`.
- Roles must alternate user/model/... counting only the messages that are neither tool messages nor turns with
  calls: so tool results follow a call turn, and the model answers them (a user message right after tool results
  is refused). `render_feedback` cannot see the turn it follows: feedback that opens with tool results is taken
  to follow a call turn (the model answers them next), any other to follow a turn without calls (a user message
  first). So tool results after a turn without calls, which the template would write as `user` turns, are
  refused here when a user message follows them (no episode writes results without calls).
- An assistant message given `tool_calls: []` is a call turn with no calls, as the template takes it (`[]`, not
  counted in the alternation); `tool_calls: null` is refused (the template fails iterating it). Call arguments
  are objects (vLLM parses a JSON string before it renders).

Parsing follows vLLM's `pythonic` tool parser (agent_protocol.pythonic_calls): a turn that is a Python list of
calls with literal keyword arguments is calls and no content; any other turn is content; a turn that starts like a
call list and cannot be read is one broken call with a coded issue (vLLM returns it as content). No reasoning:
an assistant message's `reasoning_content` is dropped, in history and by `render_generation`, as the template
drops it.

`render_generation` writes a call turn as vLLM's parser reads it: the call list alone, `, ` between arguments,
and `True`/`False`/`None` in Python where the template, dumping values with `tojson`, writes `true`/`false`/`null`.
Seams where the template is not append-only: a call with several arguments (history drops the `, ` between them)
or with a boolean or null value (history spells it in JSON), neither of which vLLM's parser would read back; a
turn's content is trimmed in history (a generated turn with outer whitespace re-renders without it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any, Final

from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import MessageError
from agent_protocol.protocols.gemma3 import BOS, END_OF_TURN, START_OF_TURN, Gemma3Protocol
from agent_protocol.pythonic_calls import read_pythonic, write_pythonic
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import (
    Action,
    Message,
    MessageLike,
    ToolCall,
    ToolSpec,
    ToolSpecLike,
    coerce_messages,
    coerce_tools,
)

__all__ = ["PROTOCOLS", "TOOL_PREAMBLE", "Gemma3PythonicProtocol"]

TOOL_RESPONSE_OPEN: Final = "<tool_response>\n"
TOOL_RESPONSE_CLOSE: Final = "</tool_response>"
#: what the template writes before the tool list
TOOL_PREAMBLE: Final = (
    "Tools (functions) are available. If you decide to invoke one or more of the tools, you must respond with a "
    "python list of the function calls.\n"
    "Example Format: [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)] \n"
    "Do not use variables. DO NOT USE MARKDOWN SYNTAX. You SHOULD NOT include any other text in the response if "
    "you call a function. If none of the functions can be used, point it out. If you lack the parameters required "
    "by the function, also point it out.\n"
    "Here is a list of functions in JSON format that you can invoke.\n"
)
_TEMPLATE: Final = "vLLM's Gemma 3 pythonic tool template"
_ALTERNATE: Final = (
    f"{_TEMPLATE} requires roles to alternate user/assistant/user/assistant/... (tool messages and turns with "
    "tool calls not counted) "
)


class Gemma3PythonicProtocol(Gemma3Protocol):
    """Gemma 3 turns with vLLM's pythonic tool template (see the module docstring)."""

    name = "gemma3-vllm-pythonic"

    def __repr__(self) -> str:
        return "Gemma3PythonicProtocol()"

    def render_messages(
        self,
        messages: Iterable[MessageLike],
        *,
        tools: Iterable[ToolSpecLike] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """As every family's, and the indices of the messages given `tool_calls: []` (which coercion forgets) are
        read from the caller's dicts first and passed down: no state is kept on the protocol, which serves
        concurrent renders."""
        messages = self.prepare_raw(messages, tools_given=tools is not None)  # Gemma 3's checks of part lists
        empty = _empty_call_lists(messages) if isinstance(messages, list) else frozenset()
        msgs = coerce_messages(messages, images=self.accepts_images)
        specs = None if tools is None else coerce_tools(tools)
        return self._render(msgs, specs, add_generation_prompt=add_generation_prompt, empty=empty)

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        return self._render(msgs, specs, add_generation_prompt=add_generation_prompt, empty=frozenset())

    def _render(
        self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool, empty: frozenset[int]
    ) -> str:
        if not msgs:
            raise MessageError("messages", f"{_TEMPLATE} reads messages[0]: it renders no empty conversation")
        _check_null_content(msgs, 0)
        prefix, start = "", 0
        if msgs[0].role == "system":
            prefix, start = (msgs[0].content or "") + "\n\n", 1
        loop = msgs[start:]
        listed = {i - start for i in empty}  # places in `loop` of the turns given `tool_calls: []`
        _check_alternation(loop, start, first_counted=0, listed=listed)
        if specs is not None:
            prefix += TOOL_PREAMBLE + tojson_kept([s.to_openai() for s in specs], indent=4) + "\n\n"
        out = [BOS]
        for place, msg in enumerate(loop):
            out.append(_turn(msg, prefix if place == 0 else "", listed=place in listed))
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)  # reasoning_content is dropped, as the template drops it
        if msg.tool_calls:
            if msg.content:
                raise MessageError(
                    "message.content",
                    "vLLM's pythonic parser reads a turn as calls only when it is the call list alone; a turn with "
                    "calls has no content",
                )
            return write_pythonic(msg.tool_calls) + END_OF_TURN
        return (msg.content or "") + END_OF_TURN

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        msgs = feedback_messages(messages)
        if not msgs:
            raise MessageError("messages", "no feedback to render")
        _check_null_content(msgs, 0)
        # Tool results open the feedback after a call turn, which the alternation does not count: the model
        # answers them next. Any other feedback follows a model turn without calls, and opens with a user message.
        after_calls = msgs[0].role == "tool"
        _check_alternation(msgs, 0, first_counted=1 if after_calls else 0, feedback=True)
        close = "" if turn_closed else END_OF_TURN
        return close + "\n" + "".join(_turn(msg, "") for msg in msgs) + self.generation_prompt

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        """vLLM's `pythonic` tool parser (see agent_protocol.pythonic_calls), on the text up to the
        `<end_of_turn>` the engine stopped on; no reasoning parser."""
        closed = text.endswith(END_OF_TURN)
        content, calls = read_pythonic(text.removesuffix(END_OF_TURN), closed=closed, call_id_prefix=call_id_prefix)
        return Action(content=content, tool_calls=tuple(calls))


def _check_null_content(msgs: list[Message], offset: int) -> None:
    for index, msg in enumerate(msgs):
        if msg.content is None:
            raise MessageError(
                f"messages[{offset + index}].content", f"null; {_TEMPLATE} raises 'Invalid content type'"
            )


def _empty_call_lists(messages: list[Any]) -> frozenset[int]:
    """The indices of assistant messages given `tool_calls: []`, which the template renders as a call turn (`[]`,
    not counted in the alternation); `tool_calls: null` is refused, as the template fails iterating it."""
    empty = set()
    for index, message in enumerate(messages):
        if isinstance(message, Mapping) and "tool_calls" in message:
            if message["tool_calls"] is None:
                raise MessageError(
                    f"messages[{index}].tool_calls", f"null; {_TEMPLATE} iterates a `tool_calls` key it is given"
                )
            if message["tool_calls"] == [] and message.get("role") == "assistant":
                empty.add(index)
    return frozenset(empty)


def _check_alternation(
    msgs: list[Message], offset: int, *, first_counted: int, feedback: bool = False, listed: Set[int] = frozenset()
) -> None:
    """The template's check: the messages that are neither tool messages nor turns with a `tool_calls` list (an
    empty one included: `listed`) alternate, a user message at every even place."""
    place = first_counted
    for index, msg in enumerate(msgs):
        if msg.role == "tool" or msg.tool_calls or index in listed:
            continue
        if (msg.role == "user") != (place % 2 == 0):
            why = f"(got {msg.role})"
            if feedback:
                why = (
                    "(after tool results the model answers them: a user message cannot follow them; after a turn "
                    "without calls the feedback opens with a user message)"
                )
            raise MessageError(f"messages[{offset + index}].role", _ALTERNATE + why)
        place += 1


def _calls(calls: Sequence[ToolCall]) -> str:
    """The template's call list: `name(key=value...)` with each value `tojson`, and nothing between two arguments:
    the template's `{% set first = false %}` is scoped to one loop iteration, so its `, ` is never written."""
    written = (f"{c.name}(" + "".join(f"{k}={tojson(v)}" for k, v in c.arguments.items()) + ")" for c in calls)
    return "[" + ", ".join(written) + "]"


def _turn(msg: Message, prefix: str, *, listed: bool = False) -> str:
    role = {"assistant": "model", "tool": "user"}.get(msg.role, msg.role)
    body = (msg.content or "").strip()
    if msg.role == "tool":
        body = TOOL_RESPONSE_OPEN + body + TOOL_RESPONSE_CLOSE
    calls = _calls(msg.tool_calls) if msg.tool_calls or listed else ""
    return f"{START_OF_TURN}{role}\n{prefix}{calls}{body}{END_OF_TURN}\n"


def _gemma3_vllm_pythonic() -> ChatProtocol:
    return Gemma3PythonicProtocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"gemma3-vllm-pythonic": _gemma3_vllm_pythonic}
