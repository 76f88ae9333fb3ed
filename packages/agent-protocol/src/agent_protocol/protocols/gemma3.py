"""The Gemma 3 family's chat format (google/gemma-3-*-it), in Python: turns, no tool format, no reasoning.

    <bos><start_of_turn>user
    You are terse.

    What is 17 * 23?<end_of_turn>
    <start_of_turn>model
    391<end_of_turn>
    <start_of_turn>user
    Thanks<end_of_turn>
    <start_of_turn>model

Mirrors the official template (golden: `gemma3_it`): `<bos>`; a first system message is not a turn but a prefix of
the first turn, its text (untrimmed) and a blank line; then every other message as `<start_of_turn>{role}\\n` + its
text trimmed + `<end_of_turn>\\n`, with `assistant` written `model`; `<start_of_turn>model\\n` opens a generation.

What the template refuses is refused here, with its reason: roles that do not alternate user/model/user/... after
the first system message (a user message must stand at every even place, anything else at every odd one), a null
content ("Invalid content type"), an empty conversation. What it drops, or renders in a role Gemma 3 never saw, is
rendered as it renders it, with a warning (`ToolsDroppedWarning`, a `TemplateGapWarning`, once per protocol object):
the template has no tool format. It writes no tool list (`tools=` is dropped without a word), no tool calls (an
assistant turn with calls is its content alone; null content is refused, as the template raises "Invalid content
type" on it) and no tool role of its own: a `tool` message is a `<start_of_turn>tool` turn, and since it is not a
user turn the alternation check refuses it where a user turn must stand, right after a model turn (so tool results
can never follow a call). There is no official Gemma 3 tool format; `gemma3-vllm-pythonic`
(protocols/gemma3_pythonic.py) renders vLLM's own tool template. A generated turn has no calls to write:
`render_generation` refuses a message with calls.
What this module refuses beyond the template:
- images: the template writes `<start_of_image>` for an `image` part, which Gemma 3's processor expands into the
  image's soft tokens; this module is text-only (the expansion is not modelled), so a message with an image is
  refused as in every text-only family.
- a content list whose text parts the template would trim one by one to other bytes than their join (the message
  keeps the joined text), and a system message given as several text parts (the template keeps only the first).
An assistant message's `reasoning_content` is dropped, as the template drops it (Gemma 3 does not reason aloud).

Parsing is plain content: vLLM has no tool parser and no reasoning parser for this template, so a turn is its
text, up to the `<end_of_turn>` it stops on. The template is append-only except for whitespace: a turn's content is
trimmed in history, so a generated turn that starts or ends with whitespace re-renders without it (the transcript
keeps what was sampled).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from agent_protocol.chat_protocol import ChatProtocol, feedback_messages, generated_message
from agent_protocol.errors import MessageError, TemplateGapWarning
from agent_protocol.types import Action, Message, MessageLike, ToolSpec

__all__ = ["BOS", "END_OF_TURN", "PROTOCOLS", "START_OF_TURN", "Gemma3Protocol", "ToolsDroppedWarning"]

BOS: Final = "<bos>"
START_OF_TURN: Final = "<start_of_turn>"
END_OF_TURN: Final = "<end_of_turn>"

_ALTERNATE: Final = "the official Gemma 3 template requires roles to alternate user/assistant/user/assistant/... "
_NO_CALLS: Final = (
    "the official Gemma 3 template renders no tool calls (it has no tool format), so a Gemma 3 model generates "
    "none; use gemma3-vllm-pythonic or another family with tools"
)
_PACKAGE_DIR: Final = str(Path(__file__).parent.parent)


class ToolsDroppedWarning(TemplateGapWarning):
    """Tools, tool calls or tool messages went to the official Gemma 3 template, which has no tool format: it drops
    the tool list and the calls, and writes a tool message as a `tool` turn."""


def _trim(text: str) -> str:
    """Jinja's `trim` filter: Python's `str.strip()`."""
    return text.strip()


class Gemma3Protocol(ChatProtocol):
    """The Gemma 3 instruction-tuned template: `<start_of_turn>` turns, the system text folded into the first."""

    name = "gemma3"
    end_of_turn = END_OF_TURN
    stop_texts = (END_OF_TURN,)

    def __init__(self) -> None:
        self._warned_tools = False

    def __repr__(self) -> str:
        return "Gemma3Protocol()"

    def _warn_tools_dropped(self, what: str) -> None:
        if self._warned_tools:
            return
        self._warned_tools = True
        warnings.warn(
            f"gemma3: {what} went to the official Gemma 3 template, which has no tool format: it renders no tool "
            "list and no tool calls, and writes a tool message as a `tool` turn the model never saw; use "
            "get_protocol('gemma3-vllm-pythonic') (vLLM's Gemma 3 tool template) for a tool agent",
            ToolsDroppedWarning,
            skip_file_prefixes=(_PACKAGE_DIR,),  # point at the caller, past render_prompt and render_messages
        )

    @property
    def generation_prompt(self) -> str:
        return f"{START_OF_TURN}model\n"

    def prepare_raw(self, messages: Iterable[MessageLike], *, tools_given: bool) -> Iterable[MessageLike]:
        if isinstance(messages, Iterable) and not isinstance(messages, (str, bytes, Mapping)):
            messages = list(messages)
            _check_text_parts(messages, system_first=True)
        return messages

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        if specs:
            self._warn_tools_dropped("tools")
        if not msgs:
            raise MessageError(
                "messages", "the official Gemma 3 template reads messages[0]: it renders no empty conversation"
            )
        self._check_messages(msgs)
        prefix = ""
        start = 0
        if msgs[0].role == "system":
            prefix = (msgs[0].content or "") + "\n\n"
            start = 1
        out = [BOS]
        for place, msg in enumerate(msgs[start:]):
            if (msg.role == "user") != (place % 2 == 0):
                raise MessageError(f"messages[{start + place}].role", _ALTERNATE + f"(got {msg.role} at turn {place})")
            out.append(_turn(msg, prefix if place == 0 else ""))
        if add_generation_prompt:
            out.append(self.generation_prompt)
        return "".join(out)

    def render_generation(self, message: MessageLike) -> str:
        msg = generated_message(message)
        if msg.tool_calls:
            raise MessageError("message.tool_calls", _NO_CALLS)
        if msg.reasoning_content is not None:
            raise MessageError("message.reasoning_content", "Gemma 3 generates no reasoning: its template has none")
        return (msg.content or "") + END_OF_TURN

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        _check_text_parts(list(messages), system_first=False)
        msgs = feedback_messages(messages)
        for place, msg in enumerate(msgs):
            if (msg.role == "user") != (place % 2 == 0):
                raise MessageError(
                    f"messages[{place}].role",
                    _ALTERNATE + "(the feedback after a model turn opens with a user message; a tool result cannot "
                    "stand there, the template has no tool format)",
                )
        self._check_messages(msgs)
        close = "" if turn_closed else END_OF_TURN
        return close + "\n" + "".join(_turn(msg, "") for msg in msgs) + self.generation_prompt

    def _check_messages(self, msgs: list[Message]) -> None:
        """Refuse what the template refuses (null content); warn where it drops calls or writes a `tool` turn."""
        for index, msg in enumerate(msgs):
            if msg.content is None:
                raise MessageError(
                    f"messages[{index}].content", "null; the official Gemma 3 template raises 'Invalid content type'"
                )
            if msg.role == "tool" or msg.tool_calls:
                self._warn_tools_dropped("tool calls" if msg.tool_calls else "a tool message")

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        """Plain content, as vLLM serves this template (it has no Gemma 3 tool or reasoning parser for it): the
        text up to the `<end_of_turn>` the engine stopped on."""
        return Action(content=text.removesuffix(END_OF_TURN))


def _turn(msg: Message, prefix: str) -> str:
    role = "model" if msg.role == "assistant" else msg.role
    return f"{START_OF_TURN}{role}\n{prefix}{_trim(msg.content or '')}{END_OF_TURN}\n"


def _check_text_parts(messages: list[Any], *, system_first: bool) -> None:
    """Refuse content lists the template renders otherwise than their joined text: it trims each text part on its
    own, and keeps only the first part of a system message."""
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
            continue
        parts = message["content"]
        texts: list[str] = [
            p["text"]
            for p in parts
            if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
        if len(texts) != len(parts):
            continue  # images and malformed parts: coerce_messages refuses them with its own message
        if system_first and index == 0 and message.get("role") == "system":
            if len(texts) != 1:
                raise MessageError(
                    "messages[0].content",
                    "the official Gemma 3 template keeps only the first text part of a system message; give one",
                )
        elif "".join(_trim(t) for t in texts) != _trim("".join(texts)):
            raise MessageError(
                f"messages[{index}].content",
                "the official Gemma 3 template trims each text part on its own, which changes this text; join the "
                "parts into one string",
            )


def _gemma3() -> ChatProtocol:
    return Gemma3Protocol()


#: registered name -> factory (see agent_protocol.registry)
PROTOCOLS: Final = {"gemma3": _gemma3}
