"""`TranscriptStore` and `conversation_key` on their own: what the key covers, handing conversations over (a copy;
the entry stays until it expires), packing them without loss, LRU bounds in conversations, tokens and bytes."""

from __future__ import annotations

import pytest

from agent_protocol import (
    HFTokenizer,
    Message,
    ParseIssue,
    TokenTranscript,
    ToolCall,
    ToolSpec,
    get_protocol,
    load_tokenizer,
)
from agent_protocol.images import ImageSpan
from agent_protocol.types import ImagePart
from agent_runtime.conversation import Conversation
from agent_runtime.serving import StoredConversation, TranscriptStore, conversation_key
from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

TOOLS = [ToolSpec(name="calculator", parameters={"type": "object", "properties": {"expression": {"type": "string"}}})]
CALL = ToolCall(id="call_1", name="calculator", arguments={"expression": "1 + 1", "precision": 2})


def conversation(**assistant: object) -> list[Message]:
    turn = {"role": "assistant", "content": "", "tool_calls": (CALL,), **assistant}
    return [Message(role="user", content="What is 1 + 1?"), Message(**turn)]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    return load_tokenizer(qwen3_tokenizer_path())  # type: ignore[return-value]


def entry(tokenizer: HFTokenizer, n: int) -> Conversation:
    """A conversation of n + 2 tokens: a prompt of n, then a generated turn of 2."""
    conversation = Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=16)
    transcript = TokenTranscript()
    transcript.append_prompt(list(range(n)))
    transcript.append_action([7, 8], [-0.5, -1.5])
    conversation.restore([transcript], [])
    return conversation


def fresh(tokenizer: HFTokenizer) -> Conversation:
    return Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=16)


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


def test_take_hands_a_copy_over_and_leaves_the_entry_until_it_expires(tokenizer: HFTokenizer) -> None:
    """A take leaves the entry for `retake_s` (two follow-ups to one turn both get it), each taker owns its copy,
    and an entry is gone `ttl_s` after its put or `retake_s` after its last take, dropped lazily and counted."""
    now = [0.0]
    store = TranscriptStore(ttl_s=60, retake_s=10, clock=lambda: now[0])
    assert store.put("k", "c", entry(tokenizer, 5))
    assert store.tokens == 7 and store.bytes > 0
    first, second = store.take("k"), store.take("k")  # a retry, a branch
    assert first is not None and second is not None and first.conversation_id == second.conversation_id == "c"
    assert first.segments[0].ids is not second.segments[0].ids  # extending one leaves the other, and the store's
    first.segments[0].ids.append(9)
    again = store.take("k")
    assert again is not None and len(again.segments[0].ids) == 7
    assert "k" in store and store.tokens == 7
    now[0] = 9.9
    assert store.take("k") is not None  # 10 s after the last take, not after the first
    now[0] = 19.8
    assert "k" in store
    now[0] = 19.9
    assert "k" not in store and store.take("k") is None
    assert len(store) == 0 and store.tokens == 0 and store.bytes == 0 and store.expired == 1
    store.put("old", "c", entry(tokenizer, 1))  # never taken: gone at its TTL, dropped by a later put
    now[0] = 80
    store.put("new", "c", entry(tokenizer, 2))
    assert len(store) == 1 and "new" in store and store.tokens == 4 and store.expired == 2
    assert TranscriptStore(ttl_s=5, retake_s=300).retake_s == 5  # at most the TTL
    with pytest.raises(ValueError, match="retake_s"):
        TranscriptStore(retake_s=0)
    with pytest.raises(ValueError, match="ttl_s"):
        TranscriptStore(ttl_s=-1)


def test_a_conversation_comes_back_as_it_was_stored(tokenizer: HFTokenizer) -> None:
    """Packed and restored: ids, loss mask, logprobs (an action without them too), spans, images, messages (tool
    calls, a botched call, reasoning, images), segments of a compacted conversation, counters."""
    original = fresh(tokenizer)
    first = TokenTranscript()
    first.append_prompt([151644, 872, 198, 2**31 - 1], images=[ImageSpan(start=1, end=3, source="data:image/png;x")])
    first.append_action([151667, 42, 151645], [-0.125, -2.5e-9, 0.0])
    first.append_observation([198, 151644])
    first.append_action([5, 6])  # an engine that gave no logprobs
    second = TokenTranscript()
    second.append_prompt([1, 2, 3])
    second.append_action([9], [-1.0])
    issue = ParseIssue(code="invalid_json", message="the call is not JSON")
    messages = [
        Message(role="user", content="Look: ", images=(ImagePart(url="data:image/png;x", offset=6),)),
        Message(role="assistant", content="", reasoning_content="I think.", tool_calls=(CALL,)),
        Message(role="tool", tool_call_id="call_1", name="calculator", content="2"),
        Message(role="assistant", tool_calls=(ToolCall(id="c2", name="x", raw="{", error=issue),)),
    ]
    original.restore([first, second], messages, turns=2, generations=3, turn_closed=False, render_s=0.25)
    stored = StoredConversation.pack("c", original)
    assert stored is not None and stored.tokens == len(first) + len(second)
    restored = stored.restore(fresh(tokenizer))
    assert restored.records() == original.records()
    assert restored.messages == original.messages
    assert (restored.turns, restored.generations, restored.turn_closed, restored.ended_by, restored.render_s) == (
        2, 3, False, None, 0.25
    )  # fmt: skip
    restored.transcript.append_observation([1])  # it goes on like any conversation
    assert len(restored) == len(second) + 1


