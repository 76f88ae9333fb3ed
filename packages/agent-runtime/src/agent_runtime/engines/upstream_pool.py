"""`UpstreamPool`: which of several upstream servers takes an engine call, with session affinity.

An episode's first turn goes to the live upstream its key ranks first by rendezvous hashing (highest random
weight: a hash of the key and each URL), unless that upstream already has more than its share of requests in
flight (`load_factor` times the mean, at least 2), in which case the next in the key's ranking that has room takes
it; every later turn of it goes to the same upstream (its prefix cache holds the episode's transcript) for as long
as that upstream lives. The hash, not a table, decides: so every process holding such a pool over the same URLs
(the replicas of a server, a replica restarted) sends a key to the same upstream without sharing any state, and
when an upstream goes down only its own keys move. A call with no key goes to the least loaded live upstream
(fewest requests in flight, then fewest sent). An upstream that fails unreachable is marked down for `down_s`
seconds: its episodes move to another upstream and are pinned there (their prefix cache is lost, not their
transcript, which every request sends whole). A down upstream is tried again once its time is out, or at once when
no live one is left. The affinity table is an LRU of at most `max_sessions` keys, so it cannot grow without limit.

This module knows upstream URLs and counters; it knows nothing about HTTP or the wire format.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Upstream", "UpstreamPool"]


@dataclass
class Upstream:
    """One upstream server and what it has been sent."""

    url: str
    requests: int = 0  # requests sent (every attempt of every call counts once per call)
    in_flight: int = 0
    failures: int = 0  # calls that ended in an error on this upstream
    down_until: float = 0.0  # time.monotonic() before which the upstream is taken for dead

    def alive(self, now: float) -> bool:
        return now >= self.down_until


class UpstreamPool:
    """Upstreams keyed by URL, and the table pinning each session key to one (see the module docstring)."""

    def __init__(
        self, urls: Sequence[str], *, max_sessions: int = 65536, down_s: float = 5.0, load_factor: float = 1.5
    ) -> None:
        if not urls:
            raise ValueError("an upstream pool needs at least one URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"the upstream URLs repeat: {list(urls)}")
        if max_sessions < 1 or down_s < 0 or not load_factor >= 1:
            raise ValueError("max_sessions must be positive, down_s >= 0 and load_factor >= 1")
        self.upstreams = [Upstream(url) for url in urls]
        self.max_sessions = max_sessions
        self.down_s = down_s
        self.load_factor = load_factor
        self._pins: OrderedDict[str, Upstream] = OrderedDict()
        self.turns = 0  # calls answered for a session already pinned
        self.pinned_turns = 0  # ... by the upstream it was pinned to
        self.repinned = 0  # ... by another, their upstream down or failed
        self.evicted = 0  # keys dropped from the full table

    def pinned(self, key: str | None) -> Upstream | None:
        """The upstream session `key` is pinned to, if any."""
        return self._pins.get(key) if key is not None else None

    def pick(self, key: str | None, tried: Collection[Upstream] = ()) -> Upstream | None:
        """The upstream for the next call of session `key` (None: no session), skipping `tried`; None when every
        upstream was tried. Pins `key` to it."""
        now = time.monotonic()
        pinned = self.pinned(key)
        if key is not None and pinned is not None and pinned not in tried and pinned.alive(now):
            self._pins.move_to_end(key)
            return pinned
        left = [u for u in self.upstreams if u not in tried]
        if not left:
            return None
        live = [u for u in left if u.alive(now)] or sorted(left, key=lambda u: u.down_until)[:1]
        least_loaded = min(live, key=lambda u: (u.in_flight, u.requests))
        if key is None:
            return least_loaded
        room = max(2, math.ceil(self.load_factor * (sum(u.in_flight for u in live) + 1) / len(live)))
        ranked = sorted(live, key=lambda u: _weight(key, u.url), reverse=True)
        chosen = next((u for u in ranked if u.in_flight < room), least_loaded)
        self._pin(key, chosen)
        return chosen

    def failed(self, upstream: Upstream, *, unreachable: bool) -> None:
        upstream.failures += 1
        if unreachable:
            upstream.down_until = time.monotonic() + self.down_s

    def answered(self, upstream: Upstream, pinned_before: Upstream | None) -> None:
        """`upstream` answered a call of a session pinned to `pinned_before` when the call began (None: a new
        session, or none)."""
        upstream.down_until = 0.0
        if pinned_before is not None:
            self.turns += 1
            if upstream is pinned_before:
                self.pinned_turns += 1
            else:
                self.repinned += 1

    def _pin(self, key: str, upstream: Upstream) -> None:
        self._pins[key] = upstream
        self._pins.move_to_end(key)
        while len(self._pins) > self.max_sessions:
            self._pins.popitem(last=False)
            self.evicted += 1

    def stats(self) -> dict[str, Any]:
        """Per upstream: requests, in flight, failures, whether it is up; and the affinity counters (pinned
        turns / turns of sessions already pinned)."""
        now = time.monotonic()
        return {
            "upstreams": [
                {
                    "url": u.url,
                    "requests": u.requests,
                    "in_flight": u.in_flight,
                    "failures": u.failures,
                    "up": u.alive(now),
                }
                for u in self.upstreams
            ],
            "affinity": {
                "sessions": len(self._pins),
                "max_sessions": self.max_sessions,
                "evicted": self.evicted,
                "turns": self.turns,
                "pinned_turns": self.pinned_turns,
                "repinned": self.repinned,
                "ratio": self.pinned_turns / self.turns if self.turns else None,
            },
        }


def _weight(key: str, url: str) -> bytes:
    """The rendezvous weight of `url` for `key`: the same in every process (unlike `hash`, which is salted)."""
    return hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()
