"""`TurnIndex`: which stored conversation ended with the assistant turn that a tools-mode request rewrote.

A follow-up continues a stored conversation when its messages up to its last assistant turn hash to the key the
turn was stored under (`transcript_store.conversation_key`: the turn's prompt and the turn as the client got it).
A client that rewrites that last turn (cleans the final answer, fixes a tool call's arguments, mints its own
tool-call ids) misses that key. Its messages before the turn are still the turn's prompt, though, and this index
maps the prompt's key (the *turn key*) to the key the turn's conversation was stored under, so that tools mode
can roll the turn back and continue the stored ids (`Conversation.rewrite_last_turn`).

A bounded LRU of key pairs, local to one server (replicas sharing a Redis store do not share it: a rewritten turn
that reaches another replica is rendered from scratch, as before). A key it gives may name an entry the store has
dropped since; the store then answers None. One event loop uses it; it has no locks. This module knows keys only.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["TurnIndex"]


class TurnIndex:
    """At most `capacity` turn key -> store key pairs, the least recently put dropped first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"the turn index's capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._keys: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def put(self, turn_key: str, key: str) -> None:
        """Record that the turn whose prompt hashes to `turn_key` was stored under `key`."""
        if self.capacity == 0:
            return
        self._keys[turn_key] = key
        self._keys.move_to_end(turn_key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def get(self, turn_key: str) -> str | None:
        """The store key of the turn whose prompt hashes to `turn_key`, if it is known."""
        return self._keys.get(turn_key)
