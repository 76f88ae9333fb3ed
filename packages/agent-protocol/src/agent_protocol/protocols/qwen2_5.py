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

from typing import Final

from agent_protocol.chat_protocol import generated_message
from agent_protocol.chatml import (
    IM_END,
    IM_START,
    ChatMLProtocol,
    hermes_call,
    hermes_tool_response,
    hermes_tools,
    strip_end_marker,
)
from agent_protocol.hermes_parser import split_tool_calls
from agent_protocol.types import Action, Message, MessageLike, ToolSpec

__all__ = ["PROTOCOLS", "Qwen25Protocol"]

DEFAULT_SYSTEM: Final = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


class Qwen25Protocol(ChatMLProtocol):
    name = "qwen2.5"
    template = "Qwen2.5"

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        # The history block is "<|im_start|>assistant" + this body + "<|im_end|>\n", and the body of a turn
        # with calls starts with the newline the generation prompt already holds.
        return _assistant_body(msg).removeprefix("\n") + IM_END

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        content, calls = split_tool_calls(strip_end_marker(text), call_id_prefix=call_id_prefix)
        return Action(content=content, tool_calls=tuple(calls))

    def _system_block(self, msgs: list[Message], specs: list[ToolSpec]) -> str:
        system = (msgs[0].content or "") if msgs[0].role == "system" else DEFAULT_SYSTEM
        if specs:
            return f"{IM_START}system\n{system}\n\n{hermes_tools(specs)}"
        return f"{IM_START}system\n{system}{IM_END}\n"

    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        """Every message after the system block (in feedback, a leading system message is a turn)."""
        out: list[str] = []
        for index, msg in enumerate(msgs):
            if msg.role == "user" or (msg.role == "system" and (index > 0 or feedback)):
                out.append(f"{IM_START}{msg.role}\n{msg.content or ''}{IM_END}\n")
            elif msg.role == "assistant":
                out.append(f"{IM_START}assistant{_assistant_body(msg)}{IM_END}\n")
            elif msg.role == "tool":
                out.append(hermes_tool_response(msgs, index))
        return out


def _assistant_body(msg: Message) -> str:
    """What the template writes between "<|im_start|>assistant" and "<|im_end|>"."""
    content = msg.content or ""
    if not msg.tool_calls:
        return "\n" + content
    return ("\n" + content if content else "") + "".join("\n" + hermes_call(call) for call in msg.tool_calls)


def _qwen2_5() -> ChatMLProtocol:
    return Qwen25Protocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"qwen2.5": _qwen2_5}
