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

from collections.abc import Iterable
from typing import Final

from agent_protocol.chat_protocol import generated_message
from agent_protocol.chatml import (
    IM_END,
    IM_START,
    IMAGE_PAD,
    IMAGE_PLACEHOLDER,
    ChatMLProtocol,
    content_with_images,
    hermes_calls,
    hermes_tool_response,
    strip_end_marker,
)
from agent_protocol.errors import MessageError
from agent_protocol.hermes_parser import split_tool_calls
from agent_protocol.types import Action, Message, MessageLike, coerce_messages

__all__ = ["IMAGE_PAD", "IMAGE_PLACEHOLDER", "PROTOCOLS", "QwenVLProtocol", "content_with_images", "image_urls"]


class QwenVLProtocol(ChatMLProtocol):
    """The Qwen3-VL-Instruct template. `image_pad` is the token a processor expands per image."""

    name = "qwen3-vl"
    image_pad = IMAGE_PAD
    template: str | None = "Qwen3-VL"
    feedback_system_refused: str | None = (
        "feedback carries tool or user messages (the Qwen3-VL template renders a system message only at the top)"
    )

    def render_generation(self, message: MessageLike) -> str:
        (msg,) = self._checked([generated_message(message, images=True)])
        return (msg.content or "") + hermes_calls(msg.content, msg.tool_calls) + IM_END

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        content, calls = split_tool_calls(strip_end_marker(text), call_id_prefix=call_id_prefix)
        return Action(content=content, tool_calls=tuple(calls))

    def _checked(self, msgs: list[Message]) -> list[Message]:
        """`msgs`, refusing an image where the template would drop it (a system or assistant message)."""
        for index, message in enumerate(msgs):
            if message.images and message.role in ("system", "assistant"):
                raise MessageError(
                    f"messages[{index}].content",
                    f"the Qwen3-VL template shows images only in user and tool messages, not in a {message.role} one",
                )
        return msgs

    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        """Every user, assistant and tool message (system messages are the system block's, or not rendered)."""
        out: list[str] = []
        for index, msg in enumerate(msgs):
            if msg.role == "user":
                out.append(f"{IM_START}user\n{content_with_images(msg)}{IM_END}\n")
            elif msg.role == "assistant":
                out.append(
                    f"{IM_START}assistant\n{msg.content or ''}{hermes_calls(msg.content, msg.tool_calls)}{IM_END}\n"
                )
            elif msg.role == "tool":
                out.append(hermes_tool_response(msgs, index))
        return out


def image_urls(messages: Iterable[MessageLike]) -> list[str]:
    """The images of `messages` in the order a render writes their placeholders: the list an engine or processor
    takes with the rendered text (one `<|image_pad|>` each)."""
    return [image.url for message in coerce_messages(messages, images=True) for image in message.images]


def _qwen3_vl() -> ChatMLProtocol:
    return QwenVLProtocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"qwen3-vl": _qwen3_vl}
