"""The GLM-4.7 chat format (GLM-4.7, GLM-4.7-Flash), in Python.

    [gMASK]<sop><|system|>
    # Tools ... <tools>{spec}</tools> ...<|user|>What's the weather in Paris?<|assistant|><think>reasoning</think>
    content<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call><|observation|>
    <tool_response>{"temperature": 18}</tool_response><|assistant|><think>

(one line in the template; wrapped here). Mirrors the official Jinja template (`tests/data/golden/templates/
glm4.7.jinja`) statement by statement. What changed from GLM-4.5 (`glm45.py`): no newlines around the turn
bodies, the tool-call arguments or the tool responses; an assistant turn without shown reasoning starts with a
lone ``</think>`` (GLM-4.5: an empty ``<think></think>``); the generation prompt opens the reasoning
(``<|assistant|><think>``), or closes it with thinking off (``<|assistant|></think>``), and no ``/nothink`` is
added to user turns; and the `clear_thinking` switch: the template drops the reasoning of the turns before the
last user message unless ``clear_thinking=False`` is given, which keeps every turn's reasoning. Kept from GLM-4.5:
a null content prints as ``None``, content and reasoning are stripped, reasoning can come inside the content as
``<think>...</think>``, and a tool message with null content makes the template fail (`MessageError` here).

Turn boundaries are GLM-4.5's (see `glm45.py`): the model ends a turn by writing the next role's token, which
the feedback leaves out when it is the one it opens with. Seams, each pinned in the tests:
- the role-token seams of GLM-4.5 (a wrong role token is kept and the right one written after it; an episode
  that ends on a generated turn ends on its sampled token);
- thinking on, a turn with no reasoning: after the prompt's ``<think>`` the model writes ``</think>`` at once, so
  the transcript holds ``<think></think>`` where the template writes the lone ``</think>``;
- a new user message makes the template drop earlier reasoning (``</think>`` alone); the transcript keeps it.
  With ``clear_thinking=False`` the template keeps it too, and this seam is gone;
- thinking off, the model writes no reasoning, so `render_generation` leaves a message's reasoning out.

Parsing follows vLLM's ``glm47`` tool parser (`Glm47MoeModelToolParser`, vllm/tool_parsers/glm47_moe_tool_parser.py:
GLM-4.5's parser with the call name ending at the first ``<arg_key>`` instead of a newline) and the ``glm45``
reasoning parser, with every rule of `glm45.py`: values typed by the tools of the episode (`with_tools`: a
string-typed parameter keeps its raw text), reasoning up to ``</think>`` (the ``<think>`` is in the prompt), a
malformed call a coded issue.
"""

from __future__ import annotations

from typing import Final

from agent_protocol.broken_call import broken_call
from agent_protocol.chat_protocol import ChatProtocol, generated_message
from agent_protocol.protocols.glm45 import (
    ASSISTANT,
    CALL_CLOSE,
    CALL_OPEN,
    KEY_CLOSE,
    KEY_OPEN,
    OBSERVATION,
    SYSTEM,
    USER,
    VALUE_CLOSE,
    VALUE_OPEN,
    Glm45Protocol,
    arguments_of,
    reasoning_and_content,
    visible,
)
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import Message, MessageLike, ToolCall, ToolSpec

__all__ = ["PROTOCOLS", "Glm47Protocol"]

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"

_TOOLS_HEADER: Final = (
    f"{SYSTEM}\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_FOOTER: Final = (
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
    "format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
)
_FORMAT_HINT: Final = (
    "Write <tool_call>NAME, then one <arg_key>KEY</arg_key><arg_value>VALUE</arg_value> pair per argument, "
    "then </tool_call>."
)


