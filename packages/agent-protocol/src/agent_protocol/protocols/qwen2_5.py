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
from agent_protocol.chatml import (
    GENERATION_PROMPT,
    IM_END,
    IM_START,
    STOP_TEXTS,
    feedback_opening,
    hermes_call,
    hermes_tool_response,
    hermes_tools,
    strip_end_marker,
)
from agent_protocol.errors import MessageError
from agent_protocol.hermes_parser import split_tool_calls
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

DEFAULT_SYSTEM: Final = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


class Qwen25Protocol(ChatProtocol):
    name = "qwen2.5"
    end_of_turn = IM_END
    stop_texts = STOP_TEXTS

    def __repr__(self) -> str:
        return "Qwen25Protocol()"

    @property
    def generation_prompt(self) -> str:
        return GENERATION_PROMPT

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
        body = _render_body(msgs, first_is_start=False)
        return feedback_opening(turn_closed=turn_closed) + "".join(body) + self.generation_prompt

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        # The history block is "<|im_start|>assistant" + this body + "<|im_end|>\n", and the body of a turn
        # with calls starts with the newline the generation prompt already holds.
        return _assistant_body(msg).removeprefix("\n") + IM_END

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        content, calls = split_tool_calls(strip_end_marker(text), call_id_prefix=call_id_prefix)
        return Action(content=content, tool_calls=tuple(calls))


def _system_block(msgs: list[Message], specs: list[ToolSpec]) -> str:
    system = (msgs[0].content or "") if msgs[0].role == "system" else DEFAULT_SYSTEM
    if specs:
        return f"{IM_START}system\n{system}\n\n{hermes_tools(specs)}"
    return f"{IM_START}system\n{system}{IM_END}\n"


def _assistant_body(msg: Message) -> str:
    """What the template writes between "<|im_start|>assistant" and "<|im_end|>"."""
    content = msg.content or ""
    if not msg.tool_calls:
        return "\n" + content
    calls = "".join("\n" + hermes_call(call) for call in msg.tool_calls)
    return ("\n" + content if content else "") + calls


def _render_body(msgs: list[Message], *, first_is_start: bool) -> list[str]:
    """Every message after the system block. With `first_is_start` false the messages continue a
    conversation (feedback): a leading system message is rendered as a turn, not as the system block."""
    out: list[str] = []
    for index, msg in enumerate(msgs):
        if msg.role == "user" or (msg.role == "system" and (index > 0 or not first_is_start)):
            out.append(f"{IM_START}{msg.role}\n{msg.content or ''}{IM_END}\n")
        elif msg.role == "assistant":
            out.append(f"{IM_START}assistant{_assistant_body(msg)}{IM_END}\n")
        elif msg.role == "tool":
            out.append(hermes_tool_response(msgs, index))
    return out


def _qwen2_5() -> ChatProtocol:
    return Qwen25Protocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"qwen2.5": _qwen2_5}
