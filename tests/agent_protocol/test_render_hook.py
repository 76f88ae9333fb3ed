"""`ChatProtocol.render_messages` is a template method: it checks and coerces, then calls `render_coerced`.

A family written before the hook existed overrides `render_messages` whole, and must keep working; one that
implements neither is told both ways; the hook sees coerced values, with no tools told from an empty list.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from agent_protocol.chat_protocol import ChatProtocol
from agent_protocol.errors import MessageError
from agent_protocol.registry import get_protocol
from agent_protocol.types import Action, Message, MessageLike, ToolSpec, ToolSpecLike, coerce_messages

TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}


class _Minimal(ChatProtocol):
    """Everything but rendering a conversation."""

    name = "minimal"
    end_of_turn = "<end>"
    stop_texts = ("<end>",)

    @property
    def generation_prompt(self) -> str:
        return "<bot>"

    def parse_turn(self, text: str, *, call_id_prefix: str = "call") -> Action:
        return Action(content=text)

    def render_generation(self, message: MessageLike) -> str:
        return "gen"

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        return "feedback"


class _OldStyle(_Minimal):
    """A family as written before `render_coerced`: it overrides `render_messages` itself."""

    def render_messages(
        self,
        messages: Iterable[MessageLike],
        *,
        tools: Iterable[ToolSpecLike] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        text = "".join(f"<{m.role}>{m.content}" for m in coerce_messages(messages))
        return text + (self.generation_prompt if add_generation_prompt else "")


class _Hooked(_Minimal):
    seen: list[tuple[list[Message], list[ToolSpec] | None, bool]]

    def __init__(self) -> None:
        self.seen = []

    def render_coerced(self, msgs: list[Message], specs: list[ToolSpec] | None, *, add_generation_prompt: bool) -> str:
        self.seen.append((msgs, specs, add_generation_prompt))
        return "rendered"


def test_an_old_style_family_that_overrides_render_messages_still_works() -> None:
    protocol = _OldStyle()
    assert protocol.render_messages([{"role": "user", "content": "hi"}]) == "<user>hi"
    assert protocol.render_prompt([{"role": "user", "content": "hi"}], tools=[TOOL]) == "<user>hi<bot>"


def test_a_family_that_renders_neither_way_is_told_both() -> None:
    with pytest.raises(NotImplementedError, match=r"render_coerced.*render_messages"):
        _Minimal().render_messages([{"role": "user", "content": "hi"}])


def test_the_hook_gets_coerced_messages_and_tells_no_tools_from_none() -> None:
    protocol = _Hooked()
    assert protocol.render_prompt([{"role": "user", "content": "hi"}]) == "rendered"
    protocol.render_messages([{"role": "user", "content": "hi"}], tools=[])
    protocol.render_messages([{"role": "user", "content": "hi"}], tools=[TOOL])
    (msgs, no_tools, prompt), (_, empty, no_prompt), (_, given, _) = protocol.seen
    assert msgs == [Message(role="user", content="hi")]
    assert (no_tools, empty, prompt, no_prompt) == (None, [], True, False)
    assert given is not None and [spec.name for spec in given] == ["f"]


def test_the_template_method_checks_before_the_hook() -> None:
    protocol = _Hooked()
    with pytest.raises(MessageError):
        protocol.render_messages([{"role": "wizard", "content": "hi"}])
    with pytest.raises(MessageError):
        protocol.render_messages([{"role": "user", "content": "hi"}], tools="f")  # type: ignore[arg-type]
    with pytest.raises(MessageError):  # a text-only family refuses an image before its hook sees it
        protocol.render_messages(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/tmp/a.png"}}]}]
        )
    assert protocol.seen == []


def test_llama_tells_no_tools_from_an_empty_list_through_the_hook() -> None:
    llama = get_protocol("llama3.1")
    msgs = [{"role": "user", "content": "hi"}]
    assert llama.render_messages(msgs, tools=[]) != llama.render_messages(msgs)
