"""`TranscriptStore`: keeps tools-mode conversations token-in-token-out across a client's requests.

In tools mode the client runs the tools and sends the whole conversation back each time. Re-rendering it would
re-tokenize text the model generated, which may not give back the ids it sampled. So after each turn the server
stores the conversation's token transcript under a key of the conversation *as the client will send it back*
(the tools, and every message up to and including the assistant turn the server produced). A follow-up whose
messages up to its last assistant turn hash to a stored key continues that transcript: only the new messages are
rendered (`ChatProtocol.render_feedback`) and tokenized, on their own. Anything else is rendered from scratch.

The key covers what the prompt is made of (roles, contents, tool calls with their ids and arguments, tool-call
ids and names, the tool specs) and leaves out `reasoning_content`, which clients often drop when they echo a
turn back; the stored ids keep the reasoning as it was sampled.

The store is a bounded LRU: at most `max_conversations` entries and `max_tokens` stored token ids; ids are kept
packed (4 bytes each). One event loop uses it; it has no locks. This module knows messages and transcripts only.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from agent_protocol import Message, Span, TokenTranscript, ToolSpec

__all__ = ["StoredConversation", "TranscriptStore", "conversation_key"]

_canonical = msgspec.json.Encoder(order="sorted")


def _message_form(message: Message) -> list[object]:
    calls = [[c.id, c.name, c.arguments] for c in message.tool_calls]
    return [message.role, message.content or "", calls, message.tool_call_id, message.name]


def conversation_key(tools: Sequence[ToolSpec], messages: Sequence[Message]) -> str:
    """The store key of a conversation: a hash of its tools and messages (reasoning left out)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(_canonical.encode([[t.name, t.description, t.parameters] for t in tools]))
    for message in messages:
        digest.update(b"\x1e")
        digest.update(_canonical.encode(_message_form(message)))
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class StoredConversation:
    """One stored conversation: its id (kept across turns, for logs), the transcript, whether its last assistant
    turn closed itself (ended with the end-of-turn token) and how many assistant turns it holds."""

    conversation_id: str
    transcript: TokenTranscript
    turn_closed: bool
    turns: int


@dataclass(frozen=True, slots=True)
class _Packed:
    conversation_id: str
    ids: array[int]
    loss_mask: bytes
    logprobs: array[float]  # NaN where there was none
    spans: tuple[Span, ...]
    turn_closed: bool
    turns: int

    @classmethod
    def pack(cls, entry: StoredConversation) -> _Packed:
        t = entry.transcript
        return cls(
            conversation_id=entry.conversation_id,
            ids=array("i", t.ids),
            loss_mask=bytes(t.loss_mask),
            logprobs=array("d", (math.nan if lp is None else lp for lp in t.logprobs)),
            spans=tuple(t.spans),
            turn_closed=entry.turn_closed,
            turns=entry.turns,
        )

    def unpack(self) -> StoredConversation:
        transcript = TokenTranscript()
        transcript.ids = self.ids.tolist()
        transcript.loss_mask = list(self.loss_mask)
        transcript.logprobs = [None if math.isnan(lp) else lp for lp in self.logprobs]
        transcript.spans = list(self.spans)
        return StoredConversation(
            conversation_id=self.conversation_id, transcript=transcript, turn_closed=self.turn_closed, turns=self.turns
        )


class TranscriptStore:
    """A bounded LRU of conversation transcripts. `get` hands out a copy, so stored entries never change."""

    def __init__(self, *, max_conversations: int = 1024, max_tokens: int = 8_000_000) -> None:
        if max_conversations < 0 or max_tokens < 0:
            raise ValueError("the transcript store's bounds must be >= 0 (0 disables it)")
        self.max_conversations = max_conversations
        self.max_tokens = max_tokens
        self._entries: OrderedDict[str, _Packed] = OrderedDict()
        self.tokens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> StoredConversation | None:
        packed = self._entries.get(key)
        if packed is None:
            return None
        self._entries.move_to_end(key)
        return packed.unpack()

    def put(self, key: str, entry: StoredConversation) -> None:
        size = len(entry.transcript)
        if self.max_conversations == 0 or size > self.max_tokens:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.tokens -= len(old.ids)
        self._entries[key] = _Packed.pack(entry)
        self.tokens += size
        while len(self._entries) > self.max_conversations or self.tokens > self.max_tokens:
            _, evicted = self._entries.popitem(last=False)
            self.tokens -= len(evicted.ids)
            self.evictions += 1
