"""NVIDIA Nemotron 3 Nano's chat format (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B): ChatML with `<think>` reasoning and
Qwen3-Coder's XML tool calls, in Python.

    <|im_start|>system
    Be brief.

    # Tools

    You have access to the following functions:

    <tools>
    <function>
    <name>calculator</name>
    ...
    </IMPORTANT><|im_end|>
    <|im_start|>user
    What is 17 * 23?<|im_end|>
    <|im_start|>assistant
    <think>
    I should use the calculator.
    </think>
    <tool_call>
    <function=calculator>
    <parameter=expression>
    17 * 23
    </parameter>
    </function>
    </tool_call>
    <|im_end|>

Mirrors the official template (golden: `nemotron3_nano`) statement by statement: a system block always (the first
system message as written, then the tool listing in Qwen3-Coder's XML with `<enum>` and `<required>`), user and
later system messages as written, tool results in `<tool_response>` blocks (a run of them in one user turn; one that
opens the conversation gets no user header, as the template writes it), and assistant turns as
`<think>\\n{reasoning}\\n</think>\\n{content}` trimmed (`<think></think>{content}` without reasoning), each call as
`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...` (objects and arrays as JSON, other
values through Jinja's `string`: `True`, `None`). With `truncate_history_thinking` (the default) the turns before
the last user message keep only what follows their `</think>`. The generation prompt opens `<think>\\n`
(`<think></think>` with `enable_thinking=False`). Refused: an empty conversation (the template reads messages[0]),
null content in a system message (the template fails), null user or tool content (it would print `None`), content
given as a list of parts (the template writes a list as text).

Parsing follows vLLM's `qwen3_coder` tool parser (`agent_protocol.xml_call_parser`, values typed by the episode's
tool schemas through `with_tools`), behind NVIDIA's `nano_v3` reasoning parser (vLLM's `deepseek_r1`, whose
output is swapped to content when thinking is off and no `</think>` was written).

Seams: the reasoning of turns before the last user message is dropped by the template (`truncate_history_thinking`),
which moves only when a user message arrives; a turn with empty reasoning is `\\n</think>\\n` generated where the
template writes `<think></think>`; whitespace around content and reasoning is trimmed in history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from agent_protocol.chat_protocol import generated_message
from agent_protocol.chatml import GENERATION_PROMPT, IM_END, IM_START, ChatMLProtocol, strip_end_marker
from agent_protocol.errors import MessageError
from agent_protocol.hermes_parser import MISSING_THINK_END
from agent_protocol.protocols.qwen3_coder import _TOOLS_FOOTER, _extra_keys, _jinja_string, _text_or_json
from agent_protocol.template_json import tojson
from agent_protocol.types import (
    Action,
    Message,
    MessageLike,
    ToolCall,
    ToolSpec,
    ToolSpecLike,
    refuse_part_lists,
)
from agent_protocol.xml_call_parser import Schemas, parse_xml_calls, schemas_of

__all__ = ["PROTOCOLS", "Nemotron3NanoProtocol"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_EMPTY_THINK: Final = "<think></think>"
_TOOLS_HEADER: Final = "# Tools\n\nYou have access to the following functions:\n\n<tools>"


def _tool_listing(function: Mapping[str, Any]) -> str:
    out = [f"\n<function>\n<name>{_jinja_string(function.get('name'))}</name>"]
    if "description" in function:
        out.append(f"\n<description>{_jinja_string(function['description']).strip()}</description>")
    out.append("\n<parameters>")
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if isinstance(properties, Mapping):
        for name, fields in properties.items():
            out.append(f"\n<parameter>\n<name>{name}</name>")
            if isinstance(fields, Mapping):
                if "type" in fields:
                    out.append(f"\n<type>{_jinja_string(fields['type'])}</type>")
                if "description" in fields:
                    out.append(f"\n<description>{_jinja_string(fields['description']).strip()}</description>")
                if "enum" in fields:
                    out.append(f"\n<enum>{tojson(fields['enum'])}</enum>")
            out.append(_extra_keys(fields, ("name", "type", "description", "enum")))
            out.append("\n</parameter>")
    out.append(_extra_keys(parameters, ("type", "properties", "required")))
    if isinstance(parameters, Mapping) and "required" in parameters:
        out.append(f"\n<required>{tojson(parameters['required'])}</required>")
    out.append("\n</parameters>")
    out.append(_extra_keys(function, ("type", "name", "description", "parameters")))
    out.append("\n</function>")
    return "".join(out)


def _calls(calls: Sequence[ToolCall]) -> str:
    out = []
    for call in calls:
        out.append(f"<tool_call>\n<function={call.name}>\n")
        out.extend(
            f"<parameter={key}>\n{_text_or_json(value)}\n</parameter>\n" for key, value in call.arguments.items()
        )
        out.append("</function>\n</tool_call>\n")
    return "".join(out)


def _with_reasoning(msg: Message) -> str:
    """The template's unified content: the reasoning (when it has text) in a think block, else an empty one."""
    content = msg.content or ""
    reasoning = msg.reasoning_content
    if reasoning is not None and reasoning.strip():
        return f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n{content}"
    if THINK_OPEN not in content and THINK_CLOSE not in content:
        return _EMPTY_THINK + content
    return content


