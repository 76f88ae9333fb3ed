"""`TranscriptStore` and `conversation_key` on their own: what the key covers, copies on the way out, LRU bounds."""

from __future__ import annotations

import math

import pytest

from agent_protocol import Message, TokenTranscript, ToolCall, ToolSpec
from agent_runtime.serving import StoredConversation, TranscriptStore, conversation_key

TOOLS = [ToolSpec(name="calculator", parameters={"type": "object", "properties": {"expression": {"type": "string"}}})]
CALL = ToolCall(id="call_1", name="calculator", arguments={"expression": "1 + 1", "precision": 2})


def conversation(**assistant: object) -> list[Message]:
    turn = {"role": "assistant", "content": "", "tool_calls": (CALL,), **assistant}
    return [Message(role="user", content="What is 1 + 1?"), Message(**turn)]  # type: ignore[arg-type]


def entry(n: int, conversation_id: str = "c") -> StoredConversation:
    transcript = TokenTranscript()
    transcript.append_prompt(list(range(n)))
    transcript.append_action([7, 8], [-0.5, -1.5])
    return StoredConversation(conversation_id, transcript, turn_closed=True, turns=1)


def test_the_key_ignores_reasoning_and_the_order_of_argument_keys() -> None:
    key = conversation_key(TOOLS, conversation())
    assert conversation_key(TOOLS, conversation(reasoning_content="I think.")) == key
    swapped = ToolCall(id="call_1", name="calculator", arguments={"precision": 2, "expression": "1 + 1"})
    assert conversation_key(TOOLS, conversation(tool_calls=(swapped,))) == key
    assert conversation_key(TOOLS, conversation(content=None)) == key  # null and empty content render the same


@pytest.mark.parametrize(
    "change",
    [
        {"content": "Let me compute."},
        {"tool_calls": (ToolCall(id="other", name="calculator", arguments=CALL.arguments),)},
        {"tool_calls": (ToolCall(id="call_1", name="calculator", arguments={"expression": "1 + 2"}),)},
        {"tool_calls": ()},
    ],
)
def test_the_key_changes_with_what_the_prompt_is_made_of(change: dict[str, object]) -> None:
    assert conversation_key(TOOLS, conversation(**change)) != conversation_key(TOOLS, conversation())


def test_the_key_covers_the_tools() -> None:
    other = [ToolSpec(name="calculator", description="Adds numbers.", parameters=TOOLS[0].parameters)]
    assert conversation_key(other, conversation()) != conversation_key(TOOLS, conversation())
    assert conversation_key([], conversation()) != conversation_key(TOOLS, conversation())


def test_get_returns_an_equal_copy_that_can_be_extended_without_touching_the_store() -> None:
    store = TranscriptStore()
    original = entry(5)
    original.transcript.append_observation([9])
    store.put("k", original)
    got = store.get("k")
    assert got is not None
    assert got.transcript.record() == original.transcript.record()
    assert got.transcript.logprobs[5:7] == [-0.5, -1.5] and got.transcript.logprobs[0] is None
    got.transcript.append_observation([1, 2, 3])
    again = store.get("k")
    assert again is not None and len(again.transcript) == len(original.transcript)
    assert not any(isinstance(lp, float) and math.isnan(lp) for lp in again.transcript.logprobs)


def test_least_recently_used_conversations_are_evicted_first() -> None:
    store = TranscriptStore(max_conversations=2)
    store.put("a", entry(1))
    store.put("b", entry(1))
    assert store.get("a") is not None  # "a" is now the most recent
    store.put("c", entry(1))
    assert "b" not in store and "a" in store and "c" in store
    assert store.evictions == 1


def test_the_token_bound_evicts_and_refuses_what_cannot_fit() -> None:
    store = TranscriptStore(max_tokens=20)
    store.put("a", entry(8))  # 10 tokens
    store.put("b", entry(8))
    assert store.tokens == 20 and len(store) == 2
    store.put("c", entry(3))
    assert "a" not in store and store.tokens == 15
    store.put("huge", entry(30))
    assert "huge" not in store and store.tokens == 15
    store.put("b", entry(1))  # replacing an entry frees its tokens
    assert store.tokens == 8


def test_a_store_of_size_zero_keeps_nothing() -> None:
    store = TranscriptStore(max_conversations=0)
    store.put("a", entry(1))
    assert len(store) == 0 and store.get("a") is None
    with pytest.raises(ValueError, match="bounds"):
        TranscriptStore(max_conversations=-1)
