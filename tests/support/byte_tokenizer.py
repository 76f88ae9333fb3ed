"""A byte-level tokenizer for families whose official tokenizer is not in the repository (GLM-4.5, Mistral): BPE
over the 256 byte symbols with no merges (every byte one id), plus the family's special tokens as added tokens.

Its ids round-trip any text exactly, and `encode(a + b) == encode(a) + encode(b)` whenever the cut is not
inside a special token, so a transcript that equals the official render as text equals its tokenization too,
and any seam shows up. A real BPE would only change how the same text is cut.
"""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from agent_protocol import HFTokenizer

__all__ = ["byte_level_tokenizer"]


def byte_level_tokenizer(special_tokens: Sequence[str], *, source: str) -> HFTokenizer:
    """Byte symbols 0-255 (in ByteLevel's alphabet order), then `special_tokens` in order."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in special_tokens])
    return HFTokenizer(backend, source=source)
