"""The Qwen2.5-VL family's chat format (the Qwen2-VL-Instruct template, which Qwen2.5-VL-Instruct ships unchanged):
plain ChatML with images, no tools, in Python.

    <|im_start|>system
    You are a helpful assistant.<|im_end|>
    <|im_start|>user
    What is in <|vision_start|><|image_pad|><|vision_end|>this picture?<|im_end|>
    <|im_start|>assistant
    A cat.<|im_end|>
    <|im_start|>tool
    <|vision_start|><|image_pad|><|vision_end|>the crop<|im_end|>

Mirrors the official template (golden: `qwen2_5_vl_instruct`): "You are a helpful assistant." as the system message
when the first message is not one; then every message, whatever its role and position, as
`<|im_start|>{role}\\n` + its content + `<|im_end|>\\n`, each image `<|vision_start|><|image_pad|><|vision_end|>`
where it sat among the text parts (in any role: the template renders them all, so all are accepted and sent).
The template renders no tools and no tool calls: `tools=` and an assistant message with `tool_calls` are refused
(the render would silently drop them); a tool agent wants the qwen3-vl protocol's Hermes format. Video parts and
`add_vision_id` are refused as in qwen3-vl (the latter is not an option: its numbering runs across the conversation,
which a turn's feedback cannot know).

Parsing is vLLM's `hermes` tool parser with no reasoning parser, as qwen3-vl (inherited): the template prompts for no
calls, but a `<tool_call>` block the model writes is read as a call, as vLLM with `--tool-call-parser hermes` would;
`render_generation` writes calls that way, so the parser inverts it. The template is append-only, so the transcript
of an episode without calls is the official render of its conversation.
"""

from __future__ import annotations

from typing import Final

from agent_protocol.chat_protocol import generated_message
from agent_protocol.chatml import IM_END, IM_START, content_with_images, hermes_calls
from agent_protocol.errors import MessageError
from agent_protocol.protocols.qwen_vl import QwenVLProtocol
from agent_protocol.types import Message, MessageLike, ToolSpec

__all__ = ["DEFAULT_SYSTEM", "PROTOCOLS", "Qwen25VLProtocol"]

#: the system message the template writes when the conversation does not open with one
DEFAULT_SYSTEM: Final = "You are a helpful assistant."


class Qwen25VLProtocol(QwenVLProtocol):
    """The Qwen2-VL / Qwen2.5-VL-Instruct template: ChatML with images in any role, no tools."""

    name = "qwen2.5-vl"
    template = None  # an empty conversation renders as nothing
    feedback_system_refused = None  # a system message renders where it stands

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message, images=True)
        if msg.images:
            raise MessageError("message.content", "a generated turn holds no image: a model writes text")
        return (msg.content or "") + hermes_calls(msg.content, msg.tool_calls) + IM_END

    def _checked(self, msgs: list[Message]) -> list[Message]:
        """`msgs`, refusing an assistant message with tool calls: the template renders none, so they would vanish."""
        for index, message in enumerate(msgs):
            if message.tool_calls:
                raise MessageError(
                    f"messages[{index}].tool_calls",
                    "the official Qwen2.5-VL template renders no tool calls; use the qwen3-vl protocol's Hermes "
                    "format for tool agents",
                )
        return msgs

    def _system_block(self, msgs: list[Message], specs: list[ToolSpec]) -> str:
        if specs:
            raise MessageError(
                "tools",
                "the official Qwen2.5-VL template renders no tools; use the qwen3-vl protocol's Hermes format "
                "for tool agents",
            )
        return f"{IM_START}system\n{DEFAULT_SYSTEM}{IM_END}\n" if msgs and msgs[0].role != "system" else ""

    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        """Every message, whatever its role, as `<|im_start|>{role}` + its content + `<|im_end|>`."""
        return [f"{IM_START}{msg.role}\n{content_with_images(msg)}{IM_END}\n" for msg in msgs]


def _qwen2_5_vl() -> QwenVLProtocol:
    return Qwen25VLProtocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"qwen2.5-vl": _qwen2_5_vl}
