"""The Qwen3.5 / Qwen3.6 chat format: ChatML with `<think>` reasoning and Qwen3-Coder's XML tool calls, in Python.

    <|im_start|>system
    # Tools ... <tools>{"type": "function", ...}</tools> ... </IMPORTANT>

    You are a coding agent.<|im_end|>
    <|im_start|>user
    Find the base class.<|im_end|>
    <|im_start|>assistant
    <think>
    I should grep.
    </think>

    <tool_call>
    <function=grep>
    <parameter=pattern>
    class Base
    </parameter>
    </function>
    </tool_call><|im_end|>

Mirrors the official templates statement by statement: Qwen/Qwen3.5-9B's `chat_template.jinja` (golden:
`qwen3.5`, name `qwen3.5`) and Qwen/Qwen3.6-27B's (golden: `qwen3.6`, name `qwen3.6`). They differ in two
places: Qwen3.6 takes `preserve_thinking` (keep the reasoning of every assistant turn, not only of those after the
last user query), and writes a non-string argument value as JSON (`true`, `null`) where Qwen3.5 writes it through
Jinja's `string` (`True`, `None`; objects and arrays as JSON in both). Every content is trimmed; tools are listed
as one JSON line each (Hermes's listing, Qwen3-Coder's instructions); a system message is allowed only first and
the tool prompt comes before it; a conversation with no user query (only wrapped tool responses) is refused, as
the template refuses it. The generation prompt opens `<think>\\n` (with `enable_thinking=False` it holds an empty
`<think>` block). An image in a user, assistant or tool message is `<|vision_start|><|image_pad|><|vision_end|>`
where it sat (one `<|image_pad|>` that the processor expands, as for Qwen3-VL); one in a system message is refused,
as the template refuses it. Videos and `add_vision_id` (its "Picture N:" numbering runs across the conversation,
which a turn's feedback cannot know) are not supported.

Parsing follows vLLM's `qwen3_coder` tool parser (`agent_protocol.xml_call_parser`, values typed by the episode's
tool schemas through `with_tools`) behind its `qwen3` reasoning parser in the form the thinking-2507 models need:
the prompt opened `<think>`, so the text up to `</think>` is reasoning; a `<tool_call>` ends reasoning never closed
(as vLLM does since its PR #35687); reasoning never closed and followed by no call is a `missing_think_end` issue.

Seams (where the transcript of an episode keeps what was sampled and the official render of the conversation
differs): with `preserve_thinking` off (the default, and always for Qwen3.5) the reasoning of turns before the
last user query is dropped, which moves only when a user message arrives (tool results are `tool` messages, so a
one-query agent episode is append-only); with it on there is no such seam. Re-rendering a parsed turn can change
its bytes (whitespace around content and reasoning is trimmed, Qwen3.5 writes a boolean `True`), as for
Qwen3-Coder. At the token level only, a turn with empty reasoning starts `\n</think>` after the prompt's
`<think>\n`: the transcript holds `\n` + `\n` where tokenizing the whole render gives `\n\n`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from agent_protocol.chat_protocol import generated_message
from agent_protocol.chatml import (
    GENERATION_PROMPT,
    IM_END,
    IM_START,
    IMAGE_PAD,
    ChatMLProtocol,
    content_with_images,
    strip_end_marker,
)
from agent_protocol.control_tokens import unmarked
from agent_protocol.errors import MessageError
from agent_protocol.hermes_parser import split_reasoning
from agent_protocol.protocols.qwen3_coder import _TOOLS_FOOTER
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import Action, Message, MessageLike, ToolCall, ToolSpec, ToolSpecLike
from agent_protocol.xml_call_parser import Schemas, parse_xml_calls, schemas_of

__all__ = ["PROTOCOLS", "Qwen35Protocol"]

_TOOLS_HEADER: Final = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
_EMPTY_THINK: Final = "<think>\n\n</think>\n\n"
# Jinja's `trim`: Python's str.strip()


class Qwen35Protocol(ChatMLProtocol):
    """One of the two templates. `json_values`: Qwen3.6's argument writing (non-strings as JSON);
    `preserve_thinking`: Qwen3.6's switch (every turn keeps its reasoning)."""

    image_pad = IMAGE_PAD
    feedback_system_refused: str | None = (
        "feedback carries tool or user messages (the Qwen3.5 templates refuse a system message after the first)"
    )

    def __init__(
        self,
        name: str,
        *,
        enable_thinking: bool = True,
        preserve_thinking: bool = False,
        json_values: bool,
        schemas: Schemas | None = None,
    ) -> None:
        self.name = name
        self.template = "Qwen3.6" if json_values else "Qwen3.5"
        self.enable_thinking = enable_thinking
        self.preserve_thinking = preserve_thinking
        self.json_values = json_values
        #: tool name -> the `properties` of its parameters schema, for typing parsed values
        self.schemas: Schemas = dict(schemas or {})

    def __repr__(self) -> str:
        return (
            f"Qwen35Protocol(name={self.name!r}, enable_thinking={self.enable_thinking}, "
            f"preserve_thinking={self.preserve_thinking}, tools={sorted(self.schemas)!r})"
        )

    def with_tools(self, tools: Iterable[ToolSpecLike]) -> Qwen35Protocol:
        """A copy whose parser types parameter values by the JSON schemas of `tools`, as vLLM does with the
        tools of the request."""
        schemas = schemas_of(tools)
        return Qwen35Protocol(
            self.name,
            enable_thinking=self.enable_thinking,
            preserve_thinking=self.preserve_thinking,
            json_values=self.json_values,
            schemas=schemas,
        )

    @property
    def generation_prompt(self) -> str:
        return GENERATION_PROMPT + ("<think>\n" if self.enable_thinking else _EMPTY_THINK)

    # -- rendering ---------------------------------------------------------------------------------------

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        if msgs and _last_query_index(msgs) is None:
            raise MessageError("messages", f"the official {self.template} template needs a user query (it raises)")
        return super().render_coerced(msgs, specs, add_generation_prompt=add_generation_prompt)

    def _checked(self, msgs: list[Message]) -> list[Message]:
        for index, message in enumerate(msgs):
            if message.role == "system" and message.images:
                raise MessageError(
                    f"messages[{index}].content", "System message cannot contain images (the template raises)"
                )
            if message.role == "system" and index > 0:
                raise MessageError(
                    f"messages[{index}]", f"the official {self.template} template allows a system message only first"
                )
        return msgs

    def _system_block(self, msgs: list[Message], specs: list[ToolSpec]) -> str:
        system = content_with_images(msgs[0]).strip() if msgs and msgs[0].role == "system" else None
        if not specs:
            return "" if system is None else f"{IM_START}system\n{system}{IM_END}\n"
        listing = "".join("\n" + tojson_kept(spec.to_openai()) for spec in specs)
        tail = f"\n\n{system}" if system else ""
        return f"{IM_START}system\n{_TOOLS_HEADER}{listing}{_TOOLS_FOOTER}{tail}{IM_END}\n"

    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        out: list[str] = []
        last = len(msgs) - 1
        # in feedback the last query is before these messages, and none of them is an assistant turn
        last_query = -1 if feedback else _last_query_index(msgs)
        for index, msg in enumerate(msgs):
            content = content_with_images(msg).strip()
            if msg.role == "user" or (msg.role == "system" and feedback):
                out.append(f"{IM_START}{msg.role}\n{content}{IM_END}\n")
            elif msg.role == "assistant":
                reasoning, content = _split_reasoning(msg.reasoning_content, content)
                keep = self.preserve_thinking or (last_query is not None and index > last_query)
                head = f"\n<think>\n{reasoning}\n</think>\n\n{content}" if keep else f"\n{content}"
                out.append(f"{IM_START}assistant{head}{self._calls(content, msg.tool_calls)}{IM_END}\n")
            elif msg.role == "tool":
                if (index > 0 and msgs[index - 1].role != "tool") or (index == 0 and feedback):
                    out.append(f"{IM_START}user")
                out.append(f"\n<tool_response>\n{content}\n</tool_response>")
                if index == last or msgs[index + 1].role != "tool":
                    out.append(f"{IM_END}\n")
        return out

    def _value(self, value: Any) -> str:
        if self.json_values:
            return value if isinstance(value, str) else tojson(value)
        if isinstance(value, (Mapping, list, tuple)):
            return tojson(value)
        return value if isinstance(value, str) else str(value)  # Jinja's `string`: Python's str

    def _calls(self, content: str, calls: tuple[ToolCall, ...]) -> str:
        out: list[str] = []
        for position, call in enumerate(calls):
            lead = ("\n\n" if content.strip() else "") if position == 0 else "\n"
            out.append(f"{lead}<tool_call>\n<function={call.name}>\n")
            out.extend(
                f"<parameter={key}>\n{self._value(value)}\n</parameter>\n" for key, value in call.arguments.items()
            )
            out.append("</function>\n</tool_call>")
        return "".join(out)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        reasoning, content = _split_reasoning(msg.reasoning_content, content_with_images(msg).strip())
        head = f"{reasoning}\n</think>\n\n{content}" if self.enable_thinking else content
        return head + self._calls(content, msg.tool_calls) + IM_END

    # -- parsing -----------------------------------------------------------------------------------------

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        text = strip_end_marker(text)
        call_at = text.find("<tool_call>")
        if "</think>" not in text and call_at >= 0 and (self.enable_thinking or "<think>" in text[:call_at]):
            # vLLM's qwen3 reasoning parser (since PR #35687): a call ends reasoning that was never closed
            thought = text[:call_at].split("<think>", 1)[-1].strip("\n")
            rest, found = parse_xml_calls(text[call_at:], schemas=self.schemas, call_id_prefix=call_id_prefix)
            return Action(content=rest, reasoning_content=thought, tool_calls=tuple(found))
        reasoning, content, issue = split_reasoning(text, reasoning_open=self.enable_thinking)
        if issue is not None:
            return Action(content="", reasoning_content=reasoning, error=issue)
        content, calls = parse_xml_calls(content, schemas=self.schemas, call_id_prefix=call_id_prefix)
        return Action(content=content, reasoning_content=reasoning, tool_calls=tuple(calls))


