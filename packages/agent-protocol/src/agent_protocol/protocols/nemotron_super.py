"""NVIDIA Llama-3.3-Nemotron-Super-49B-v1.5's chat format (nvidia/Llama-3_3-Nemotron-Super-49B-v1_5), in Python.

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>

    Be brief.

    You can use the following tools to assist the user if required:
    <AVAILABLE_TOOLS>[{"name": "calculator", ...}]</AVAILABLE_TOOLS>
    ...<|eot_id|><|start_header_id|>user<|end_header_id|>

    What is 17 * 23?<|eot_id|><|start_header_id|>assistant<|end_header_id|>

    <TOOLCALL>[{"name": "calculator", "arguments": {"expression": "17 * 23"}}]</TOOLCALL><|eot_id|>...
    <|start_header_id|>tool<|end_header_id|>

    <TOOL_RESPONSE>[391]</TOOL_RESPONSE><|eot_id|><|start_header_id|>assistant<|end_header_id|>

Mirrors the official template (golden: `nemotron_super_v1_5`), Llama 3's headers with NVIDIA's `<TOOLCALL>` format:
a system block always (the first system message, unless it is `''`, with its switch cut out and then stripped, and
`\\n\\n`), the tool list and its instructions when tools are given, then user turns as written, assistant turns as
their content after the last `</think>` (left-stripped; reasoning is never in history) and a `<TOOLCALL>` JSON list
right after it, runs of tool results in one `tool` turn `<TOOL_RESPONSE>[...]` (comma-separated, as written). Unlike
Llama 3.x's templates nothing else is trimmed. The Llama 3 header pieces are `llama3`'s.

Thinking: the template reads one switch, in the first system message: `/no_think` (which wins; a `/think` beside it
stays in the text) or `/think`; on when there is none. It changes only the generation prompt: thinking off opens the
turn with an empty `<think>\\n\\n</think>\\n\\n`. A protocol serves one episode in one mode, so the mode is the option
`enable_thinking` (default True, as the template), and a system prompt that switches otherwise is refused, naming the
option. The template reads no switch in user messages (they are rendered as written).

Refused as the template refuses (it raises): an empty conversation, null content in an assistant turn or a first
system message. Refused where it would render wrong or drop silently: a system message after the first (the
template drops it), null user or tool content (it would print `None`), content given as a list of parts.

Parsing follows NVIDIA's `llama_nemotron_json` tool parser (the vLLM plugin `llama_nemotron_toolcall_parser_no_
streaming.py` the model card serves it with; vLLM has no parser of its own for it): the first `<TOOLCALL>...
</TOOLCALL>` block, stripped, is a JSON list of `{"name", "arguments"}` (a missing `[` added; a missing `]` makes the
plugin fail: `invalid_json` here), the content is the text before the last `<TOOLCALL>`. Reasoning as vLLM's
`deepseek_r1` parser reads it with thinking on (a leading `<think>` dropped, text up to `</think>`; none closed is
`missing_think_end`); with thinking off all text is content. Where the plugin drops a call, a coded issue is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import MessageError
from agent_protocol.hermes_parser import MISSING_THINK_END
from agent_protocol.nemotron_json import CALL_OPEN, TOOLS_HEAD, parse_calls, render_calls, tool_function
from agent_protocol.protocols.llama3 import BOS, EOT, _header
from agent_protocol.template_json import tojson_kept
from agent_protocol.types import (
    Action,
    Message,
    MessageLike,
    ToolSpec,
    refuse_part_lists,
)

__all__ = ["PROTOCOLS", "NemotronSuperProtocol"]

NAME: Final = "nemotron-super-v1.5"
THINK_START, THINK_END = "<think>", "</think>"
EMPTY_THINK: Final = "<think>\n\n</think>\n\n"
_TOOLS_TAIL: Final = (
    "]</AVAILABLE_TOOLS>\n\n"
    "If you decide to call any tool(s), use the following format:\n"
    '<TOOLCALL>[{{"name": "tool_name1", "arguments": "tool_args1"}}, '
    '{{"name": "tool_name2", "arguments": "tool_args2"}}]</TOOLCALL>\n\n'
    "Response from tool(s) will be returned in this format:\n"
    '<TOOL_RESPONSE>[{{"response": "tool_response1"}}, {{"response": "tool_response2"}}]</TOOL_RESPONSE>\n\n'
    "Based on the results returned by the tool(s), you can call additional tools if needed, correct tool calls if "
    "any errors are found, or just respond with the answer to the user."
)


def system_switch(text: str) -> tuple[str, bool | None]:
    """The first system message's text as the template prints it, and the switch it sets (None: none)."""
    if "/no_think" in text:
        return text.replace("/no_think", "").strip(), False
    if "/think" in text:
        return text.replace("/think", "").strip(), True
    return text, None


#: why a list of parts is refused (the template takes string content)
_PART_LISTS: Final = "the official Nemotron Super template takes string content, not a list of parts"


