"""`RedisTranscriptStore`: the tools-mode transcript store kept in Redis, so replicas continue each other's
conversations token-exactly.

Each entry is one Redis string under ``<prefix><key>``: the packed conversation (`StoredConversation.pack`) as
bytes (`dump_entry`), written with a TTL (`SET ... PX`). `atake` is ``GETEX ... PX retake_s`` (Redis >= 6.2): it
reads the entry and leaves it for `retake_s` more seconds (at most its TTL), instead of deleting it. So a follow-up
whose request failed after it took the entry (its replica killed, the engine down, the client gone) and is sent
again continues the same ids, on any replica, instead of being re-rendered; two follow-ups to one turn (branches)
each continue it; and the entry is gone `retake_s` after its last take, so a long conversation does not keep every
turn's entry for the whole TTL. The entries are copies: nothing taken is shared between requests. Bounds: an entry over
`max_entry_tokens` tokens or `max_entry_bytes` bytes (its packed bytes) is refused (not stored, counted); how much
Redis holds in all is Redis's own ``maxmemory`` (with ``volatile-lru`` or ``allkeys-lru`` it evicts like the
in-memory store). Every command has a timeout; a Redis that is down, slow or answering garbage raises
`StoreUnavailable` (the caller re-renders or skips the put, and counts it) and never gives a wrong transcript.
redis-py (the ``agent-runtime[redis]`` extra) is imported only when such a store is made.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import msgspec
import structlog

from agent_runtime.conversation import Conversation
from agent_runtime.serving.transcript_store import StoredConversation, StoreUnavailable, dump_entry, load_entry

if TYPE_CHECKING:
    import redis.asyncio

__all__ = ["DEFAULT_PREFIX", "RedisTranscriptStore", "check_store", "check_store_url"]

logger = structlog.get_logger(__name__)

DEFAULT_PREFIX: Final = "agent-serve:transcript:"


def check_store_url(url: str) -> str:
    """`url` if it names a Redis database (``redis://HOST:PORT/DB``, ``rediss://`` for TLS, ``unix:///path``);
    raises `ValueError` saying what is wrong otherwise. Only parses: nothing is connected."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"store {url!r}: expected 'memory' or redis://HOST:PORT/DB (rediss:// or unix:// too)")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"store {url!r}: bad port ({e})") from None
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"store {url!r}: a unix:// URL needs the socket's path")
        return url
    if not parts.hostname:
        raise ValueError(f"store {url!r}: no host")
    del port
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"store {url!r}: the database ({db!r}) must be a number")
    return url


async def check_store(url: str, *, timeout_s: float = 2.0) -> None:
    """Check that the store `url` names can be used before a server starts on it: ``memory`` always can; a Redis
    URL must parse, redis-py must be installed and Redis must answer PING within `timeout_s`. Raises `ValueError`
    (the URL, redis-py) or `StoreUnavailable` (Redis), each saying what is wrong; `apps/serve` calls it before it
    loads an engine or starts Ray, so one process and `--replicas` fail at once with the same message."""
    if url == "memory":
        return
    store = RedisTranscriptStore(url, timeout_s=timeout_s)
    try:
        await store.ping()
    finally:
        await store.aclose()


class RedisTranscriptStore:
    """A `ConversationStore` in Redis at `url`. `timeout_s` bounds every command and connection."""

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float = 3600.0,
        max_entry_tokens: int = 8_000_000,
        max_entry_bytes: int = 256 * 2**20,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = 2.0,
        retake_s: float = 300.0,
    ) -> None:
        check_store_url(url)
        if not retake_s > 0:
            raise ValueError(f"retake_s must be positive, got {retake_s}")
        try:
            import redis
            import redis.asyncio as aioredis
        except ImportError as e:  # pragma: no cover - the extra is in the dev group
            raise ValueError("--store redis://... needs redis-py: install agent-runtime[redis]") from e
        parts = urlsplit(url)
        self.shown_url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()  # no password in logs
        self.url, self.ttl_ms, self.prefix = url, max(1, int(ttl_s * 1000)), prefix
        self.retake_ms = min(self.ttl_ms, max(1, int(retake_s * 1000)))
        self.max_entry_tokens, self.max_entry_bytes = max_entry_tokens, max_entry_bytes
        self._redis: redis.asyncio.Redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError, TimeoutError)
        self.takes = self.hits = self.puts = self.refused = self.failures = 0
        self.state = "unchecked"
        self.last_error: str | None = None
        self._last_error_at = 0.0

    def _failed(self, what: str, error: BaseException) -> StoreUnavailable:
        self.failures += 1
        self.state, self.last_error, self._last_error_at = "unavailable", f"{what}: {error}", time.time()
        return StoreUnavailable(f"redis store at {self.shown_url}: {what} failed: {type(error).__name__}: {error}")

    async def ping(self) -> None:
        """Check that Redis answers; raises `StoreUnavailable` saying why not (used at startup)."""
        try:
            await self._redis.ping()
        except self._errors as e:
            raise self._failed("ping", e) from None
        self.state = "ok"

    async def atake(self, key: str) -> StoredConversation | None:
        self.takes += 1
        try:
            data: Any = await self._redis.getex(self.prefix + key, px=self.retake_ms)
        except self._errors as e:
            raise self._failed("take", e) from None
        self.state = "ok"
        if data is None:
            return None
        try:
            entry = load_entry(data)
        except (msgspec.DecodeError, ValueError, TypeError) as e:
            raise self._failed(f"reading the entry under {key}", e) from None
        self.hits += 1
        return entry

    async def aput(
        self, key: str, conversation_id: str, conversation: Conversation, previous: StoredConversation | None = None
    ) -> bool:
        entry = StoredConversation.pack(conversation_id, conversation, previous)
        if entry is None or entry.tokens > self.max_entry_tokens:
            self.refused += 1
            return False
        data = dump_entry(entry)
        if len(data) > self.max_entry_bytes:
            self.refused += 1
            return False
        try:
            await self._redis.set(self.prefix + key, data, px=self.ttl_ms)
        except self._errors as e:
            raise self._failed("put", e) from None
        self.state = "ok"
        self.puts += 1
        return True

    def stats(self) -> dict[str, object]:
        return {
            "kind": "redis",
            "url": self.shown_url,
            "state": self.state,
            "last_error": self.last_error,
            "ttl_s": self.ttl_ms / 1000,
            "retake_s": self.retake_ms / 1000,
            "max_entry_tokens": self.max_entry_tokens,
            "max_entry_bytes": self.max_entry_bytes,
            "takes": self.takes,
            "hits": self.hits,
            "puts": self.puts,
            "refused": self.refused,
            "failures": self.failures,
        }

    async def aclose(self) -> None:
        await self._redis.aclose()
