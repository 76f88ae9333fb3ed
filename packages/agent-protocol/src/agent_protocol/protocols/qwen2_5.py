"""The Qwen2.5 family's chat format: ChatML with Hermes JSON tool calls and no reasoning, in Python.

    <|im_start|>system
    You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>
    <|im_start|>user
    ...<|im_end|>
    <|im_start|>assistant
    content
    <tool_call>
    {"name": "f", "arguments": {...}}
    </tool_call><|im_end|>

Mirrors the official Qwen2.5-Instruct template statement by statement (golden: `qwen2.5_instruct`): without a
system message it writes Qwen's own default system prompt; `reasoning_content` is never rendered; a null
content, which the template cannot take (it concatenates strings), is rendered as "" the way vLLM passes it.
Parsing follows vLLM's `hermes` tool parser with no reasoning parser (the model does not reason): every
`<tool_call>` block is a call, and `<think>` is plain content.

The template is append-only: each turn is rendered as generated, so the token transcript of an episode is the
official render of its conversation, with no seams (tests/agent_protocol/families/test_qwen2_5.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import MessageError
from agent_protocol.hermes_parser import split_tool_calls
from agent_protocol.template_json import tojson
from agent_protocol.types import (
    Action,
    Message,
    MessageLike,
    ToolSpec,
    ToolSpecLike,
    coerce_messages,
    coerce_tools,
)

__all__ = ["PROTOCOLS", "Qwen25Protocol"]

IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
DEFAULT_SYSTEM: Final = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_TOOLS_HEADER: Final = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER: Final = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)
_END_MARKERS: Final = (IM_END, "<|endoftext|>")


class Qwen25Protocol(ChatProtocol):
    name = "qwen2.5"
    end_of_turn = IM_END
    stop_texts = (IM_END, "<|endoftext|>")

    def __repr__(self) -> str:
        return "Qwen25Protocol()"

    @property
    def generation_prompt(self) -> str:
        return f"{IM_START}assistant\n"

    def render_messages(
        self,
        messages: Iterable[MessageLike],
        *,
        tools: Iterable[ToolSpecLike] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        msgs = coerce_messages(messages)
        if not msgs:
            raise MessageError("messages", "the official Qwen2.5 template cannot render an empty conversation")
        out = [_system_block(msgs, coerce_tools(tools))]
        out.extend(_render_body(msgs, first_is_start=True))
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        msgs = feedback_messages(messages)
        closing = ("" if turn_closed else IM_END) + "\n"
        return closing + "".join(_render_body(msgs, first_is_start=False)) + self.generation_prompt

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        # The history block is "<|im_start|>assistant" + this body + "<|im_end|>\n", and the body of a turn
        # with calls starts with the newline the generation prompt already holds.
        return _assistant_body(msg).removeprefix("\n") + IM_END

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        for marker in _END_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)]
                break
        content, calls = split_tool_calls(text, call_id_prefix=call_id_prefix)
        return Action(content=content, tool_calls=tuple(calls))


def _system_block(msgs: list[Message], specs: list[ToolSpec]) -> str:
    system = (msgs[0].content or "") if msgs[0].role == "system" else DEFAULT_SYSTEM
    if specs:
        listing = "".join("\n" + tojson(spec.to_openai()) for spec in specs)
        return f"{IM_START}system\n{system}{_TOOLS_HEADER}{listing}{_TOOLS_FOOTER}"
    return f"{IM_START}system\n{system}{IM_END}\n"


def _assistant_body(msg: Message) -> str:
    """What the template writes between "<|im_start|>assistant" and "<|im_end|>"."""
    content = msg.content or ""
    if not msg.tool_calls:
        return "\n" + content
    calls = "".join(
        f'\n<tool_call>\n{{"name": "{call.name}", "arguments": {tojson(call.arguments)}}}\n</tool_call>'
        for call in msg.tool_calls
    )
    return ("\n" + content if content else "") + calls


def _render_body(msgs: list[Message], *, first_is_start: bool) -> list[str]:
    """Every message after the system block. With `first_is_start` false the messages continue a
    conversation (feedback): a leading system message is rendered as a turn, not as the system block."""
    out: list[str] = []
    last = len(msgs) - 1
    for index, msg in enumerate(msgs):
        if msg.role == "user" or (msg.role == "system" and (index > 0 or not first_is_start)):
            out.append(f"{IM_START}{msg.role}\n{msg.content or ''}{IM_END}\n")
        elif msg.role == "assistant":
            out.append(f"{IM_START}assistant{_assistant_body(msg)}{IM_END}\n")
        elif msg.role == "tool":
            if index == 0 or msgs[index - 1].role != "tool":
                out.append(f"{IM_START}user")
            out.append(f"\n<tool_response>\n{msg.content or ''}\n</tool_response>")
            if index == last or msgs[index + 1].role != "tool":
                out.append(f"{IM_END}\n")
    return out


def _qwen2_5() -> ChatProtocol:
    return Qwen25Protocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"qwen2.5": _qwen2_5}
