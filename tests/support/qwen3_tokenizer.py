"""Offline, byte-exact rebuild of the official Qwen3 ``tokenizer.json`` for tests.

The Hugging Face ``tokenizer.json`` of Qwen3 cannot be downloaded in CI, but everything it contains is
derivable from data on PyPI: the ``dashscope==2.0.2`` wheel (a dev dependency of this workspace) ships
``dashscope/resources/qwen.tiktoken``, Qwen's 151,643 byte-level BPE ranks as lines of
``<base64 token> <rank>``. From those ranks this module rebuilds the file exactly:

* vocab: token bytes mapped through the GPT-2 byte-to-unicode alphabet, id = rank;
* merges: the tiktoken ranks are a BPE merge order, so each multi-byte token of rank ``r`` splits into
  exactly two lower-ranked tokens when BPE is re-run over its bytes using only ranks ``< r``; the merge
  list is those pairs in rank order, written as ``[a, b]`` pairs;
* normalizer NFC; pre-tokenizer ``Sequence[Split(regex, Isolated), ByteLevel]``; ByteLevel
  post-processor and decoder, all with ``add_prefix_space/trim_offsets/use_regex = false``;
* the 26 added tokens 151643..151668 (the first 14 special).

The tokenizer description is written as an explicit JSON document (every field spelled out, because the
Python binding of ``decoders.ByteLevel`` takes no options and would serialize ``true`` where Qwen has
``false``), loaded into a ``tokenizers.Tokenizer`` and saved the way Hugging Face saves it
(``to_str(pretty=True)``). The result is checked against the sha256 of the official file.

Public API: :data:`QWEN3_TOKENIZER_SHA256`, :data:`QWEN3_TOKENIZER_SIZE`,
:func:`build_qwen3_tokenizer_json` and :func:`qwen3_tokenizer_path` (cached, verified, atomic).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

__all__ = [
    "QWEN3_TOKENIZER_SHA256",
    "QWEN3_TOKENIZER_SIZE",
    "build_qwen3_tokenizer_json",
    "qwen3_tokenizer_path",
]

QWEN3_TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
"""sha256 of the official Qwen3 ``tokenizer.json`` (its Git LFS oid on the Hugging Face Hub)."""

QWEN3_TOKENIZER_SIZE = 11_422_654
"""Size in bytes of the official Qwen3 ``tokenizer.json``."""

_DASHSCOPE_REQUIREMENT = "dashscope==2.0.2"
_TIKTOKEN_RESOURCE = ("resources", "qwen.tiktoken")
_NUM_RANKS = 151_643

_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added tokens, ids 151643.. in this order; the first _NUM_SPECIAL are special.
_ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
_NUM_SPECIAL = 14

_SMOKE_TEXT = "Hello, world!"
_SMOKE_IDS = [9707, 11, 1879, 0]

_DEFAULT_CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "qwen3-tokenizer"
_FILE_NAME = "tokenizer.json"

_BYTE_LEVEL_OFF = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}


def _tiktoken_path() -> Path:
    """Locate ``qwen.tiktoken`` inside the installed dashscope package, without importing it."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the Qwen3 test tokenizer needs the {_DASHSCOPE_REQUIREMENT} wheel (it ships "
            "dashscope/resources/qwen.tiktoken) but 'dashscope' is not installed; "
            "install the dev dependencies with `uv sync`",
            name="dashscope",
        )
    for location in spec.submodule_search_locations:
        path = Path(location).joinpath(*_TIKTOKEN_RESOURCE)
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"'dashscope' is installed but has no {'/'.join(_TIKTOKEN_RESOURCE)}; "
        f"the Qwen3 test tokenizer needs {_DASHSCOPE_REQUIREMENT}"
    )


def _load_ranks(path: Path) -> list[bytes]:
    """Read ``<base64 token> <rank>`` lines; return the token bytes indexed by rank."""
    tokens: list[bytes | None] = [None] * _NUM_RANKS
    count = 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        encoded, rank_text = line.split()
        rank = int(rank_text)
        if not 0 <= rank < _NUM_RANKS or tokens[rank] is not None:
            raise ValueError(f"{path}: unexpected or duplicate rank {rank}")
        tokens[rank] = base64.b64decode(encoded)
        count += 1
    if count != _NUM_RANKS:
        raise ValueError(f"{path}: expected {_NUM_RANKS} ranks, found {count}")
    return [token for token in tokens if token is not None]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table used by byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