def _assistant(msg: Message, *, truncated: bool) -> str:
    content = _with_reasoning(msg)
    if msg.tool_calls:
        if content.strip():
            if not truncated:
                head = content.strip() + "\n"
            else:
                if THINK_CLOSE in content:
                    content = content.split(THINK_CLOSE)[-1]
                elif THINK_OPEN in content:
                    content = content.split(THINK_OPEN)[0]
                head = _EMPTY_THINK + content.strip() + "\n"
        else:
            head = _EMPTY_THINK
        return f"{IM_START}assistant\n{head}{_calls(msg.tool_calls)}{IM_END}\n"
    if truncated and THINK_OPEN in content and THINK_CLOSE in content:
        content = _EMPTY_THINK + content.split(THINK_CLOSE)[-1]
    return f"{IM_START}assistant\n{content.strip()}{IM_END}\n"


#: why a list of parts is refused (the template takes string content)
_PART_LISTS: Final = "the official Nemotron 3 template writes a list of parts as text"


class Nemotron3NanoProtocol(ChatMLProtocol):
    """The Nemotron 3 Nano template, with its two switches as options."""

    name = "nemotron-3-nano"
    template = "Nemotron 3 Nano"

    def __init__(
        self, *, enable_thinking: bool = True, truncate_history_thinking: bool = True, schemas: Schemas | None = None
    ) -> None:
        self.enable_thinking = enable_thinking
        self.truncate_history_thinking = truncate_history_thinking
        #: tool name -> the `properties` of its parameters schema, for typing parsed values
        self.schemas: Schemas = dict(schemas or {})

    def __repr__(self) -> str:
        return (
            f"Nemotron3NanoProtocol(enable_thinking={self.enable_thinking}, truncate_history_thinking="
            f"{self.truncate_history_thinking}, tools={sorted(self.schemas)!r})"
        )

    def with_tools(self, tools: Iterable[ToolSpecLike]) -> Nemotron3NanoProtocol:
        """A copy whose parser types parameter values by the JSON schemas of `tools`, as vLLM does."""
        schemas = schemas_of(tools)
        return Nemotron3NanoProtocol(
            enable_thinking=self.enable_thinking,
            truncate_history_thinking=self.truncate_history_thinking,
            schemas=schemas,
        )

    @property
    def generation_prompt(self) -> str:
        return GENERATION_PROMPT + (f"{THINK_OPEN}\n" if self.enable_thinking else _EMPTY_THINK)

    def prepare_raw(self, messages: Iterable[MessageLike], *, tools_given: bool) -> Iterable[MessageLike]:
        return refuse_part_lists(messages, _PART_LISTS)

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        refuse_part_lists(messages, _PART_LISTS)
        return super().render_feedback(messages, turn_closed=turn_closed, ended_by=ended_by)

    def _checked(self, msgs: list[Message]) -> list[Message]:
        for index, msg in enumerate(msgs):
            if msg.content is None and msg.role == "system":
                raise MessageError(f"messages[{index}].content", "null; the official Nemotron 3 template fails on it")
            if msg.content is None and msg.role in ("user", "tool"):
                raise MessageError(f"messages[{index}].content", "null; the official Nemotron 3 template prints None")
        return msgs

    def _system_block(self, msgs: list[Message], specs: list[ToolSpec]) -> str:
        system = (msgs[0].content or "") if msgs and msgs[0].role == "system" else ""
        out = [f"{IM_START}system\n{system}"]
        if specs:
            out.append(("\n\n" if system else "") + _TOOLS_HEADER)
            out.extend(_tool_listing(spec.function) for spec in specs)
            out.append(_TOOLS_FOOTER)
        out.append(f"{IM_END}\n")
        return "".join(out)

    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        loop = msgs[1:] if not feedback and msgs and msgs[0].role == "system" else msgs
        last_user = max((i for i, m in enumerate(loop) if m.role == "user"), default=-1)
        out: list[str] = []
        for index, msg in enumerate(loop):
            if msg.role == "assistant":
                out.append(_assistant(msg, truncated=self.truncate_history_thinking and index < last_user))
            elif msg.role in ("user", "system"):
                out.append(f"{IM_START}{msg.role}\n{msg.content}{IM_END}\n")
            elif msg.role == "tool":
                if (index > 0 and loop[index - 1].role != "tool") or (index == 0 and feedback):
                    out.append(f"{IM_START}user\n")
                out.append(f"<tool_response>\n{msg.content}\n</tool_response>\n")
                if index == len(loop) - 1 or loop[index + 1].role != "tool":
                    out.append(f"{IM_END}\n")
        return out

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        content = msg.content or ""
        # the template trims the think block and content it writes: a turn with neither content nor calls ends
        # right after `</think>`
        head = f"{msg.reasoning_content or ''}\n{THINK_CLOSE}" if self.enable_thinking else ""
        head += "\n" if head and (content or msg.tool_calls) else ""
        if not self.enable_thinking and msg.reasoning_content is not None:
            raise MessageError("message.reasoning_content", "thinking is off (enable_thinking=False): no reasoning")
        # the template writes the trimmed think block and content, then a newline, then the calls
        lead = "\n" if content or not self.enable_thinking else ""
        calls = (lead + _calls(msg.tool_calls)) if msg.tool_calls else ""
        return f"{head}{content}{calls}{IM_END}"

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        """vLLM's `qwen3_coder` tool parser behind NVIDIA's `nano_v3` reasoning parser (see the module docstring)."""
        text = strip_end_marker(text)
        reasoning: str | None = None
        if THINK_CLOSE in text:
            thought, text = text.split(THINK_CLOSE, 1)
            reasoning = thought.split(THINK_OPEN, 1)[-1].removesuffix("\n")
            text = text.removeprefix("\n")
        elif self.enable_thinking:
            return Action(content="", reasoning_content=text, error=MISSING_THINK_END)
        content, calls = parse_xml_calls(text, schemas=self.schemas, call_id_prefix=call_id_prefix)
        return Action(content=content, reasoning_content=reasoning, tool_calls=tuple(calls))


def _nemotron_3_nano(*, enable_thinking: bool = True, truncate_history_thinking: bool = True) -> ChatMLProtocol:
    return Nemotron3NanoProtocol(enable_thinking=enable_thinking, truncate_history_thinking=truncate_history_thinking)


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"nemotron-3-nano": _nemotron_3_nano}
