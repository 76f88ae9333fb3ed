"""OpenAI-style dicts in and out, and errors that name the message index and field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from agent_protocol import (
    Message,
    MessageError,
    ToolCall,
    ToolSpec,
    coerce_messages,
    coerce_tools,
    get_protocol,
)


def test_openai_round_trip() -> None:
    data = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    }
    message = Message.from_openai(data)
    assert message.tool_calls == (ToolCall(id="a1", name="f", arguments={"x": 1}),)
    assert message.to_openai() == data
    assert Message.from_openai(message.to_openai()) == message


def test_structs_survive_msgpack_and_json() -> None:
    message = Message(role="assistant", content="x", tool_calls=(ToolCall(id="1", name="f", arguments={"a": [1]}),))
    assert msgspec.json.decode(msgspec.json.encode(message), type=Message) == message
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=Message) == message


def test_text_parts_are_joined() -> None:
    (message,) = coerce_messages(
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert message.content == "ab"


def test_tool_spec_round_trip_keeps_openai_key_order() -> None:
    data = {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
    }
    spec = ToolSpec.from_openai(data)
    assert spec.to_openai() == data
    assert list(spec.to_openai()["function"]) == ["name", "description", "parameters"]
    assert coerce_tools([{"name": "g"}])[0].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("messages", "location"),
    [
        ([{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}], "messages[1].role"),
        ([{"content": "no role"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]"),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}],
                }
            ],
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}],
                }
            ],
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}],
            "messages[0].tool_calls[0].function.name",
        ),
        ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
        ([{"role": "tool", "content": "x", "tool_call_id": 7}], "messages[0].tool_call_id"),
        (["just a string"], "messages[0]"),
    ],
)
def test_bad_messages_name_index_and_field(messages: list[Any], location: str) -> None:
    with pytest.raises(MessageError) as info:
        get_protocol("qwen3").render_messages(messages)
    assert info.value.location == location
    assert str(info.value).startswith(location + ":")
    assert isinstance(info.value, ValueError)


def test_messages_must_be_a_list() -> None:
    with pytest.raises(MessageError, match="messages: must be a list"):
        coerce_messages("hello")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tools", "location"),
    [
        ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name"),
        ([{"name": "f", "parameters": "object"}], "tools[0].parameters"),
        ({"name": "f"}, "tools"),
    ],
)
def test_bad_tools_name_index_and_field(tools: Any, location: str) -> None:
    with pytest.raises(MessageError) as info:
        get_protocol("qwen3").render_messages([{"role": "user", "content": "x"}], tools=tools)
    assert info.value.location == location