def test_a_follow_up_is_packed_on_top_of_what_it_was_restored_from(tokenizer: HFTokenizer) -> None:
    """Packing again after a follow-up extends the arrays it was restored from: only the new tokens and messages
    are packed, and the result is what packing it whole gives."""
    store = TranscriptStore()
    conversation = entry(tokenizer, 20)
    conversation.messages.append(Message(role="user", content="What is 1 + 1?"))
    store.put("k1", "c", conversation)
    for i in range(20):  # past 16 messages: the msgpack array header grows a length field
        stored = store.take(f"k{i + 1}")
        assert stored is not None
        restored = stored.restore(fresh(tokenizer))
        restored.transcript.append_observation([100 + i, 101])
        restored.transcript.append_action([7, 8, 9], [-0.25, -1.0, -2.0] if i % 2 else None)
        restored.add_messages([Message(role="tool", content=str(i)), Message(role="assistant", content="ok")])
        assert store.put(f"k{i + 2}", "c", restored, previous=stored)
        assert len(stored.segments[0].ids) == len(restored.transcript)  # the taken copy's arrays, extended
        again = store.take(f"k{i + 2}")
        assert again is not None
        whole = StoredConversation.pack("c", restored)
        assert whole is not None and again.messages == whole.messages and again.tokens == whole.tokens
        assert again.restore(fresh(tokenizer)).records() == restored.records()
        assert again.restore(fresh(tokenizer)).messages == restored.messages
        store.put(f"k{i + 2}", "c", again.restore(fresh(tokenizer)))
    assert again.tokens == 22 + 20 * 5 and len(store) == 21  # each turn's entry stays until it expires


@pytest.mark.parametrize(
    "trouble",
    ["an id beyond 32 bits", "an integer beyond 64 bits in a tool call's arguments"],
)
def test_what_cannot_be_packed_is_not_stored(tokenizer: HFTokenizer, trouble: str) -> None:
    conversation = entry(tokenizer, 3)
    if trouble.startswith("an id"):
        conversation.transcript.append_observation([2**32])
    else:
        call = ToolCall(id="c", name="x", arguments={"n": 2**70})
        conversation.messages.append(Message(role="assistant", tool_calls=(call,)))
    store = TranscriptStore()
    assert not store.put("k", "c", conversation)
    assert len(store) == 0 and store.tokens == 0 and store.bytes == 0


def test_least_recently_used_conversations_are_evicted_first(tokenizer: HFTokenizer) -> None:
    store = TranscriptStore(max_conversations=2)
    store.put("a", "a", entry(tokenizer, 1))
    store.put("b", "b", entry(tokenizer, 1))
    a = store.take("a")
    assert a is not None
    store.put("a", "a", a.restore(fresh(tokenizer)))  # "a" is now the most recent
    store.put("c", "c", entry(tokenizer, 1))
    assert "b" not in store and "a" in store and "c" in store
    assert store.evictions == 1


def test_the_token_bound_evicts_and_refuses_what_cannot_fit(tokenizer: HFTokenizer) -> None:
    store = TranscriptStore(max_tokens=20)
    store.put("a", "a", entry(tokenizer, 8))  # 10 tokens
    store.put("b", "b", entry(tokenizer, 8))
    assert store.tokens == 20 and len(store) == 2
    store.put("c", "c", entry(tokenizer, 3))
    assert "a" not in store and store.tokens == 15
    assert not store.put("huge", "huge", entry(tokenizer, 30))
    assert "huge" not in store and store.tokens == 15
    store.put("b", "b", entry(tokenizer, 1))  # replacing an entry frees its tokens
    assert store.tokens == 8


def test_the_byte_bound_counts_what_an_entry_holds(tokenizer: HFTokenizer) -> None:
    """4 bytes an id: 1,000 more ids cost 4,000 more bytes; a data URL costs its length."""
    small = StoredConversation.pack("s", entry(tokenizer, 1))
    large = StoredConversation.pack("l", entry(tokenizer, 1001))
    assert small is not None and large is not None
    assert large.nbytes - small.nbytes == 4000
    with_image = entry(tokenizer, 1)
    url = "data:image/png;base64," + "A" * 100_000
    with_image.messages.append(Message(role="user", content="", images=(ImagePart(url=url, offset=0),)))
    packed = StoredConversation.pack("i", with_image)
    assert packed is not None and 100_000 < packed.nbytes - small.nbytes < 100_200
    store = TranscriptStore(max_bytes=3 * small.nbytes)
    for key in "abc":
        store.put(key, key, entry(tokenizer, 1))
    assert len(store) == 3 and store.bytes == 3 * small.nbytes
    store.put("d", "d", entry(tokenizer, 1))
    assert "a" not in store and len(store) == 3 and store.evictions == 1
    assert not store.put("image", "image", with_image)  # alone larger than the bound
    assert len(store) == 3


def test_a_store_of_size_zero_keeps_nothing(tokenizer: HFTokenizer) -> None:
    store = TranscriptStore(max_conversations=0)
    assert not store.put("a", "a", entry(tokenizer, 1))
    assert len(store) == 0 and store.take("a") is None
    with pytest.raises(ValueError, match="bounds"):
        TranscriptStore(max_conversations=-1)
    with pytest.raises(ValueError, match="bounds"):
        TranscriptStore(max_bytes=-1)