class Glm47Protocol(Glm45Protocol):
    name = "glm-4.7"
    template = "GLM-4.7"

    def __init__(self, *, enable_thinking: bool = True, clear_thinking: bool = True) -> None:
        super().__init__(enable_thinking=enable_thinking)
        #: False: the template shows the reasoning of every turn, not only of those after the last user message
        self.clear_thinking = clear_thinking

    def __repr__(self) -> str:
        return (
            f"Glm47Protocol(enable_thinking={self.enable_thinking}, clear_thinking={self.clear_thinking}, "
            f"tools={sorted(self.string_params)!r})"
        )

    @property
    def generation_prompt(self) -> str:
        return ASSISTANT + (THINK_OPEN if self.enable_thinking else THINK_CLOSE)

    # -- rendering ---------------------------------------------------------------------------------------

    def _tools_block(self, specs: list[ToolSpec]) -> str:
        return _tools_block(specs)

    def _history_turn(self, msg: Message, *, after_last_user: bool) -> str:
        return _render_assistant(msg, show_reasoning=not self.clear_thinking or after_last_user)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        body = _render_assistant(msg, show_reasoning=self.enable_thinking)
        # The prompt ends with <think> (thinking on): the model writes the reasoning and </think>, or </think> at
        # once when it has none (a seam: the template writes the lone </think> after <|assistant|>). Thinking
        # off, the prompt ends with </think> and the model writes no reasoning (a seam where the template would
        # show a message's reasoning).
        body = body.removeprefix(THINK_OPEN) if self.enable_thinking else body.removeprefix(THINK_CLOSE)
        return body + (OBSERVATION if msg.tool_calls else USER)

    def _render_other(self, msg: Message, index: int, *, follows_tool: bool) -> str:
        content = visible(msg.content)
        if msg.role == "user":
            return USER + content
        if msg.role == "system":
            return SYSTEM + content
        self._refuse_null_tool_content(msg, index)
        return ("" if follows_tool else OBSERVATION) + f"<tool_response>{content}</tool_response>"

    # -- parsing -----------------------------------------------------------------------------------------

    def _parse_call(self, body: str, call_id: str) -> ToolCall:
        """vLLM's glm47 layout: the name runs up to the first `<arg_key>` (or the end), the pairs follow."""
        first_key = body.find(KEY_OPEN)
        name = (body if first_key < 0 else body[:first_key]).strip()
        try:
            arguments = arguments_of(body[first_key:] if first_key >= 0 else "", self.string_params.get(name))
        except ValueError as e:  # JsonLimitError included
            message = f"The tool call cannot be read: {e}. {_FORMAT_HINT}"
            return broken_call(call_id, body, "invalid_arguments", message, name=name)
        if not name:
            message = f"The tool call has no function name before its arguments. {_FORMAT_HINT}"
            return broken_call(call_id, body, "missing_name", message)
        return ToolCall(id=call_id, name=name, arguments=arguments)


def _tools_block(specs: list[ToolSpec]) -> str:
    if not specs:
        return ""
    return _TOOLS_HEADER + "".join(tojson_kept(spec.to_openai()) + "\n" for spec in specs) + _TOOLS_FOOTER


def _render_assistant(msg: Message, *, show_reasoning: bool) -> str:
    """An assistant turn after its `<|assistant|>` token, without the role token that ends it."""
    reasoning, content = reasoning_and_content(msg)
    out = [f"{THINK_OPEN}{reasoning.strip()}{THINK_CLOSE}" if show_reasoning and reasoning else THINK_CLOSE]
    if content.strip():
        out.append(content.strip())
    for call in msg.tool_calls:
        out.append(CALL_OPEN + call.name)
        for key, value in call.arguments.items():
            shown = value if isinstance(value, str) else tojson(value)
            out.append(f"{KEY_OPEN}{key}{KEY_CLOSE}{VALUE_OPEN}{shown}{VALUE_CLOSE}")
        out.append(CALL_CLOSE)
    return "".join(out)


def _glm47(*, enable_thinking: bool = True, clear_thinking: bool = True) -> ChatProtocol:
    return Glm47Protocol(enable_thinking=enable_thinking, clear_thinking=clear_thinking)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"glm-4.7": _glm47}