class NemotronSuperProtocol(ChatProtocol):
    """The Llama-3.3-Nemotron-Super-49B-v1.5 template; `enable_thinking` is the episode's mode (module docstring)."""

    name = NAME
    end_of_turn = EOT
    stop_texts = (EOT,)

    def __init__(self, *, enable_thinking: bool = True) -> None:
        self.enable_thinking = enable_thinking

    @property
    def generation_prompt(self) -> str:
        return _header("assistant") + ("" if self.enable_thinking else EMPTY_THINK)

    def prepare_raw(self, messages: Iterable[MessageLike], *, tools_given: bool) -> Iterable[MessageLike]:
        return refuse_part_lists(messages, _PART_LISTS)

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        if not msgs:
            raise MessageError(
                "messages", "the official Nemotron Super template reads messages[0]: it renders no empty one"
            )
        self._check(msgs[1:], offset=1)
        out = [BOS, _header("system")]
        switch = None
        first = msgs[0]
        if first.role == "system":
            if first.content is None:
                raise MessageError("messages[0].content", "null; the official Nemotron Super template fails on it")
            if first.content != "":
                system, switch = system_switch(first.content)
                out.append(system + "\n\n")
        else:
            self._check(msgs[:1], offset=0)
        if switch is not None and switch != self.enable_thinking:
            raise MessageError(
                "messages[0].content",
                f"the system prompt switches thinking {'on (/think)' if switch else 'off (/no_think)'}, and this "
                f"protocol is enable_thinking={self.enable_thinking}; use get_protocol('{NAME}', "
                f"enable_thinking={switch})",
            )
        if switch is None and not self.enable_thinking:
            raise MessageError(
                "messages[0]",
                "the official template thinks unless the first system message says /no_think, and this protocol is "
                "enable_thinking=False: write /no_think in the system prompt",
            )
        if specs:
            out.append(TOOLS_HEAD + ", ".join(tojson_kept(tool_function(spec)) for spec in specs) + _TOOLS_TAIL)
        out.append(EOT)
        out.append(_body(msgs[1:] if first.role == "system" else msgs))
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        head = ""
        if self.enable_thinking:
            head = THINK_START + (msg.reasoning_content or "") + THINK_END
        elif msg.reasoning_content is not None:
            raise MessageError(
                "message.reasoning_content", "thinking is off (enable_thinking=False): the model writes no reasoning"
            )
        calls = render_calls(msg.tool_calls) if msg.tool_calls else ""
        return f"{head}{msg.content or ''}{calls}{EOT}"

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        refuse_part_lists(messages, _PART_LISTS)
        msgs = feedback_messages(
            messages,
            system_refused="the official Nemotron Super template renders only the first system message (it drops "
            "the others)",
        )
        self._check(msgs, offset=0)
        return ("" if turn_closed else EOT) + _body(msgs) + self.generation_prompt

    @staticmethod
    def _check(msgs: list[Message], *, offset: int) -> None:
        """Refuse what the template refuses or renders wrong after the first message."""
        for index, msg in enumerate(msgs):
            where = f"messages[{index + offset}]"
            if msg.role == "system":
                raise MessageError(
                    f"{where}.role", "the official Nemotron Super template drops a system message after the first"
                )
            if msg.content is None:
                if msg.role == "assistant":
                    raise MessageError(
                        f"{where}.content", "null; the official Nemotron Super template fails on it (use '')"
                    )
                if msg.role in ("user", "tool"):
                    raise MessageError(
                        f"{where}.content", "null; the official Nemotron Super template would print None"
                    )

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        """NVIDIA's `llama_nemotron_json` tool parser and `deepseek_r1` reasoning (see the module docstring)."""
        body = text.removesuffix(EOT)
        reasoning: str | None = None
        if self.enable_thinking:
            body = body.partition(THINK_START)[2] if THINK_START in body else body
            if THINK_END not in body:
                return Action(content="", reasoning_content=body, error=MISSING_THINK_END)
            reasoning, _, body = body.partition(THINK_END)
        if CALL_OPEN not in body:
            return Action(content=body, reasoning_content=reasoning)
        content = body[: body.rfind(CALL_OPEN)]
        return Action(
            content=content,
            reasoning_content=reasoning,
            tool_calls=parse_calls(body, call_id_prefix, strict=True),
        )


def _body(msgs: list[Message]) -> str:
    """User turns, assistant turns and runs of tool results, as the template's message loop writes them."""
    out = []
    for index, msg in enumerate(msgs):
        if msg.role == "user":
            out.append(_header("user") + (msg.content or "") + EOT)
        elif msg.role == "assistant":
            content = msg.content or ""
            if THINK_END in content:
                content = content.split(THINK_END)[-1].lstrip()
            out.append(_header("assistant") + content)
            if msg.tool_calls:
                out.append(render_calls(msg.tool_calls))
            out.append(EOT)
        elif msg.role == "tool":
            if index == 0 or msgs[index - 1].role != "tool":
                out.append(_header("tool") + "<TOOL_RESPONSE>[")
            out.append(msg.content or "")
            following = msgs[index + 1].role if index + 1 < len(msgs) else None
            out.append(", " if following == "tool" else "]</TOOL_RESPONSE>" + EOT)
    return "".join(out)


def _nemotron_super(*, enable_thinking: bool = True) -> ChatProtocol:
    return NemotronSuperProtocol(enable_thinking=enable_thinking)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {NAME: _nemotron_super}
