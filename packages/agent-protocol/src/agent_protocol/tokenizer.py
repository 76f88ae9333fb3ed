"""Tokenizers: a thin, exact wrapper over Hugging Face `tokenizers`, and an adapter for a transformers one.

Encoding never adds special tokens (BOS/EOS): chat formats write their special tokens as text, and the
tokenizer's added-token matching turns them into their ids. This module knows nothing about chat formats.

`HFTokenizer.encode` takes tokenizers' batch path for texts of `GIL_FREE_MIN_CHARS` characters or more: the same
ids, but it releases the GIL while it works (the single-text path holds it), so a long conversation encoded on a
worker thread does not stop the other threads, an event loop's included. Texts of `PIECE_CACHE_MIN_CHARS` or more
go through a `PieceCache` (`piece_cache.py`) when the tokenizer allows it: the same ids, with the pieces between
added tokens (a recipe's system prompt and tool listing, the runs between messages) encoded once; what it does
encode goes in one call, the batch path for a long text. A shorter text of `SHORT_PIECES_MIN_CHARS` or more (a
turn's feedback: a tool result between the chat format's added tokens and fixed text) is cut at every added token,
each piece a part of its own, so only the pieces not seen before reach the tokenizer: each call to it costs about
5 us before any work (the Qwen3 tokenizer on the development machine; a 3-char piece takes 3.9 us), and a
feedback's fixed pieces (`user\n`, `assistant\n`, newlines) are the same every turn. Those pieces have a cache of
their own (`SHORT_PIECES_KEPT`), so a stream of one-off tool results never pushes a prompt's pieces out.
`bench/bench_feedback_encode.py`: a Qwen3 feedback 2.2x faster when its result was seen before, the same (0.99x)
when it is new.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import tokenizers

from agent_protocol.errors import TokenizerLoadError
from agent_protocol.images import VisionGrid
from agent_protocol.piece_cache import PieceCache

__all__ = [
    "GIL_FREE_MIN_CHARS",
    "PIECE_CACHE_MIN_CHARS",
    "SHORT_PIECES_KEPT",
    "SHORT_PIECES_MIN_CHARS",
    "HFTokenizer",
    "Tokenizer",
    "TransformersTokenizer",
    "load_tokenizer",
    "processor_vision_grid",
    "vision_grid",
]

GIL_FREE_MIN_CHARS: Final = 8192  # about 2,000 tokens: a few milliseconds of encoding
PIECE_CACHE_MIN_CHARS: Final = 512  # a shorter text (a turn's feedback) is cut at every added token (below)
SHORT_PIECES_MIN_CHARS: Final = 32  # a shorter text is encoded whole, in one call
SHORT_PIECES_KEPT: Final = 256  # the short texts' own piece cache holds this many pieces


@runtime_checkable
class Tokenizer(Protocol):
    """What the rest of the stack needs from a tokenizer."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...


class HFTokenizer:
    """A `tokenizers.Tokenizer` loaded from a `tokenizer.json`."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        source: str = "<memory>",
        piece_cache: bool = True,
        vision: VisionGrid | None = None,
    ) -> None:
        """`piece_cache=False` encodes every text whole (the cache gives the same ids; see `piece_cache.py`).
        `vision`: how the model's image processor turns an image into pad tokens (None: a text-only model)."""
        self.backend = backend
        self.source = source
        self.pieces = PieceCache.for_backend(backend) if piece_cache else None
        #: short texts' pieces, each a part of its own, kept apart so that one-off tool results never push a long
        #: text's pieces out of `pieces`
        self.short_pieces = (
            PieceCache.for_backend(backend, min_chars=1, max_pieces=SHORT_PIECES_KEPT)
            if self.pieces is not None
            else None
        )
        self.vision = vision

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizer:
        """Load a `tokenizer.json`, or the one inside a model directory, with the directory's image processor
        (`preprocessor_config.json`, see `vision_grid`) when it has one. Errors name the path."""
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        vision = vision_grid(file.parent)
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
        return cls(backend, source=str(file), vision=vision)

    def __repr__(self) -> str:
        return f"HFTokenizer({self.source!r})"

    @functools.cached_property
    def vocab_size(self) -> int:
        """Ids in the vocabulary, added tokens included. Kept: `tokenizers` builds the whole vocabulary to count it
        (about 40 ms for Qwen3's 151,669 entries), and the rollout asks once per episode."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        if self.pieces is None or len(text) < SHORT_PIECES_MIN_CHARS:
            return self._encode_whole(text)
        if len(text) < PIECE_CACHE_MIN_CHARS and self.short_pieces is not None:  # a turn's feedback (module doc)
            return self.short_pieces.encode(text, self._encode_each)
        long = len(text) >= GIL_FREE_MIN_CHARS
        return self.pieces.encode(text, self.encode_batch if long else self._encode_each)

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


def vision_grid(model_dir: str | Path) -> VisionGrid | None:
    """The image grid of a model directory's ``preprocessor_config.json`` when it describes a Qwen2-VL-style
    image processor (it has ``merge_size``), else None: the model is text-only, as far as this layer knows."""
    file = Path(model_dir) / "preprocessor_config.json"
    if not file.is_file():
        return None
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerLoadError(str(file), f"not a readable JSON file ({e})") from e
    if not isinstance(config, dict) or "merge_size" not in config:
        return None
    try:
        return VisionGrid.from_preprocessor_config(config)
    except (TypeError, ValueError) as e:
        raise TokenizerLoadError(str(file), f"not a Qwen2-VL-style image processor config ({e})") from e


class TransformersTokenizer:
    """Adapts a transformers `PreTrainedTokenizer(Fast)` to `Tokenizer` without importing transformers."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf = hf_tokenizer
        self.vision = processor_vision_grid(hf_tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        vocab = self.hf.get_vocab()
        found = vocab.get(token)
        return None if found is None else int(found)


def processor_vision_grid(processor: Any) -> VisionGrid | None:
    """The image grid of a transformers processor (one with a Qwen2-VL-style ``image_processor``), else None."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None or not hasattr(image_processor, "merge_size"):
        return None
    size = getattr(image_processor, "size", None) or {}
    config = {
        "patch_size": image_processor.patch_size,
        "merge_size": image_processor.merge_size,
        "min_pixels": getattr(image_processor, "min_pixels", None),
        "max_pixels": getattr(image_processor, "max_pixels", None),
        "size": dict(size),
    }
    return VisionGrid.from_preprocessor_config(config)


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
