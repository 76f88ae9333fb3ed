"""`diagnose`: why an agent program's request did not continue a conversation the proxy holds, for each way
clients rewrite history (and reasoning dropped on the way back, which is not a break)."""

from __future__ import annotations

from agent_protocol import Message, ToolCall
from agent_runtime.proxy import diagnose

USER = Message(role="user", content="What is 17 * 23 + 4?")


def turn(n: int, call_id: str | None = None) -> list[Message]:
    """Assistant turn `n` with one calculator call, and the tool's answer."""
    call_id = call_id or f"call_{n}"
    call = ToolCall(id=call_id, name="calculator", arguments={"expression": f"{n} * 2"})
    return [
        Message(role="assistant", content="", reasoning_content=f"step {n}", tool_calls=(call,)),
        Message(role="tool", content=str(n * 2), tool_call_id=call_id, name="calculator"),
    ]


SEEN = [USER, *turn(1), *turn(2), Message(role="assistant", content="The answer is 395.")]


def test_a_first_conversation_or_a_second_one_without_history_is_new() -> None:
    assert diagnose([USER], []) == ("new_conversation", 0)
    assert diagnose([Message(role="user", content="Check 395.")], [SEEN]) == ("new_conversation", 0)


def test_a_conversation_continued_twice_has_branched() -> None:
    retry = [USER, *turn(1), Message(role="user", content="Go on.")]
    assert diagnose(retry, [[USER, turn(1)[0]], SEEN]) == ("branched", 2)


def test_resending_an_earlier_point_is_a_truncated_history() -> None:
    assert diagnose([USER, *turn(1), turn(2)[0]], [SEEN]) == ("history_truncated", 4)


def test_a_sliding_window_drops_messages() -> None:
    window = [USER, *turn(2), Message(role="user", content="And now?")]
    assert diagnose(window, [SEEN]) == ("messages_dropped", 1)


def test_rewritten_tool_call_ids_are_named_as_such() -> None:
    renamed = [USER, *turn(1, call_id="tool_0"), *turn(2)]
    assert diagnose(renamed, [SEEN]) == ("tool_ids_rewritten", 1)


def test_an_edited_message_is_named_with_its_position() -> None:
    edited = [USER, *turn(1)]
    edited[2] = Message(role="tool", content="34", tool_call_id="call_1", name="calculator")
    assert diagnose(edited, [SEEN]) == ("message_edited", 2)


def test_the_closest_earlier_conversation_is_the_reference() -> None:
    other = [Message(role="user", content="Something else."), Message(role="assistant", content="Sure.")]
    edited = [*SEEN[:3], Message(role="assistant", content="Edited.")]
    assert diagnose(edited, [other, SEEN]) == ("message_edited", 3)


def test_dropped_reasoning_is_not_a_difference() -> None:
    """The store's key leaves reasoning out, so a client that drops it continues the sampled ids; `diagnose`
    compares messages the same way."""
    stripped = [USER, *(Message(role=m.role, content=m.content, tool_calls=m.tool_calls,
                                tool_call_id=m.tool_call_id, name=m.name) for m in SEEN[1:3])]  # fmt: skip
    assert diagnose([*stripped, Message(role="user", content="More?")], [SEEN[:2]]) == ("branched", 2)
