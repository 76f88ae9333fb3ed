"""NVIDIA Nemotron Nano v2's chat format (nvidia/NVIDIA-Nemotron-Nano-9B-v2, 12B-v2), in Python.

    <SPECIAL_10>System
    Be brief.

    You can use the following tools to assist the user if required:
    <AVAILABLE_TOOLS>[{"name": "calculator", ...}]</AVAILABLE_TOOLS>
    ...

    <SPECIAL_11>User
    What is 17 * 23?
    <SPECIAL_11>Assistant
    <TOOLCALL>[{"name": "calculator", "arguments": {"expression": "17 * 23"}}]</TOOLCALL>
    <SPECIAL_12>

    <SPECIAL_11>User
    <TOOL_RESPONSE>[391]</TOOL_RESPONSE>

    <SPECIAL_11>Assistant
    <think>

Mirrors the official template (golden: `nemotron_nano_v2`): a system block always (the first system message with
`/think` and `/no_think` cut out, stripped), the tool list and its instructions when tools are given, then user turns
(stripped, the switches cut out), runs of tool results in one `<TOOL_RESPONSE>[...]` user turn (comma-separated, as
written), assistant turns as their content after `</think>` (reasoning is never in history) and a `<TOOLCALL>` JSON
list, each closed by `\\n<SPECIAL_12>\\n\\n`. A conversation that ends on an assistant turn renders it the template's
way: its content (whole, stripped) after a `<think>` opener, and its calls as a turn of their own; with the generation
prompt, its content continues that prompt and its calls are dropped.

Thinking: the template turns it on or off by the last `/think` or `/no_think` in a user or system message (on when
there is none) and opens the generation with `<think>\\n\\n` or `<think></think>`. A protocol serves one episode in
one mode, so the mode is the option `enable_thinking` (default True, as the template), and a conversation or feedback
whose switches say otherwise is refused, naming the option to use.

Refused as the template refuses (it raises): an empty conversation, a system message alone, null content in a user or
system message. Refused where it would render wrong or drop silently: a system message after the first (the template
drops it), null tool content (it would print `None`), content given as a list of parts (the template takes strings).

Parsing follows NVIDIA's `nemotron_json` tool parser (the vLLM plugin `nemotron_toolcall_parser_no_streaming.py`
shipped with the model; vLLM itself has no parser for this format): the first `<TOOLCALL>...</TOOLCALL>` block is a
JSON list of `{"name", "arguments"}` (brackets added if missing), the content is the text before the last
`<TOOLCALL>`. Reasoning as vLLM's `deepseek_r1` parser reads it with thinking on (text up to `</think>`; none closed
is `missing_think_end`); with thinking off, as NVIDIA's Nemotron reasoning plugins swap it, all text is content.
Where the plugin drops a malformed call, a coded issue is kept here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import MessageError
from agent_protocol.hermes_parser import MISSING_THINK_END
from agent_protocol.nemotron_json import CALL_OPEN, TOOLS_HEAD, parse_calls, render_calls, tool_function
from agent_protocol.template_json import tojson_kept
from agent_protocol.types import (
    Action,
    Message,
    MessageLike,
    ToolSpec,
    refuse_part_lists,
)

__all__ = ["END", "PROTOCOLS", "NemotronNanoV2Protocol"]

SYSTEM: Final = "<SPECIAL_10>System\n"
USER: Final = "<SPECIAL_11>User\n"
ASSISTANT: Final = "<SPECIAL_11>Assistant\n"
END: Final = "<SPECIAL_12>"
THINK_END: Final = "</think>"
_TOOLS_TAIL: Final = (
    "]</AVAILABLE_TOOLS>\n\n"
    "If you decide to call any tool(s), use the following format:\n"
    '<TOOLCALL>[{{"name": "tool_name1", "arguments": "tool_args1"}}, '
    '{{"name": "tool_name2", "arguments": "tool_args2"}}]</TOOLCALL>\n\n'
    "The user will execute tool-calls and return responses from tool(s) in this format:\n"
    '<TOOL_RESPONSE>[{{"tool_response1"}}, {{"tool_response2"}}]</TOOL_RESPONSE>\n\n'
    "Based on the tool responses, you can call additional tools if needed, correct tool calls if any errors are "
    "found, or just respond to the user."
)


def _switch(text: str) -> bool | None:
    """The thinking switch a user or system text sets, as the template reads it (`/think` first)."""
    if "/think" in text:
        return True
    if "/no_think" in text:
        return False
    return None


def _unswitched(text: str | None) -> str:
    return (text or "").replace("/think", "").replace("/no_think", "").strip()


#: why a list of parts is refused (the template takes string content)
_PART_LISTS: Final = "the official Nemotron template takes string content, not a list of parts"


class NemotronNanoV2Protocol(ChatProtocol):
    """The Nemotron Nano v2 template; `enable_thinking` is the episode's mode (see the module docstring)."""

    name = "nemotron-nano-v2"
    end_of_turn = END
    stop_texts = (END,)

    def __init__(self, *, enable_thinking: bool = True) -> None:
        self.enable_thinking = enable_thinking

    @property
    def think(self) -> str:
        return "<think>\n\n" if self.enable_thinking else "<think></think>"

    @property
    def generation_prompt(self) -> str:
        return ASSISTANT + self.think

    def prepare_raw(self, messages: Iterable[MessageLike], *, tools_given: bool) -> Iterable[MessageLike]:
        return refuse_part_lists(messages, _PART_LISTS)

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        if not msgs:
            raise MessageError("messages", "the official Nemotron template reads messages[0]: it renders no empty one")
        self._check(msgs, offset=0)
        has_system = msgs[0].role == "system"
        rest = msgs[1:] if has_system else list(msgs)
        if not rest:
            raise MessageError("messages", "the official Nemotron template fails on a system message alone")
        system = _unswitched(msgs[0].content) if has_system else ""
        out = [SYSTEM, system]
        if specs:
            listed = ", ".join(tojson_kept(tool_function(spec)) for spec in specs)
            out.append(("\n\n" if system else "") + TOOLS_HEAD + listed + _TOOLS_TAIL)
        out.append("\n\n")
        last: Message | None = rest.pop() if rest[-1].role == "assistant" else None
        out.append(_body(rest))
        last_content = (last.content or "").strip() if last is not None else ""
        if add_generation_prompt:
            out.append(self.generation_prompt + last_content)
        elif last is not None:
            if last_content:
                out.append(ASSISTANT + self.think + last_content + f"\n{END}\n\n")
            if last.tool_calls:
                out.append(ASSISTANT + render_calls(last.tool_calls) + f"\n{END}\n\n")
        return "".join(out)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        head = ""
        if self.enable_thinking:
            head = (msg.reasoning_content or "") + THINK_END
        elif msg.reasoning_content is not None:
            raise MessageError(
                "message.reasoning_content", "thinking is off (enable_thinking=False): the model writes no reasoning"
            )
        content = msg.content or ""
        calls = ("\n\n" if content else "") + render_calls(msg.tool_calls) if msg.tool_calls else ""
        return f"{head}{content}{calls}\n{END}"

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        refuse_part_lists(messages, _PART_LISTS)
        msgs = feedback_messages(
            messages,
            system_refused="the official Nemotron template renders only the first system message (it drops the others)",
        )
        self._check(msgs, offset=0, first_system=False)
        return ("" if turn_closed else f"\n{END}") + "\n\n" + _body(msgs) + self.generation_prompt

    def _check(self, msgs: list[Message], *, offset: int, first_system: bool = True) -> None:
        """Refuse what the template refuses or renders wrong, and switches that contradict `enable_thinking`."""
        thinking = None
        for index, msg in enumerate(msgs):
            where = f"messages[{index + offset}]"
            if msg.role == "system" and (index > 0 or not first_system):
                raise MessageError(
                    f"{where}.role", "the official Nemotron template drops a system message after the first"
                )
            if msg.role in ("user", "system"):
                if msg.content is None:
                    raise MessageError(f"{where}.content", "null; the official Nemotron template fails on it")
                thinking = _switch(msg.content) if _switch(msg.content) is not None else thinking
            if msg.role == "tool" and msg.content is None:
                raise MessageError(f"{where}.content", "null; the official Nemotron template would print None")
        if thinking is None and first_system:
            thinking = True  # the template's default; feedback without a switch keeps the episode's mode
        if thinking is not None and thinking != self.enable_thinking:
            said = f"the conversation's last switch is {'/think' if thinking else '/no_think'}"
            if not any(_switch(m.content or "") is not None for m in msgs if m.role in ("user", "system")):
                said = "the conversation has no /think or /no_think switch (the template then thinks)"
            raise MessageError(
                "messages",
                f"{said}, and this protocol is enable_thinking={self.enable_thinking}; use get_protocol("
                f"'nemotron-nano-v2', enable_thinking={thinking}) or write the switch in the system prompt",
            )

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        """NVIDIA's `nemotron_json` tool parser and `deepseek_r1` reasoning (see the module docstring)."""
        reasoning: str | None = None
        if self.enable_thinking:
            if THINK_END not in text:
                return Action(content="", reasoning_content=text.removesuffix(END), error=MISSING_THINK_END)
            reasoning, text = text.split(THINK_END, 1)
        body = text[: -len(END)].removesuffix("\n") if text.endswith(END) else text
        if CALL_OPEN not in body:
            return Action(content=body, reasoning_content=reasoning)
        content = body[: body.rfind(CALL_OPEN)]
        content = content.removesuffix("\n\n")
        return Action(
            content=content,
            reasoning_content=reasoning,
            tool_calls=parse_calls(body, call_id_prefix, strict=False),
        )


def _body(msgs: list[Message]) -> str:
    """User turns, runs of tool results and assistant turns, as the template's message loop writes them."""
    out = []
    for index, msg in enumerate(msgs):
        if msg.role == "user":
            out.append(USER + _unswitched(msg.content) + "\n")
        elif msg.role == "tool":
            if index == 0 or msgs[index - 1].role != "tool":
                out.append(USER + "<TOOL_RESPONSE>[")
            out.append(msg.content or "")
            following = msgs[index + 1].role if index + 1 < len(msgs) else None
            out.append(", " if following == "tool" else "]</TOOL_RESPONSE>\n\n")
        elif msg.role == "assistant":
            content = msg.content or ""
            if content and THINK_END in content:
                content = content.split(THINK_END)[1].strip()
            content = content.strip()
            out.append(ASSISTANT + content)
            if msg.tool_calls:
                out.append(("\n\n" if content else "") + render_calls(msg.tool_calls))
            out.append(f"\n{END}\n\n")
    return "".join(out)


def _nemotron_nano_v2(*, enable_thinking: bool = True) -> ChatProtocol:
    return NemotronNanoV2Protocol(enable_thinking=enable_thinking)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"nemotron-nano-v2": _nemotron_nano_v2}