def _last_query_index(msgs: list[Message]) -> int | None:
    """Index of the last user message that is not a wrapped tool response (None: the template raises)."""
    for index in range(len(msgs) - 1, -1, -1):
        message = msgs[index]
        content = unmarked(content_with_images(message)).strip()
        if message.role == "user" and not (
            content.startswith("<tool_response>") and content.endswith("</tool_response>")
        ):
            return index
    return None


def _split_reasoning(reasoning_content: str | None, content: str) -> tuple[str, str]:
    """(reasoning, content) as the template reads them from a trimmed content: the message's reasoning_content,
    else the text before a `</think>` in the content; the reasoning trimmed."""
    if reasoning_content is not None:
        return reasoning_content.strip(), content
    if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        return reasoning.strip(), content.split("</think>")[-1].lstrip("\n")
    return "", content


def _qwen3_5(*, enable_thinking: bool = True) -> ChatMLProtocol:
    return Qwen35Protocol("qwen3.5", enable_thinking=enable_thinking, json_values=False)


def _qwen3_6(*, enable_thinking: bool = True, preserve_thinking: bool = False) -> ChatMLProtocol:
    return Qwen35Protocol(
        "qwen3.6", enable_thinking=enable_thinking, preserve_thinking=preserve_thinking, json_values=True
    )


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"qwen3.5": _qwen3_5, "qwen3.6": _qwen3_6}
