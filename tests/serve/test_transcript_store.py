"""`TranscriptStore` and `conversation_key` on their own: what the key covers, handing conversations over, LRU
bounds."""

from __future__ import annotations

import pytest

from agent_protocol import HFTokenizer, Message, TokenTranscript, ToolCall, ToolSpec, get_protocol, load_tokenizer
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


def entry(tokenizer: HFTokenizer, n: int, conversation_id: str = "c") -> StoredConversation:
    """A stored conversation of n + 2 tokens: a prompt of n, then a generated turn of 2."""
    conversation = Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=16)
    transcript = TokenTranscript()
    transcript.append_prompt(list(range(n)))
    transcript.append_action([7, 8], [-0.5, -1.5])
    conversation.segments.append(transcript)
    return StoredConversation(conversation_id, conversation)


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


def test_take_hands_the_conversation_over_so_no_two_requests_extend_it(tokenizer: HFTokenizer) -> None:
    store = TranscriptStore()
    original = entry(tokenizer, 5)
    store.put("k", original)
    assert store.tokens == 7
    got = store.take("k")
    assert got is original  # no copy, no packing: a follow-up costs nothing per token of history
    assert "k" not in store and store.tokens == 0
    assert store.take("k") is None  # a second follow-up to the same turn (a branch, a retry) re-renders


def test_least_recently_used_conversations_are_evicted_first(tokenizer: HFTokenizer) -> None:
    store = TranscriptStore(max_conversations=2)
    store.put("a", entry(tokenizer, 1))
    store.put("b", entry(tokenizer, 1))
    a = store.take("a")
    assert a is not None
    store.put("a", a)  # "a" is now the most recent
    store.put("c", entry(tokenizer, 1))
    assert "b" not in store and "a" in store and "c" in store
    assert store.evictions == 1


def test_the_token_bound_evicts_and_refuses_what_cannot_fit(tokenizer: HFTokenizer) -> None:
    store = TranscriptStore(max_tokens=20)
    store.put("a", entry(tokenizer, 8))  # 10 tokens
    store.put("b", entry(tokenizer, 8))
    assert store.tokens == 20 and len(store) == 2
    store.put("c", entry(tokenizer, 3))
    assert "a" not in store and store.tokens == 15
    store.put("huge", entry(tokenizer, 30))
    assert "huge" not in store and store.tokens == 15
    store.put("b", entry(tokenizer, 1))  # replacing an entry frees its tokens
    assert store.tokens == 8


def test_a_store_of_size_zero_keeps_nothing(tokenizer: HFTokenizer) -> None:
    store = TranscriptStore(max_conversations=0)
    store.put("a", entry(tokenizer, 1))
    assert len(store) == 0 and store.take("a") is None
    with pytest.raises(ValueError, match="bounds"):
        TranscriptStore(max_conversations=-1)
