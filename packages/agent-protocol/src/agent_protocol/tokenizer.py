"""Tokenizers: a thin, exact wrapper over Hugging Face `tokenizers`, and an adapter for a transformers one.

Encoding never adds special tokens (BOS/EOS): chat formats write their special tokens as text, and the
tokenizer's added-token matching turns them into their ids. This module knows nothing about chat formats.

`HFTokenizer.encode` takes tokenizers' batch path for texts of `GIL_FREE_MIN_CHARS` characters or more: the same
ids, but it releases the GIL while it works (the single-text path holds it), so a long conversation encoded on a
worker thread does not stop the other threads, an event loop's included. Texts of `PIECE_CACHE_MIN_CHARS` or more
go through a `PieceCache` (`piece_cache.py`) when the tokenizer allows it: the same ids, with long pieces between
added tokens (a recipe's system prompt and tool listing) encoded once; what it does encode goes in one call, the
batch path for a long text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import tokenizers

from agent_protocol.errors import TokenizerLoadError
from agent_protocol.piece_cache import MIN_PIECE_CHARS, PieceCache

__all__ = [
    "GIL_FREE_MIN_CHARS",
    "PIECE_CACHE_MIN_CHARS",
    "HFTokenizer",
    "Tokenizer",
    "TransformersTokenizer",
    "load_tokenizer",
]

GIL_FREE_MIN_CHARS: Final = 8192  # about 2,000 tokens: a few milliseconds of encoding
PIECE_CACHE_MIN_CHARS: Final = 2 * MIN_PIECE_CHARS  # a shorter text is encoded whole: nothing long to reuse


@runtime_checkable
class Tokenizer(Protocol):
    """What the rest of the stack needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


class HFTokenizer:
    """A `tokenizers.Tokenizer` loaded from a `tokenizer.json`."""

    def __init__(self, backend: tokenizers.Tokenizer, *, source: str = "<memory>", piece_cache: bool = True) -> None:
        """`piece_cache=False` encodes every text whole (the cache gives the same ids; see `piece_cache.py`)."""
        self.backend = backend
        self.source = source
        self.pieces = PieceCache.for_backend(backend) if piece_cache else None

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizer:
        """Load a `tokenizer.json`, or the one inside a model directory. Errors name the path."""
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise TokenizerLoadError(str(file), "no such file")
        try:
            text = file.read_text(encoding="utf-8")
            json.loads(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerLoadError(str(file), f"not a readable JSON file ({e})") from e
        try:
            backend = tokenizers.Tokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a bare Exception on a malformed spec
            raise TokenizerLoadError(str(file), f"not a valid tokenizer.json ({e})") from e
        return cls(backend, source=str(file))

    def __repr__(self) -> str:
        return f"HFTokenizer({self.source!r})"

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        if self.pieces is not None and len(text) >= PIECE_CACHE_MIN_CHARS:
            long = len(text) >= GIL_FREE_MIN_CHARS
            return self.pieces.encode(text, self.encode_batch if long else self._encode_each)
        return self._encode_whole(text)

    def _encode_each(self, texts: list[str]) -> list[list[int]]:
        return [list(self.backend.encode(text, add_special_tokens=False).ids) for text in texts]

    def _encode_whole(self, text: str) -> list[int]:
        if len(text) >= GIL_FREE_MIN_CHARS:  # the batch path releases the GIL (see the module docstring)
            return list(self.backend.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        found = self.backend.token_to_id(token)
        return None if found is None else int(found)


class TransformersTokenizer:
    """Adapts a transformers `PreTrainedTokenizer(Fast)` to `Tokenizer` without importing transformers."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf = hf_tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        vocab = self.hf.get_vocab()
        found = vocab.get(token)
        return None if found is None else int(found)


def load_tokenizer(source: str | Path | Any) -> Tokenizer:
    """A path (file or model directory) gives an `HFTokenizer`; a transformers tokenizer is adapted; an
    object that already satisfies `Tokenizer` is returned as is."""
    if isinstance(source, (str, Path)):
        return HFTokenizer.from_file(source)
    if isinstance(source, Tokenizer):
        return source
    if hasattr(source, "encode") and hasattr(source, "get_vocab"):
        return TransformersTokenizer(source)
    raise TypeError(f"cannot use {type(source).__name__} as a tokenizer")
