"""`PieceCache`: the ids of long text pieces between added tokens, reused exactly across encodes.

Every episode of a recipe starts with the same system message and tool listing (hundreds of tokens), and
tokenizing that prompt was most of a step's cost. `tokenizers` cuts its input at added tokens (`<|im_start|>`,
`<|im_end|>`, `<tool_call>`, ...) before it normalizes and pre-tokenizes, and encodes each piece between them on
its own: so the ids of a text are the ids of its pieces and added tokens, in order, and a piece seen before can
take its ids from a cache. That holds when

- no added token strips the whitespace around it or matches only as a single word (`lstrip`, `rstrip`,
  `single_word`), which would move the cut;
- no added token is matched on normalized text while the tokenizer has a normalizer that changes text;
- the pre-tokenizer does not treat the first piece differently (a `Metaspace` that prepends to the first piece
  only, a `ByteLevel` that adds a prefix space).

`PieceCache.for_backend` checks these on the tokenizer's own configuration and gives `None` when one fails (the
tokenizer then encodes every text whole, as before). The cut is the tokenizer's own leftmost-longest match of the
added tokens' contents. A piece of at least `min_chars` characters is a part of its own; shorter pieces and the
added tokens around them form runs, which start and end at an added token (or the text's ends) and so encode on
their own as exactly as a piece does. Every part is looked up in the cache (least recently used first out, bounded
in pieces and characters) and only the missing ones are encoded: an episode's prompt encodes its new user message
alone.

Heads: the longest start of a text made only of cached parts (an episode prompt's system message and tool listing,
a served conversation's earlier turns) is kept whole, with its ids, so the next text that starts with it takes
them in one lookup instead of cutting that start into parts again. A head ends where the tokenizer cuts (at an added
token), and it is taken only when the added tokens the tokenizer finds near its end are the same in the new text
(an added token of the new text could start inside the head and end past it), so its ids are exactly that start's.

The tests compare this path with a whole encode over every family's renders and their real tokenizers.
"""

from __future__ import annotations

import json
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, NamedTuple

__all__ = ["PieceCache"]

MIN_PIECE_CHARS: Final = 8  # a shorter piece joins the run around it (a run of added tokens and short text)
MAX_PIECES: Final = 512
MAX_CHARS: Final = 4_000_000  # about 16 MB of text and 4 MB of ids at most
MIN_HEAD_CHARS: Final = 256  # a shorter start is cut into parts each time (a head saves the cutting, not the encode)
MAX_HEADS: Final = 16
MAX_HEAD_CHARS: Final = 1_000_000  # all heads together

_Part = list[int] | array[int] | str  # ids known already (a cached piece's, an added token's), or text to encode


class _Head(NamedTuple):
    """The start of an earlier text, cut where the tokenizer cuts: its ids, and the added tokens found at its end."""

    ids: list[int]  # ints shared with the list a hit copies, not an array (which would make new int objects)
    rescan_from: int  # where the tokenizer's scan restarts, far enough before the end that no token reaches past it
    spans: tuple[tuple[int, int], ...]  # the added tokens found from `rescan_from` to the end


