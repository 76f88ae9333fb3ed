"""The Qwen3-VL family's chat format: ChatML with images and Hermes JSON tool calls, in Python.

    <|im_start|>system
    ...# Tools ... <tools>...</tools> ...<|im_end|>
    <|im_start|>user
    What is in <|vision_start|><|image_pad|><|vision_end|>this picture?<|im_end|>
    <|im_start|>assistant
    <tool_call>
    {"name": "zoom", "arguments": {...}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    <|vision_start|><|image_pad|><|vision_end|>the crop
    </tool_response><|im_end|>

Mirrors the official Qwen3-VL-Instruct template statement by statement (golden: `qwen3_vl_instruct`): no default
system prompt; a system message is rendered only first (the template has no branch for a later one, so it
vanishes there, as here); each image of a user or tool message is `<|vision_start|><|image_pad|><|vision_end|>`
where it sat among the text parts. Images in a system or assistant message, which the template drops, are refused
(the engine would still be sent them), as are video parts and `add_vision_id` (its "Picture N:" numbering runs
across the conversation, which a turn's feedback cannot know). Parsing follows vLLM's `hermes` tool parser with no
reasoning parser, as for Qwen2.5: every `<tool_call>` block is a call.

The template is append-only, so the transcript of an episode is the official render of its conversation. Its text
holds one `<|image_pad|>` per image; the model's processor expands each into the number of pads the image's size
gives (`agent_protocol.images.VisionGrid`), and that expansion is the transcript's business, not this module's.
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

__all__ = [
    "IMAGE_PAD",
    "IMAGE_PLACEHOLDER",
    "PROTOCOLS",
    "QwenVLProtocol",
    "content_with_images",
    "hermes_calls",
    "image_urls",
]

VISION_START: Final = "<|vision_start|>"
IMAGE_PAD: Final = "<|image_pad|>"
VISION_END: Final = "<|vision_end|>"
#: what the template writes for one image
IMAGE_PLACEHOLDER: Final = VISION_START + IMAGE_PAD + VISION_END


class QwenVLProtocol(ChatProtocol):
    """The Qwen3-VL-Instruct template. `image_pad` is the token a processor expands per image."""

    name = "qwen3-vl"
    end_of_turn = IM_END
    stop_texts = STOP_TEXTS
    image_pad = IMAGE_PAD

    def __repr__(self) -> str:
        return "QwenVLProtocol()"

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
        msgs = _shown(coerce_messages(messages, images=True))
        if not msgs:
            raise MessageError("messages", "the official Qwen3-VL template cannot render an empty conversation")
        out = [_system_block(msgs, coerce_tools(tools))]
        out.extend(_render_body(msgs))
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        refused = (
            "feedback carries tool or user messages (the Qwen3-VL template renders a system message only at the top)"
        )
        msgs = _shown(feedback_messages(messages, system_refused=refused, images=True))
        return feedback_opening(turn_closed=turn_closed) + "".join(_render_body(msgs)) + self.generation_prompt

    def render_generation(self, message: MessageLike) -> str:
        (msg,) = _shown([generated_message(message, images=True)])
        return (msg.content or "") + hermes_calls(msg) + IM_END

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        content, calls = split_tool_calls(strip_end_marker(text), call_id_prefix=call_id_prefix)
        return Action(content=content, tool_calls=tuple(calls))


def image_urls(messages: Iterable[MessageLike]) -> list[str]:
    """The images of `messages` in the order a render writes their placeholders: the list an engine or processor
    takes with the rendered text (one `<|image_pad|>` each)."""
    return [image.url for message in coerce_messages(messages, images=True) for image in message.images]


def _shown(msgs: list[Message]) -> list[Message]:
    """`msgs`, refusing an image where the template would drop it (a system or assistant message)."""
    for index, message in enumerate(msgs):
        if message.images and message.role in ("system", "assistant"):
            raise MessageError(
                f"messages[{index}].content",
                f"the Qwen3-VL template shows images only in user and tool messages, not in a {message.role} one",
            )
    return msgs


def content_with_images(message: Message) -> str:
    """The message's text with each image's placeholder where the image sat."""
    text = message.content or ""
    if not message.images:
        return text
    out: list[str] = []
    at = 0
    for image in message.images:
        out.append(text[at : image.offset] + IMAGE_PLACEHOLDER)
        at = max(at, image.offset)
    out.append(text[at:])
    return "".join(out)


def _system_block(msgs: list[Message], specs: list[ToolSpec]) -> str:
    has_system = msgs[0].role == "system"
    if specs:
        system = (msgs[0].content or "") + "\n\n" if has_system else ""
        return f"{IM_START}system\n{system}{hermes_tools(specs)}"
    return f"{IM_START}system\n{msgs[0].content or ''}{IM_END}\n" if has_system else ""


def hermes_calls(msg: Message) -> str:
    """The calls after the content: each a Hermes block, after a newline unless it opens an empty turn."""
    return "".join(("\n" if j > 0 or msg.content else "") + hermes_call(call) for j, call in enumerate(msg.tool_calls))


def _render_body(msgs: list[Message]) -> list[str]:
    """Every user, assistant and tool message (system messages are the system block's, or not rendered)."""
    out: list[str] = []
    for index, msg in enumerate(msgs):
        if msg.role == "user":
            out.append(f"{IM_START}user\n{content_with_images(msg)}{IM_END}\n")
        elif msg.role == "assistant":
            out.append(f"{IM_START}assistant\n{msg.content or ''}{hermes_calls(msg)}{IM_END}\n")
        elif msg.role == "tool":
            opens = index == 0 or msgs[index - 1].role != "tool"
            closes = index == len(msgs) - 1 or msgs[index + 1].role != "tool"
            out.append(
                (f"{IM_START}user" if opens else "")
                + f"\n<tool_response>\n{content_with_images(msg)}\n</tool_response>"
                + (f"{IM_END}\n" if closes else "")
            )
    return out


def _qwen3_vl() -> ChatProtocol:
    return QwenVLProtocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"qwen3-vl": _qwen3_vl}
