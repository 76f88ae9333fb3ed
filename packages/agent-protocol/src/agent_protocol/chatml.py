"""The ChatML pieces the Qwen templates share (Qwen2.5, Qwen3, Qwen3-Coder, Qwen3-VL, Qwen2.5-VL), written once,
and `ChatMLProtocol`, the render scaffold each of those families fills in with its hooks.

Every turn is `<|im_start|>{role}\\n...<|im_end|>\\n`; a model ends its turn with `<|im_end|>` (or, rarely,
`<|endoftext|>`), and the newline after it is the template's, so the feedback after a generated turn writes it.
Qwen2.5, Qwen3 and Qwen3-VL also print the same Hermes tool prompt, tool-call blocks and `<tool_response>` turns;
they live here too, as does the placeholder the vision templates write for an image. Qwen3-Coder lists tools and
writes calls in its own XML form (its module). This module knows the tag strings and the order every ChatML render
follows (system block, turns, generation prompt); which system block, how each turn is written, reasoning and
parsing are each family's.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Final

from agent_protocol.chat_protocol import ChatProtocol, feedback_messages
from agent_protocol.errors import MessageError
from agent_protocol.template_json import tojson, tojson_kept
from agent_protocol.types import Message, MessageLike, ToolCall, ToolSpec

__all__ = [
    "ENDOFTEXT",
    "GENERATION_PROMPT",
    "IMAGE_PAD",
    "IMAGE_PLACEHOLDER",
    "IM_END",
    "IM_START",
    "STOP_TEXTS",
    "ChatMLProtocol",
    "content_with_images",
    "feedback_opening",
    "hermes_call",
    "hermes_calls",
    "hermes_system_block",
    "hermes_tool_response",
    "hermes_tools",
    "strip_end_marker",
]

IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
ENDOFTEXT: Final = "<|endoftext|>"
#: what engines stop on; `<|im_end|>` is the turn's own end, `<|endoftext|>` a model that ends the document
STOP_TEXTS: Final = (IM_END, ENDOFTEXT)
GENERATION_PROMPT: Final = f"{IM_START}assistant\n"

VISION_START: Final = "<|vision_start|>"
IMAGE_PAD: Final = "<|image_pad|>"
VISION_END: Final = "<|vision_end|>"
#: what the vision templates write for one image
IMAGE_PLACEHOLDER: Final = VISION_START + IMAGE_PAD + VISION_END

_HERMES_TOOLS_HEADER: Final = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_TOOLS_FOOTER: Final = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)


class ChatMLProtocol(ChatProtocol):
    """A ChatML family: `render_messages` writes the system block, the turns and the generation prompt;
    `render_feedback` closes the generated turn, writes the turns and opens the next. A family fills in
    `_render_body` (and `_system_block` where its system prompt is not Hermes's: no default, the tool prompt
    appended), `render_generation`, `parse_turn`, and where it differs `generation_prompt` or `_checked`."""

    end_of_turn = IM_END
    stop_texts = STOP_TEXTS
    #: the template's name, for refusing an empty conversation it cannot render (None: it renders one)
    template: str | None = None
    #: why a feedback may not carry a system message (None: it may, rendered as a turn)
    feedback_system_refused: str | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def generation_prompt(self) -> str:
        return GENERATION_PROMPT

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        msgs = self._checked(msgs)
        if not msgs and self.template is not None:
            raise MessageError("messages", f"the official {self.template} template cannot render an empty conversation")
        out = [self._system_block(msgs, specs or [])]
        out.extend(self._render_body(msgs, feedback=False))
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        refused = self.feedback_system_refused
        msgs = self._checked(feedback_messages(messages, system_refused=refused, images=self.accepts_images))
        body = self._render_body(msgs, feedback=True)
        return feedback_opening(turn_closed=turn_closed) + "".join(body) + self.generation_prompt

    def _checked(self, msgs: list[Message]) -> list[Message]:
        """`msgs`, or a `MessageError` for what the template cannot render (by default everything renders)."""
        return msgs

    def _system_block(self, msgs: list[Message], specs: list[ToolSpec]) -> str:
        """What opens the prompt: by default Hermes's (`hermes_system_block`)."""
        return hermes_system_block(msgs, specs)

    @abstractmethod
    def _render_body(self, msgs: list[Message], *, feedback: bool) -> list[str]:
        """The turns after the system block. `feedback`: `msgs` continue a conversation after a generated turn
        (a leading system message is then a turn, not the system block's)."""


def strip_end_marker(text: str) -> str:
    """A generated turn without the end token it stopped on, if any (one: `<|im_end|>` or `<|endoftext|>`)."""
    for marker in STOP_TEXTS:
        if text.endswith(marker):
            return text[: -len(marker)]
    return text


def feedback_opening(*, turn_closed: bool) -> str:
    """What the feedback writes first after a generated turn: the `<|im_end|>` a cut-off turn lacks, then the
    newline the template puts after every turn (the model stops on `<|im_end|>` and never writes it)."""
    return ("" if turn_closed else IM_END) + "\n"


def content_with_images(message: Message) -> str:
    """The message's text with each image's placeholder where the image sat (its text when it has none)."""
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


def hermes_tools(specs: list[ToolSpec]) -> str:
    """The Hermes tool prompt that ends the system turn (its `<|im_end|>\\n` included): the header, one JSON line
    per tool, and the call format. Every episode's prompt lists the same tools: their JSON is kept (`tojson_kept`)."""
    listing = "".join("\n" + tojson_kept(spec.to_openai()) for spec in specs)
    return f"{_HERMES_TOOLS_HEADER}{listing}{_HERMES_TOOLS_FOOTER}"


def hermes_system_block(msgs: list[Message], specs: list[ToolSpec]) -> str:
    """The system turn of Qwen3 and Qwen3-VL: the first message's text if it is a system one (no default), then
    the tool prompt when there are tools; nothing when there is neither."""
    has_system = bool(msgs) and msgs[0].role == "system"
    if specs:
        system = (msgs[0].content or "") + "\n\n" if has_system else ""
        return f"{IM_START}system\n{system}{hermes_tools(specs)}"
    return f"{IM_START}system\n{msgs[0].content or ''}{IM_END}\n" if has_system else ""


def hermes_call(call: ToolCall) -> str:
    """One call as the templates write it: a `<tool_call>` block holding `{"name": ..., "arguments": ...}`."""
    return f'<tool_call>\n{{"name": "{call.name}", "arguments": {tojson(call.arguments)}}}\n</tool_call>'


def hermes_calls(content: str | None, calls: Sequence[ToolCall]) -> str:
    """The calls after a turn's `content`: each a Hermes block, after a newline unless it opens an empty turn."""
    if not calls:
        return ""
    blocks = [hermes_call(call) for call in calls]
    return ("\n" if content else "") + "\n".join(blocks)


def hermes_tool_response(msgs: list[Message], index: int) -> str:
    """The tool result at `msgs[index]` as a `<tool_response>` inside a user turn (its images as placeholders): a
    run of tool messages shares one turn, opened by the first of the run and closed by the last."""
    out: list[str] = []
    if index == 0 or msgs[index - 1].role != "tool":
        out.append(f"{IM_START}user")
    message = msgs[index]
    content = content_with_images(message) if message.images else message.content or ""
    out.append(f"\n<tool_response>\n{content}\n</tool_response>")
    if index == len(msgs) - 1 or msgs[index + 1].role != "tool":
        out.append(f"{IM_END}\n")
    return "".join(out)