class PieceCache:
    """Exact reuse of pieces' ids. `encode(text, encode_many)` cuts `text` at added tokens into parts (long
    pieces, and the runs between them), takes each part it has from the cache and encodes the parts it misses with
    one `encode_many`."""

    def __init__(
        self,
        added: dict[str, int],
        *,
        min_chars: int = MIN_PIECE_CHARS,
        max_pieces: int = MAX_PIECES,
        max_chars: int = MAX_CHARS,
        min_head_chars: int = MIN_HEAD_CHARS,
        max_heads: int = MAX_HEADS,
    ) -> None:
        if not added:
            raise ValueError("a piece cache needs at least one added token to cut at")
        self.added = dict(added)
        # Longest first: at the leftmost match `re` takes the first alternative, so this is leftmost-longest.
        contents = sorted(self.added, key=len, reverse=True)
        self.pattern = re.compile("|".join(re.escape(c) for c in contents))
        self.longest = len(contents[0])
        self.min_chars = min_chars
        self.max_pieces = max_pieces
        self.max_chars = max_chars
        self._pieces: OrderedDict[str, array[int]] = OrderedDict()  # 4 bytes an id, not a list of int objects
        self._chars = 0
        self.min_head_chars = min_head_chars
        self.max_heads = max_heads
        self._heads: OrderedDict[str, _Head] = OrderedDict()
        self._head_lengths: list[int] = []  # the heads' lengths, longest first
        self._lock = threading.Lock()  # long texts are encoded on worker threads
        self.hits = 0
        self.misses = 0
        self.head_hits = 0

    @classmethod
    def for_backend(cls, backend: Any, **limits: int) -> PieceCache | None:
        """A cache for a `tokenizers.Tokenizer`, or None when its pieces are not independent (module docstring)."""
        try:
            added_tokens = backend.get_added_tokens_decoder()
            normalizer = _state(backend.normalizer)
            pre_tokenizer = _state(backend.pre_tokenizer)
        except Exception:  # an older or unusual backend: no cache, every text encoded whole
            return None
        changes_text = normalizer is not None and normalizer != {"type": "Sequence", "normalizers": []}
        added: dict[str, int] = {}
        for token_id, token in added_tokens.items():
            if token.lstrip or token.rstrip or token.single_word or (token.normalized and changes_text):
                return None
            if token.content:
                added[token.content] = int(token_id)
        if not added or not _position_free(pre_tokenizer):
            return None
        return cls(added, **limits)

    def encode(self, text: str, encode_many: Callable[[list[str]], list[list[int]]]) -> list[int]:
        """The ids of `text`. `encode_many` encodes the runs and the pieces not in the cache, all in one call
        (so a tokenizer can take its batch path, which releases the GIL, for a long text)."""
        start, head_ids = self._head_of(text)
        parts: list[_Part] = []  # ids known already, or a text to encode
        starts: list[int] = []  # where each part starts in `text`
        misses: dict[int, str] = {}  # index in parts -> the piece to keep once encoded
        spans: list[tuple[int, int]] = []  # the added tokens found (where a head of this text may end)
        run_start = piece_start = start
        for match in self.pattern.finditer(text, start):
            if match.start() - piece_start >= self.min_chars:
                self._cut(text, run_start, piece_start, parts, starts, misses)
                self._take(text[piece_start : match.start()], piece_start, parts, starts, misses)
                run_start = match.start()
            piece_start = match.end()
            spans.append(match.span())
        if len(text) - piece_start >= self.min_chars:
            self._cut(text, run_start, piece_start, parts, starts, misses)
            self._take(text[piece_start:], piece_start, parts, starts, misses)
        else:
            self._cut(text, run_start, len(text), parts, starts, misses)
        texts = [(i, part) for i, part in enumerate(parts) if isinstance(part, str)]
        first_new = texts[0][0] if texts else len(parts)  # every part before it came from the cache
        encoded = encode_many([part for _, part in texts]) if texts else []
        for (i, _), ids in zip(texts, encoded, strict=True):
            parts[i] = ids
            if i in misses:
                self._keep(misses[i], ids)
        out = head_ids.copy()
        for part in parts:
            assert not isinstance(part, str)  # every text was encoded above
            out.extend(part)
        # What came from the cache ends where the tokenizer cuts: at the start of the first part that did not (an
        # added token's start or end), or at the start of the last part, or at the text's end when a token ends it.
        kept = first_new if first_new < len(parts) else len(parts) - 1
        end = starts[kept] if kept >= 0 else start
        if first_new == len(parts) and spans and spans[-1][1] == len(text):
            kept, end = len(parts), len(text)
        if end - start >= self.min_head_chars and end - self.longest >= start:
            known = len(head_ids) + sum(len(part) for part in parts[:kept])
            self._keep_head(text[:end], out[:known], spans, start)
        return out

    def clear(self) -> None:
        with self._lock:
            self._pieces.clear()
            self._chars = 0
            self._heads.clear()
            self._head_lengths = []

    def __len__(self) -> int:
        return len(self._pieces)

    def _head_of(self, text: str) -> tuple[int, list[int]]:
        """The longest kept head `text` starts with, verified: (its length, its ids), or (0, [])."""
        for length in self._head_lengths:
            if length > len(text):
                continue
            start = text[:length]
            with self._lock:
                head = self._heads.get(start)
                if head is None:
                    continue
                self._heads.move_to_end(start)
            found = []
            for match in self.pattern.finditer(text, head.rescan_from):
                if match.start() >= length:
                    break
                found.append(match.span())
            # The tokenizer finds the same added tokens near the head's end in this text, and cuts at that end:
            # an added token ends there, or one starts there.
            cut = (found and found[-1][1] == length) or self.pattern.match(text, length) is not None
            if cut and tuple(found) == head.spans:
                self.head_hits += 1
                return length, head.ids
        return 0, []

    def _keep_head(self, head: str, ids: list[int], spans: list[tuple[int, int]], scanned_from: int) -> None:
        """Keep `head` (a start of a text, ending where the tokenizer cut it) with its ids. `spans`: the added
        tokens found in the text from `scanned_from` on (at most `longest` before the head's end)."""
        end = len(head)
        rescan = end - self.longest  # no added token that starts before here reaches the head's end
        for first, last in spans:
            if first < rescan < last:
                rescan = first  # a token across that point: start at it instead
                break
        tail = tuple(span for span in spans if rescan <= span[0] < end)
        with self._lock:
            if head in self._heads or len(head) > MAX_HEAD_CHARS:
                return
            self._heads[head] = _Head(ids=ids, rescan_from=max(rescan, scanned_from), spans=tail)
            while len(self._heads) > self.max_heads or sum(len(h) for h in self._heads) > MAX_HEAD_CHARS:
                self._heads.popitem(last=False)
            self._head_lengths = sorted({len(h) for h in self._heads}, reverse=True)  # a new list: readers iterate it

    def _cut(
        self, text: str, start: int, end: int, parts: list[_Part], starts: list[int], misses: dict[int, str]
    ) -> None:
        """The run `text[start:end]` (pieces too short to cache on their own, and added tokens) as one part: an
        added token's id, or the run's cached ids (it starts and ends at an added token or the text's end, so it
        is encoded on its own as exactly as a piece is), or the run itself, to encode and keep."""
        if start >= end:
            return
        run = text[start:end]
        token_id = self.added.get(run)
        if token_id is not None:
            parts.append([token_id])
            starts.append(start)
        else:
            self._take(run, start, parts, starts, misses)

    def _take(self, piece: str, at: int, parts: list[_Part], starts: list[int], misses: dict[int, str]) -> None:
        """A piece or a run (at `at` in the text): its cached ids, or the text itself, to encode and keep."""
        starts.append(at)
        with self._lock:
            found = self._pieces.get(piece)
            if found is not None:
                self._pieces.move_to_end(piece)
                self.hits += 1
                parts.append(found)
                return
            self.misses += 1
        misses[len(parts)] = piece
        parts.append(piece)

    def _keep(self, piece: str, ids: list[int]) -> None:
        if len(piece) > self.max_chars:
            return
        with self._lock:
            if piece in self._pieces:
                return
            self._pieces[piece] = array("I", ids)
            self._chars += len(piece)
            while len(self._pieces) > self.max_pieces or self._chars > self.max_chars:
                old, _ = self._pieces.popitem(last=False)
                self._chars -= len(old)


def _state(component: Any) -> Any:
    """A normalizer's or pre-tokenizer's configuration as JSON data (None when there is none)."""
    return None if component is None else json.loads(component.__getstate__())


def _position_free(pre_tokenizer: Any) -> bool:
    """False when some part of the pre-tokenizer treats a text's first piece differently."""
    if isinstance(pre_tokenizer, list):
        return all(_position_free(part) for part in pre_tokenizer)
    if not isinstance(pre_tokenizer, dict):
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Metaspace" and pre_tokenizer.get("prepend_scheme", "always") != "never":
        return False
    if kind == "ByteLevel" and pre_tokenizer.get("add_prefix_space", False):
        return False
    return all(_position_free(value) for value in pre_tokenizer.values() if isinstance(value, (dict, list)))