def _recover_merges(tokens: list[bytes], rank_of: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """For every multi-byte token, in rank order, find the two lower-ranked tokens that merge into it.

    Runs plain BPE over the token's bytes, merging the lowest-ranked adjacent pair at each step but only
    with ranks below the token's own; a consistent rank table always ends with exactly two parts.
    """
    merges: list[tuple[bytes, bytes]] = []
    for rank, token in enumerate(tokens):
        if len(token) == 1:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best_rank, best_index = rank, -1
            for index in range(len(parts) - 1):
                pair_rank = rank_of.get(parts[index] + parts[index + 1], rank)
                if pair_rank < best_rank:
                    best_rank, best_index = pair_rank, index
            if best_index < 0:
                raise ValueError(f"rank {rank} ({token!r}) cannot be built from lower ranks: {parts!r}")
            parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
        if len(parts) != 2 or rank_of[parts[0]] >= rank or rank_of[parts[1]] >= rank:
            raise ValueError(f"rank {rank} ({token!r}) does not split into two lower ranks: {parts!r}")
        merges.append((parts[0], parts[1]))
    return merges


def _tokenizer_document(tokens: list[bytes]) -> dict[str, Any]:
    """The full ``tokenizer.json`` document, every field as in the official file."""
    byte_char = _bytes_to_unicode()

    def to_unicode(token: bytes) -> str:
        return "".join(byte_char[byte] for byte in token)

    rank_of = {token: rank for rank, token in enumerate(tokens)}
    merges = _recover_merges(tokens, rank_of)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": _NUM_RANKS + index,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": index < _NUM_SPECIAL,
            }
            for index, content in enumerate(_ADDED_TOKENS)
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": _PRETOKENIZE_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", **_BYTE_LEVEL_OFF},
            ],
        },
        "post_processor": {"type": "ByteLevel", **_BYTE_LEVEL_OFF},
        "decoder": {"type": "ByteLevel", **_BYTE_LEVEL_OFF},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {to_unicode(token): rank for rank, token in enumerate(tokens)},
            "merges": [[to_unicode(left), to_unicode(right)] for left, right in merges],
        },
    }


def build_qwen3_tokenizer_json() -> bytes:
    """Rebuild the official Qwen3 ``tokenizer.json`` from the installed dashscope wheel.

    Pure: reads ``dashscope/resources/qwen.tiktoken`` and returns the file's bytes (it writes nothing).
    The bytes equal the official file (:data:`QWEN3_TOKENIZER_SHA256`) with the ``tokenizers`` versions
    this was checked with; callers that need the guarantee should verify the hash, as
    :func:`qwen3_tokenizer_path` does.

    Raises:
        ModuleNotFoundError: dashscope is not installed.
        FileNotFoundError: dashscope is installed but lacks ``resources/qwen.tiktoken``.
        ValueError: the rank file is malformed or not a consistent BPE merge order.
    """
    document = _tokenizer_document(_load_ranks(_tiktoken_path()))
    tokenizer = Tokenizer.from_str(json.dumps(document, ensure_ascii=False))
    return tokenizer.to_str(pretty=True).encode("utf-8")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o644)  # mkstemp creates 0600; make it an ordinary cache file
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def qwen3_tokenizer_path(cache_dir: Path | None = None) -> Path:
    """Return the path of a verified Qwen3 ``tokenizer.json``, building and caching it if needed.

    The file lives at ``<cache_dir>/tokenizer.json`` (default ``<repo>/.cache/qwen3-tokenizer/``). Its
    sha256 is checked on every call; a missing or corrupt file is rebuilt with
    :func:`build_qwen3_tokenizer_json` and written atomically, so concurrent test workers only ever see
    a complete file. Finally the file is loaded and ``'Hello, world!'`` must encode to
    ``[9707, 11, 1879, 0]``.

    Raises:
        RuntimeError: the rebuilt bytes do not match the official file (e.g. a ``tokenizers`` release
            that serializes differently), or the smoke encoding is wrong.
    """
    path = (_DEFAULT_CACHE_DIR if cache_dir is None else Path(cache_dir)) / _FILE_NAME
    if not (path.is_file() and _sha256_file(path) == QWEN3_TOKENIZER_SHA256):
        data = build_qwen3_tokenizer_json()
        digest = hashlib.sha256(data).hexdigest()
        if digest != QWEN3_TOKENIZER_SHA256 or len(data) != QWEN3_TOKENIZER_SIZE:
            raise RuntimeError(
                f"rebuilt Qwen3 tokenizer.json differs from the official file: sha256 {digest}, "
                f"{len(data)} bytes; expected {QWEN3_TOKENIZER_SHA256}, {QWEN3_TOKENIZER_SIZE} bytes"
            )
        _write_atomically(path, data)
    ids = Tokenizer.from_file(str(path)).encode(_SMOKE_TEXT, add_special_tokens=False).ids
    if ids != _SMOKE_IDS:
        raise RuntimeError(f"{path}: {_SMOKE_TEXT!r} encodes to {ids}, expected {_SMOKE_IDS}")
    return path
