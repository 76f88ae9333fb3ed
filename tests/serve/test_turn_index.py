"""`TurnIndex`: the bounded map from a tools-mode turn's prompt key to the key its conversation was stored under,
by which a follow-up that rewrote that turn finds it (`tools_mode`)."""

from __future__ import annotations

import pytest

from agent_runtime.serving.turn_index import TurnIndex


def test_it_keeps_the_latest_keys_up_to_its_capacity() -> None:
    index = TurnIndex(2)
    index.put("a", "stored-a")
    index.put("b", "stored-b")
    index.put("a", "stored-a2")  # the same prompt answered again: its latest turn is the one found
    index.put("c", "stored-c")  # over capacity: the least recently put ("b") goes
    assert (index.get("a"), index.get("b"), index.get("c"), len(index)) == ("stored-a2", None, "stored-c", 2)


def test_a_disabled_store_keeps_no_turns_and_a_negative_capacity_is_refused() -> None:
    index = TurnIndex(0)
    index.put("a", "stored-a")
    assert index.get("a") is None and len(index) == 0
    with pytest.raises(ValueError, match="capacity"):
        TurnIndex(-1)


def test_turn_keys_are_the_store_keys_of_the_prompt_and_of_the_prompt_with_its_turn() -> None:
    from agent_protocol import Message, ToolSpec
    from agent_runtime.serving.transcript_store import conversation_key, turn_keys

    tools = [ToolSpec(name="calculator", description="d", parameters={"type": "object"})]
    prompt = [Message(role="system", content="s"), Message(role="user", content="What is 2 + 2?")]
    turn = Message(role="assistant", content="4", reasoning_content="add")
    assert turn_keys(tools, prompt, turn) == (conversation_key(tools, prompt), conversation_key(tools, [*prompt, turn]))
    assert turn_keys([], [], turn) == (conversation_key([], []), conversation_key([], [turn]))
