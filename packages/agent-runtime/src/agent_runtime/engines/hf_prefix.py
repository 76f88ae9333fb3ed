"""`PrefixCache`: the finished sequences whose keys and values `HFEngine` keeps so a later request that extends one
prefills only the rest (see `hf.py`'s module docstring for when it is used and dropped). Least recently used
first, bounded in sequences and tokens. This module holds the bookkeeping only; the engine lays the kept tensors
into a batch's KV cache."""

from __future__ import annotations

import array
import collections
from dataclasses import dataclass

import torch

__all__ = ["Prefix", "PrefixCache"]


@dataclass(eq=False, slots=True)
class Prefix:
    """A finished sequence's keys and values: `ids` are its prompt and all its generated ids but the last; `keys`
    and `values` hold one `[1, kv_heads, len(ids), head_dim]` tensor per layer."""

    ids: array.array[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class PrefixCache:
    """The kept sequences of an `HFEngine`, least recently used first, within `max_sequences` sequences and
    `max_tokens` tokens. Only the engine's worker thread touches it; `hits`, `misses` and `reused_tokens` count
    the requests that continued from a kept prefix, those that did not, and the prompt ids they did not prefill."""

    def __init__(self, *, max_sequences: int, max_tokens: int) -> None:
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.tokens = 0
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0
        self._entries: collections.OrderedDict[Prefix, None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def longest_prefix(self, prompt: array.array[int]) -> Prefix | None:
        """The longest kept sequence that `prompt` starts with (marked as just used), or None."""
        best = self._longest(prompt)
        if best is None:
            self.misses += 1
        else:
            self._entries.move_to_end(best)
            self.hits += 1
        return best

    def reusable(self, prompt: array.array[int]) -> int:
        """How many ids of `prompt` its longest kept prefix holds (0: none), without marking or counting it: what a
        batch about to form looks at (`HFEngine`'s `max_batch_tokens`)."""
        best = self._longest(prompt)
        return 0 if best is None else len(best.ids)

    def _longest(self, prompt: array.array[int]) -> Prefix | None:
        best: Prefix | None = None
        size = len(prompt)
        for entry in self._entries:
            n = len(entry.ids)
            # cheap rejections first: too long, shorter than the best so far, a different last id
            if n > size or (best is not None and n <= len(best.ids)) or prompt[n - 1] != entry.ids[-1]:
                continue
            if prompt[:n] == entry.ids:  # one memcmp-like comparison of two int64 buffers
                best = entry
        return best

    def add(self, entry: Prefix, *, extends: Prefix | None) -> None:
        """Keep `entry`, drop `extends` (the kept prefix it grew from), then evict down to the bounds."""
        if extends is not None and extends in self._entries:
            self._drop(extends)
        if len(entry.ids) > self.max_tokens or self.max_sequences == 0:
            return
        self._entries[entry] = None
        self.tokens += len(entry.ids)
        while len(self._entries) > self.max_sequences or self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def _drop(self, entry: Prefix) -> None:
        del self._entries[entry]
        self.tokens -= len(entry.ids)
