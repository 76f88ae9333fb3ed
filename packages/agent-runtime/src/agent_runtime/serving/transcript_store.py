"""`TranscriptStore`: keeps tools-mode conversations token-in-token-out across a client's requests.

In tools mode the client runs the tools and sends the whole conversation back each time. Re-rendering it would
re-tokenize text the model generated, which may not give back the ids it sampled. So after each turn the server
stores the conversation's token transcript under a key of the conversation *as the client will send it back*
(the tools, and every message up to and including the assistant turn the server produced). A follow-up whose
messages up to its last assistant turn hash to a stored key continues that transcript: only the new messages are
rendered (`ChatProtocol.render_feedback`) and tokenized, on their own. Anything else is rendered from scratch.

The key covers what the prompt is made of (roles, contents, images, tool calls with their ids and arguments,
tool-call ids and names, the tool specs) and leaves out `reasoning_content`, which clients often drop when they echo a
turn back; the stored ids keep the reasoning as it was sampled.

The store keeps the `Conversation` objects themselves, so a follow-up costs nothing per token of history: `take`
hands the stored conversation over (it leaves the store) and the request puts it back under its new key once the
model answered. A second follow-up to the same stored turn (a client that branches or retries) finds nothing and
is rendered from scratch (a `transcript_rerenders`), so no two requests ever extend one transcript. The store is a
bounded LRU: at most `max_conversations` entries and `max_tokens` token ids held (about 40 bytes each, as Python
ints in lists: the default 8M tokens is at most about 320 MB); the images a conversation's messages hold (data
URLs of megabytes) count as one token per `IMAGE_CHARS_PER_TOKEN` characters, so they are bounded by the same
budget. One event loop uses it; it has no locks. This
module knows messages and conversations only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from agent_protocol import Message, ToolSpec
from agent_runtime.conversation import Conversation

__all__ = ["IMAGE_CHARS_PER_TOKEN", "StoredConversation", "TranscriptStore", "conversation_key"]

#: the characters of image references that weigh as much in the store as one token id
IMAGE_CHARS_PER_TOKEN: Final = 40

_canonical = msgspec.json.Encoder(order="sorted")


def _message_form(message: Message) -> list[object]:
    calls = [[c.id, c.name, c.arguments] for c in message.tool_calls]
    form: list[object] = [message.role, message.content or "", calls, message.tool_call_id, message.name]
    if message.images:
        form.append([[image.url, image.offset] for image in message.images])
    return form


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
    """One stored conversation: its id (kept across turns, for logs) and the conversation itself."""

    conversation_id: str
    conversation: Conversation


class TranscriptStore:
    """A bounded LRU of conversations. `take` hands one over; `put` stores one."""

    def __init__(self, *, max_conversations: int = 1024, max_tokens: int = 8_000_000) -> None:
        if max_conversations < 0 or max_tokens < 0:
            raise ValueError("the transcript store's bounds must be >= 0 (0 disables it)")
        self.max_conversations = max_conversations
        self.max_tokens = max_tokens
        self._entries: OrderedDict[str, tuple[StoredConversation, int]] = OrderedDict()
        self.tokens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def take(self, key: str) -> StoredConversation | None:
        """The conversation stored under `key`, removed from the store (the caller now owns it)."""
        found = self._entries.pop(key, None)
        if found is None:
            return None
        entry, size = found
        self.tokens -= size
        return entry

    def put(self, key: str, entry: StoredConversation) -> None:
        conversation = entry.conversation
        image_chars = sum(len(image.url) for message in conversation.messages for image in message.images)
        size = sum(len(t) for t in conversation.segments) + image_chars // IMAGE_CHARS_PER_TOKEN
        if self.max_conversations == 0 or size > self.max_tokens:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.tokens -= old[1]
        self._entries[key] = (entry, size)
        self.tokens += size
        while len(self._entries) > self.max_conversations or self.tokens > self.max_tokens:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.tokens -= evicted
            self.evictions += 1
