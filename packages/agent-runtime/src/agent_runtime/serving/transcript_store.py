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

A conversation is stored packed (`StoredConversation.pack`): its ids as 4-byte machine integers, the logprobs of
its generated turns as 8-byte floats, its messages as one msgpack string, its counters; not its tools, protocol,
tokenizer or budgets, which the request that continues it brings (its tools hash into the key). Kept as Python
objects, a conversation held some 70 bytes per token of ints, list slots and floats, plus its messages and tool
specs decoded into dicts: several times what the store counted. Packed, a text conversation holds about 4 bytes a
token, 8 more per generated token, and its messages' msgpack (about the size of their text). Packing and
unpacking are C-speed copies, a few milliseconds per 100,000 tokens, where a re-render tokenizes all of them.

`take` hands a copy of the stored conversation over and leaves the entry for `retake_s` more seconds (300 by
default, at most its TTL), as the Redis store's ``GETEX ... PX`` does; the request puts the conversation back under
its new key once the model answered. So a follow-up sent again after its first try took the entry (the engine
failed, the client timed out) continues the same ids, and so do two follow-ups to one turn (a client that
branches); each extends its own copy, so no two requests ever extend one transcript. An entry expires `ttl_s`
after its put (3600 s by default, `--store-ttl`) or `retake_s` after its last take, whichever is set last; expired
entries are dropped lazily (a take that finds one, and a put, which drops those at the LRU's cold end), so until
then they count against the bounds like any entry. The store is a bounded LRU (a take counts as a use): at most
`max_conversations` entries, `max_tokens` token ids and `max_bytes` bytes,
counted as what an entry really holds (`StoredConversation.nbytes`: its arrays, strings and objects, images'
data URLs included, and `ENTRY_BYTES` for the entry itself); `tests/serve/test_transcript_store_memory.py`
measures a full store against it. One event loop uses it; it has no locks. This module knows messages and
conversations only.

`ConversationStore` is what tools mode asks of a store (async `atake`/`aput`, `stats`, `aclose`): this in-memory
LRU (the default; its async methods run at once, with no await inside) or `RedisTranscriptStore`
(`redis_store`), which replicas share. `dump_entry`/`load_entry` turn a packed conversation into bytes and back
for such a store (ids and logprobs as machine integers and floats: replicas sharing one must be of one byte order).
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import msgspec

from agent_protocol import ImageSpan, Message, Span, TokenTranscript, ToolSpec
from agent_runtime.conversation import Conversation

__all__ = [
    "ENTRY_BYTES",
    "ConversationStore",
    "StoreUnavailable",
    "StoredConversation",
    "TranscriptStore",
    "conversation_key",
    "dump_entry",
    "load_entry",
    "turn_keys",
]

#: what one entry costs besides what it packs: the entry and its segments' objects, the key, the LRU's node
ENTRY_BYTES: Final = 1024

_canonical = msgspec.json.Encoder(order="sorted")
_pack_message = msgspec.msgpack.Encoder()
_unpack_messages = msgspec.msgpack.Decoder(list[Message])


def _array_header(length: int) -> bytes:
    """The msgpack header of an array of `length` items."""
    if length < 16:
        return bytes([0x90 | length])
    if length < 2**16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


def _message_form(message: Message) -> list[object]:
    calls = [[c.id, c.name, c.arguments] for c in message.tool_calls]
    form: list[object] = [message.role, message.content or "", calls, message.tool_call_id, message.name]
    if message.images:
        form.append([[image.url, image.offset] for image in message.images])
    return form


def conversation_key(tools: Sequence[ToolSpec], messages: Sequence[Message]) -> str:
    """The store key of a conversation: a hash of its tools and messages (reasoning left out)."""
    return _digest(tools, messages).hexdigest()


def turn_keys(tools: Sequence[ToolSpec], prompt: Sequence[Message], turn: Message) -> tuple[str, str]:
    """`conversation_key` of `prompt` and of `prompt` followed by `turn`, hashing `prompt` once for both."""
    digest = _digest(tools, prompt)
    with_turn = digest.copy()
    _add_message(with_turn, turn)
    return digest.hexdigest(), with_turn.hexdigest()


def _digest(tools: Sequence[ToolSpec], messages: Sequence[Message]) -> hashlib.blake2b:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(_canonical.encode([[t.name, t.description, t.parameters] for t in tools]))
    for message in messages:
        _add_message(digest, message)
    return digest


def _add_message(digest: hashlib.blake2b, message: Message) -> None:
    digest.update(b"\x1e")
    digest.update(_canonical.encode(_message_form(message)))


@dataclass(frozen=True, slots=True)
class _Segment:
    """One `TokenTranscript`, packed. Its loss mask and the logprobs of its prompt and observations (0 and None
    on every token, as `TokenTranscript` appends them) are not stored but rebuilt from its spans."""

    ids: array.array[int]
    #: the logprobs of the action spans that have them, in order
    logprobs: array.array[float]
    spans: tuple[Span, ...]
    #: per span: whether its logprobs are in `logprobs` (an action the engine gave logprobs for)
    with_logprobs: bytes
    images: tuple[ImageSpan, ...]

    @classmethod
    def pack(cls, transcript: TokenTranscript, previous: _Segment | None = None) -> _Segment:
        """`transcript` packed. When it is `previous` unpacked and appended to, only what was appended is packed:
        `previous`'s arrays are extended in place (the caller gives it up). Raises `OverflowError` for an id
        beyond 32 bits, `TypeError` for a logprob that is not a float."""
        spans = transcript.spans
        if previous is not None and tuple(spans[: len(previous.spans)]) == previous.spans:
            # spans are only appended: an equal prefix of spans is one of ids too
            ids, logprobs, flags = previous.ids, previous.logprobs, bytearray(previous.with_logprobs)
            ids.extend(transcript.ids[len(ids) :])
            packed = len(previous.spans)
        else:
            ids, logprobs, flags = array.array("i", transcript.ids), array.array("d"), bytearray()
            packed = 0
        for span in spans[packed:]:
            values = transcript.logprobs[span.start : span.end]
            has = span.kind == "action" and bool(values) and values[0] is not None
            if has:
                logprobs.extend(values)  # type: ignore[arg-type]  # all floats: an action has logprobs for all or none
            flags.append(has)
        return cls(ids=ids, logprobs=logprobs, spans=tuple(spans), with_logprobs=bytes(flags),
                   images=tuple(transcript.images))  # fmt: skip

    def copy(self) -> _Segment:
        """This segment with arrays of its own (a C copy), which `pack` may then extend in place."""
        return _Segment(array.array("i", self.ids), array.array("d", self.logprobs), self.spans, self.with_logprobs,
                        self.images)  # fmt: skip

    def unpack(self) -> TokenTranscript:
        transcript = TokenTranscript()
        transcript.ids = self.ids.tolist()
        mask: list[int] = []
        logprobs: list[float | None] = []
        taken = 0
        for span, has in zip(self.spans, self.with_logprobs, strict=True):
            count = span.end - span.start
            mask += [1 if span.kind == "action" else 0] * count
            if has:
                logprobs += self.logprobs[taken : taken + count].tolist()
                taken += count
            else:
                logprobs += [None] * count
        transcript.loss_mask, transcript.logprobs = mask, logprobs
        transcript.spans, transcript.images = list(self.spans), list(self.images)
        return transcript

    def nbytes(self) -> int:
        size = sys.getsizeof
        held = size(self.ids) + size(self.logprobs) + size(self.spans) + size(self.with_logprobs)
        held += sum(size(span) for span in self.spans)
        held += size(self.images) + sum(size(image) + size(image.source) for image in self.images)
        return held


@dataclass(frozen=True, slots=True)
class StoredConversation:
    """One stored conversation, packed: its id (kept across turns, for logs), its token transcript, messages and
    counters. `restore` puts them into a new `Conversation` built for the request that continues it."""

    conversation_id: str
    segments: tuple[_Segment, ...]
    #: the messages' msgpack encodings, one after the other (a msgpack array without its header)
    messages: bytes
    message_count: int
    turns: int
    generations: int
    turn_closed: bool
    ended_by: str | None
    render_s: float
    #: the token ids it holds
    tokens: int
    #: the bytes it holds
    nbytes: int

    @classmethod
    def pack(
        cls, conversation_id: str, conversation: Conversation, previous: StoredConversation | None = None
    ) -> StoredConversation | None:
        """`conversation` packed; None when it cannot be (an id beyond 32 bits, an integer in a tool call's
        arguments beyond 64 bits): its follow-up is rendered from scratch. `previous`: the entry it was restored
        from (`take` handed it over); then only what the conversation gained since is packed, into `previous`'s
        arrays (a follow-up costs O(its new tokens) here, not O(the history))."""
        segments = conversation.segments
        olds: Sequence[_Segment | None] = [None] * len(segments)
        messages, count = b"", 0
        if previous is not None and len(previous.segments) == len(segments):
            olds = previous.segments
            if len(conversation.messages) >= previous.message_count:
                messages, count = previous.messages, previous.message_count
        try:
            packed = tuple(_Segment.pack(t, old) for t, old in zip(segments, olds, strict=True))
            # `join` makes one bytes of exactly its length (`encode` leaves room to spare allocated)
            messages = b"".join([messages, *(_pack_message.encode(m) for m in conversation.messages[count:])])
        except (OverflowError, TypeError, msgspec.EncodeError):
            return None
        held = ENTRY_BYTES + sys.getsizeof(messages) + sys.getsizeof(conversation_id)
        held += sys.getsizeof(packed) + sum(segment.nbytes() for segment in packed)
        return cls(
            conversation_id=conversation_id,
            segments=packed,
            messages=messages,
            message_count=len(conversation.messages),
            turns=conversation.turns,
            generations=conversation.generations,
            turn_closed=conversation.turn_closed,
            ended_by=conversation.ended_by,
            render_s=conversation.render_s,
            tokens=sum(len(segment.ids) for segment in packed),
            nbytes=held,
        )

    def copy(self) -> StoredConversation:
        """This entry with arrays of its own: what a take hands over while the entry stays stored."""
        return dataclasses.replace(self, segments=tuple(segment.copy() for segment in self.segments))

    def restore(self, conversation: Conversation) -> Conversation:
        """Give `conversation` (new, with the tools, budgets and error record of the request that continues this
        one) this one's transcript, messages and counters."""
        conversation.restore(
            [segment.unpack() for segment in self.segments],
            _unpack_messages.decode(_array_header(self.message_count) + self.messages),
            turns=self.turns,
            generations=self.generations,
            turn_closed=self.turn_closed,
            ended_by=self.ended_by,
            render_s=self.render_s,
        )
        return conversation


class StoreUnavailable(RuntimeError):
    """The store could not be reached or answered wrongly; the message says why. A take that raises it is a
    follow-up rendered from scratch (`transcript_rerenders`, reason ``store_unavailable``), a put a turn not kept."""


class ConversationStore(Protocol):
    """What tools mode asks of a transcript store. `atake` hands a copy of a conversation over and leaves the entry
    for a while (`retake_s`: every take of it meanwhile gets it too); `aput` stores one (False: refused, e.g. over
    a bound). Both raise `StoreUnavailable` when the store cannot be reached. `stats` is what ``/metrics`` shows of
    it."""

    async def atake(self, key: str) -> StoredConversation | None: ...

    async def aput(
        self, key: str, conversation_id: str, conversation: Conversation, previous: StoredConversation | None = None
    ) -> bool: ...

    def stats(self) -> dict[str, object]: ...

    async def aclose(self) -> None: ...


class _WireSegment(msgspec.Struct, array_like=True):
    ids: bytes
    logprobs: bytes
    spans: tuple[Span, ...]
    with_logprobs: bytes
    images: tuple[ImageSpan, ...]


class _WireEntry(msgspec.Struct, array_like=True):
    conversation_id: str
    segments: tuple[_WireSegment, ...]
    messages: bytes
    message_count: int
    turns: int
    generations: int
    turn_closed: bool
    ended_by: str | None
    render_s: float
    tokens: int
    nbytes: int


_dump_wire = msgspec.msgpack.Encoder()
_load_wire = msgspec.msgpack.Decoder(_WireEntry)


def dump_entry(entry: StoredConversation) -> bytes:
    """`entry` as bytes (msgpack; its arrays as their machine bytes)."""
    segments = tuple(
        _WireSegment(s.ids.tobytes(), s.logprobs.tobytes(), s.spans, s.with_logprobs, s.images) for s in entry.segments
    )
    return _dump_wire.encode(
        _WireEntry(entry.conversation_id, segments, entry.messages, entry.message_count, entry.turns,
                   entry.generations, entry.turn_closed, entry.ended_by, entry.render_s, entry.tokens, entry.nbytes)
    )  # fmt: skip


def load_entry(data: bytes) -> StoredConversation:
    """The entry `dump_entry` gave `data` for. Raises `msgspec.DecodeError` (or `ValueError`) for other bytes."""
    wire = _load_wire.decode(data)
    segments = []
    for s in wire.segments:
        ids, logprobs = array.array("i"), array.array("d")
        ids.frombytes(s.ids)
        logprobs.frombytes(s.logprobs)
        segments.append(_Segment(ids, logprobs, s.spans, s.with_logprobs, s.images))
    return StoredConversation(
        conversation_id=wire.conversation_id,
        segments=tuple(segments),
        messages=wire.messages,
        message_count=wire.message_count,
        turns=wire.turns,
        generations=wire.generations,
        turn_closed=wire.turn_closed,
        ended_by=wire.ended_by,
        render_s=wire.render_s,
        tokens=wire.tokens,
        nbytes=wire.nbytes,
    )


class TranscriptStore:
    """A bounded LRU of packed conversations, each with an expiry. `take` hands a copy of one over; `put` stores
    one. `clock` (seconds, monotonic) is what expiries are measured on."""

    def __init__(
        self,
        *,
        max_conversations: int = 1024,
        max_tokens: int = 8_000_000,
        max_bytes: int = 256 * 2**20,
        ttl_s: float = 3600.0,
        retake_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_conversations < 0 or max_tokens < 0 or max_bytes < 0:
            raise ValueError("the transcript store's bounds must be >= 0 (0 disables it)")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        if not retake_s > 0:
            raise ValueError(f"retake_s must be positive, got {retake_s}")
        self.max_conversations = max_conversations
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self.ttl_s, self.retake_s = ttl_s, min(ttl_s, retake_s)
        self._clock = clock
        #: key -> (when it expires, on `clock`; the entry), least recently used first
        self._entries: OrderedDict[str, tuple[float, StoredConversation]] = OrderedDict()
        self.tokens = 0
        self.bytes = 0
        self.evictions = 0
        self.expired = 0

    def __len__(self) -> int:
        """The entries held, expired ones not yet dropped included."""
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        held = self._entries.get(key)
        return held is not None and held[0] > self._clock()

    def take(self, key: str) -> StoredConversation | None:
        """A copy of the conversation stored under `key` (the caller owns it), which stays stored for `retake_s`
        more seconds; None when there is none or it expired (then it is dropped)."""
        held = self._entries.get(key)
        if held is None:
            return None
        now = self._clock()
        expires, entry = held
        if expires <= now:
            self._drop(key)
            self.expired += 1
            return None
        self._entries[key] = (now + self.retake_s, entry)
        self._entries.move_to_end(key)
        return entry.copy()

    def _drop(self, key: str) -> None:
        held = self._entries.pop(key, None)
        if held is not None:
            self.tokens -= held[1].tokens
            self.bytes -= held[1].nbytes

    def put(
        self, key: str, conversation_id: str, conversation: Conversation, previous: StoredConversation | None = None
    ) -> bool:
        """Store `conversation` packed under `key` for `ttl_s`, dropping expired entries at the LRU's cold end and
        evicting the least recently used ones to make room; `previous` is what `take` handed over, if any (see
        `StoredConversation.pack`). False when it is not stored: the store is disabled, it exceeds a bound alone,
        or it cannot be packed."""
        if self.max_conversations == 0:
            return False
        entry = StoredConversation.pack(conversation_id, conversation, previous)
        if entry is None or entry.tokens > self.max_tokens or entry.nbytes > self.max_bytes:
            return False
        now = self._clock()
        self._drop(key)  # replacing an entry frees what it held
        while self._entries:
            oldest, (expires, _) = next(iter(self._entries.items()))
            if expires > now:
                break
            self._drop(oldest)
            self.expired += 1
        self._entries[key] = (now + self.ttl_s, entry)
        self.tokens += entry.tokens
        self.bytes += entry.nbytes
        while (
            len(self._entries) > self.max_conversations or self.tokens > self.max_tokens or self.bytes > self.max_bytes
        ):
            _, (_, evicted) = self._entries.popitem(last=False)
            self.tokens -= evicted.tokens
            self.bytes -= evicted.nbytes
            self.evictions += 1
        return True

    # -- the `ConversationStore` interface: the methods above, at once (nothing to wait for) ------------------

    async def atake(self, key: str) -> StoredConversation | None:
        return self.take(key)

    async def aput(
        self, key: str, conversation_id: str, conversation: Conversation, previous: StoredConversation | None = None
    ) -> bool:
        return self.put(key, conversation_id, conversation, previous)

    def stats(self) -> dict[str, object]:
        return {
            "kind": "memory",
            "state": "ok",
            "conversations": len(self),
            "tokens": self.tokens,
            "bytes": self.bytes,
            "evictions": self.evictions,
            "expired": self.expired,
            "ttl_s": self.ttl_s,
            "retake_s": self.retake_s,
            "max_conversations": self.max_conversations,
            "max_tokens": self.max_tokens,
            "max_bytes": self.max_bytes,
        }

    async def aclose(self) -> None:
        self._entries.clear()
        self.tokens = self.bytes = 0
