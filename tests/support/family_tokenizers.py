"""The official tokenizers of gpt-oss, Llama 3.1 and DeepSeek-V3, from the xz copies in tests/data/tokenizers
(provenance and sha256 in tests/data/tokenizers/README.md), decompressed once into `.cache/tokenizers` and
checked against the sha256 of the official file before use."""

from __future__ import annotations

import hashlib
import lzma
import os
import tempfile
from pathlib import Path
from typing import Final

from agent_protocol import HFTokenizer

DATA = Path(__file__).resolve().parent.parent / "data" / "tokenizers"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "tokenizers"

#: family -> sha256 of the official tokenizer.json
SHA256: Final = {
    "gpt_oss": "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
    "llama3.1": "e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
    "deepseek_v3": "621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41",
    # built from Meta's tiktoken ranks (PyPI llama-models), ids checked against Meta's tokenizer (README there)
    "llama4": "e5481b5dd76b22093de69f7ffefbc8243170b5d048c9de96e2e5f51e6be9bee3",
    # converted from mistral-common's SentencePiece v3 model, ids checked against mistral-common's (README there)
    "mistral_v3": "bf73086d6bfe63f4886c5131714002c0ebef51364649acc9ac420e43a98a6c96",
    "gemma3": "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
}


def tokenizer_path(family: str) -> Path:
    """The decompressed, verified `tokenizer.json` of `family` (a key of `SHA256`)."""
    expected = SHA256[family]
    target = CACHE / f"{family}.tokenizer.json"
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == expected:
        return target
    data = lzma.decompress((DATA / f"{family}.tokenizer.json.xz").read_bytes())
    found = hashlib.sha256(data).hexdigest()
    if found != expected:
        raise RuntimeError(f"{family} tokenizer.json: sha256 {found}, expected {expected}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=CACHE, delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, target)  # atomic: concurrent test workers never read half a file
    return target


def load_family_tokenizer(family: str) -> HFTokenizer:
    return HFTokenizer.from_file(tokenizer_path(family))
