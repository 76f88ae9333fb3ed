"""The Qwen3 family's chat format (ChatML with `<think>` reasoning and Hermes JSON tool calls), in Python.

Mirrors the official Jinja templates (Qwen3 hybrid, Qwen3-Instruct-2507, Qwen3-Thinking-2507, and the first Qwen3
template of 2025-04, `qwen3-2504`) statement by statement; they differ only in the generation prompt, and the 2504
template in how it reads a null content (see `Qwen3Protocol`). Byte-exactness is tested against the official
renders in `tests/data/golden/`, and against the official Jinja on generated conversations.

Where the official template is not append-only (it drops the reasoning of turns before the last user query,
and re-renders turns without the empty `<think>` block a model emitted), `render_messages` still follows the
template exactly; the token transcript of an episode keeps what was generated instead. See the package
README, "What the transcript holds".
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from agent_protocol.chat_protocol import generated_message
from agent_protocol.chatml import (
    GENERATION_PROMPT,
    IM_END,
    IM_START,
    ChatMLProtocol,
    hermes_calls,
    hermes_tool_response,
)
from agent_protocol.control_tokens import unmarked
from agent_protocol.hermes_parser import parse_hermes_turn
from agent_protocol.types import Action, Message, MessageLike

__all__ = ["PROTOCOLS", "Qwen3Protocol", "ThinkingMode"]

_EMPTY_THINK: Final = "<think>\n\n</think>\n\n"


class ThinkingMode(Enum):
    HYBRID = "hybrid"  # Qwen3: the model opens <think> itself
    HYBRID_OFF = "hybrid_off"  # Qwen3 with enable_thinking=False: the prompt carries an empty <think> block
    NONE = "none"  # Qwen3-Instruct-2507: no reasoning
    FORCED = "forced"  # Qwen3-Thinking-2507: the prompt opens <think>, the model closes it


_GENERATION_PROMPTS: Final = {
    ThinkingMode.HYBRID: GENERATION_PROMPT,
    ThinkingMode.HYBRID_OFF: GENERATION_PROMPT + _EMPTY_THINK,
    ThinkingMode.NONE: GENERATION_PROMPT,
    ThinkingMode.FORCED: GENERATION_PROMPT + "<think>\n",
}


class Qwen3Protocol(ChatMLProtocol):
    """One Qwen3 template. `null_user_is_query` is the one difference of the first template (2504): it reads
    every `content` as a string, so it cannot take a null one; servers pass null content as "" (vLLM does), and
    then a user message with null content is the last query, where the later templates skip it."""

    def __init__(self, name: str, mode: ThinkingMode, *, null_user_is_query: bool = False) -> None:
        self.name = name
        self.mode = mode
        self.null_user_is_query = null_user_is_query

    def __repr__(self) -> str:
        return f"Qwen3Protocol(name={self.name!r}, mode={self.mode.value})"

    @property
    def generation_prompt(self) -> str:
        return _GENERATION_PROMPTS[self.mode]

    # -- rendering ---------------------------------------------------------------------------------------

    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        return _render_body(msgs, first_is_start=not feedback, null_user_is_query=self.null_user_is_query)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        reasoning, content = _split_reasoning(msg)
        calls = hermes_calls(content, msg.tool_calls)
        if self.mode is ThinkingMode.HYBRID:
            head = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
        elif self.mode is ThinkingMode.FORCED:
            head = f"{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
        else:
            head = content
        return head + calls + IM_END

    # -- parsing -----------------------------------------------------------------------------------------

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        return parse_hermes_turn(text, reasoning_open=self.mode is ThinkingMode.FORCED, call_id_prefix=call_id_prefix)


def _last_query_index(msgs: list[Message], *, null_user_is_query: bool) -> int:
    """Index of the last real user query (a user turn that is not a wrapped tool response)."""
    for index in range(len(msgs) - 1, -1, -1):
        message = msgs[index]
        content = "" if message.content is None and null_user_is_query else message.content
        if message.role == "user" and content is not None and not _is_wrapped_tool_response(unmarked(content)):
            return index
    return len(msgs) - 1


def _is_wrapped_tool_response(content: str) -> bool:
    return content.startswith("<tool_response>") and content.endswith("</tool_response>")


def _split_reasoning(msg: Message) -> tuple[str, str]:
    content = msg.content or ""
    if msg.reasoning_content is not None:
        return msg.reasoning_content, content
    if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        return reasoning, content.split("</think>")[-1].lstrip("\n")
    return "", content


def _render_body(msgs: list[Message], *, first_is_start: bool, null_user_is_query: bool) -> list[str]:
    """Every message after the system block. With `first_is_start` false the messages continue a
    conversation (feedback): a leading system message is rendered as a turn, not as the system block."""
    out: list[str] = []
    last = len(msgs) - 1
    last_query = _last_query_index(msgs, null_user_is_query=null_user_is_query)
    for index, msg in enumerate(msgs):
        content = msg.content or ""
        if msg.role == "user" or (msg.role == "system" and (index > 0 or not first_is_start)):
            out.append(f"{IM_START}{msg.role}\n{content}{IM_END}\n")
        elif msg.role == "assistant":
            reasoning, content = _split_reasoning(msg)
            if index > last_query and (index == last or reasoning):
                body = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
            else:
                body = content
            out.append(f"{IM_START}assistant\n{body}{hermes_calls(content, msg.tool_calls)}{IM_END}\n")
        elif msg.role == "tool":
            out.append(hermes_tool_response(msgs, index))
    return out


def _qwen3(*, enable_thinking: bool = True) -> ChatMLProtocol:
    return Qwen3Protocol("qwen3", ThinkingMode.HYBRID if enable_thinking else ThinkingMode.HYBRID_OFF)


def _qwen3_2504(*, enable_thinking: bool = True) -> ChatMLProtocol:
    mode = ThinkingMode.HYBRID if enable_thinking else ThinkingMode.HYBRID_OFF
    return Qwen3Protocol("qwen3-2504", mode, null_user_is_query=True)


def _qwen3_instruct_2507() -> ChatMLProtocol:
    return Qwen3Protocol("qwen3-instruct-2507", ThinkingMode.NONE)


def _qwen3_thinking_2507() -> ChatMLProtocol:
    return Qwen3Protocol("qwen3-thinking-2507", ThinkingMode.FORCED)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {
    "qwen3": _qwen3,
    "qwen3-instruct-2507": _qwen3_instruct_2507,
    "qwen3-thinking-2507": _qwen3_thinking_2507,
    "qwen3-2504": _qwen3_2504,
}
