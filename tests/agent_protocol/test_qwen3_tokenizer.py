"""The offline Qwen3 tokenizer rebuild (tests/support/qwen3_tokenizer.py) is the official one."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tests.support.qwen3_tokenizer import (
    QWEN3_TOKENIZER_SHA256,
    QWEN3_TOKENIZER_SIZE,
    qwen3_tokenizer_path,
)

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
ENCODINGS: list[dict[str, Any]] = json.loads((DATA_DIR / "qwen3_encodings.json").read_text("utf-8"))

ADDED_TOKENS = [
    ("<|endoftext|>", 151643, True),
    ("<|im_start|>", 151644, True),
    ("<|im_end|>", 151645, True),
    ("<|object_ref_start|>", 151646, True),
    ("<|object_ref_end|>", 151647, True),
    ("<|box_start|>", 151648, True),
    ("<|box_end|>", 151649, True),
    ("<|quad_start|>", 151650, True),
    ("<|quad_end|>", 151651, True),
    ("<|vision_start|>", 151652, True),
    ("<|vision_end|>", 151653, True),
    ("<|vision_pad|>", 151654, True),
    ("<|image_pad|>", 151655, True),
    ("<|video_pad|>", 151656, True),
    ("<tool_call>", 151657, False),
    ("</tool_call>", 151658, False),
    ("<|fim_prefix|>", 151659, False),
    ("<|fim_middle|>", 151660, False),
    ("<|fim_suffix|>", 151661, False),
    ("<|fim_pad|>", 151662, False),
    ("<|repo_name|>", 151663, False),
    ("<|file_sep|>", 151664, False),
    ("<tool_response>", 151665, False),
    ("</tool_response>", 151666, False),
    ("<think>", 151667, False),
    ("</think>", 151668, False),
]


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> Tokenizer:
    return Tokenizer.from_file(str(qwen3_tokenizer_file))


def test_cached_file_is_the_official_one(qwen3_tokenizer_file: Path) -> None:
    data = qwen3_tokenizer_file.read_bytes()
    assert len(data) == QWEN3_TOKENIZER_SIZE == 11_422_654
    assert hashlib.sha256(data).hexdigest() == QWEN3_TOKENIZER_SHA256


def test_fresh_rebuild_replaces_corrupt_cache_and_keeps_a_valid_one(qwen3_tokenizer_file: Path, tmp_path: Path) -> None:
    cached = tmp_path / "tokenizer.json"
    cached.write_bytes(b'{"truncated": ')
    path = qwen3_tokenizer_path(tmp_path)  # corrupt -> rebuilt from the dashscope ranks
    assert path == cached
    data = path.read_bytes()
    assert len(data) == QWEN3_TOKENIZER_SIZE
    assert hashlib.sha256(data).hexdigest() == QWEN3_TOKENIZER_SHA256
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]  # no temp file left behind

    valid = tmp_path / "valid"
    valid.mkdir()
    shutil.copyfile(qwen3_tokenizer_file, valid / "tokenizer.json")
    before = (valid / "tokenizer.json").stat()
    assert qwen3_tokenizer_path(valid) == valid / "tokenizer.json"
    after = (valid / "tokenizer.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # reused


def test_golden_data_has_all_cases() -> None:
    assert len(ENCODINGS) == 82


@pytest.mark.parametrize("case", ENCODINGS, ids=[f"case{i}" for i in range(len(ENCODINGS))])
def test_known_encodings(tokenizer: Tokenizer, case: dict[str, Any]) -> None:
    assert tokenizer.encode(case["text"], add_special_tokens=False).ids == case["ids"]


def test_decode_byte_level_pieces(tokenizer: Tokenizer) -> None:
    assert tokenizer.decode([51461, 117]) == " 根"  # QwenLM/Qwen tokenization_note.md


@pytest.mark.parametrize(("content", "token_id", "special"), ADDED_TOKENS, ids=[t[0] for t in ADDED_TOKENS])
def test_added_token(tokenizer: Tokenizer, content: str, token_id: int, special: bool) -> None:
    assert tokenizer.token_to_id(content) == token_id
    assert tokenizer.id_to_token(token_id) == content
    added = tokenizer.get_added_tokens_decoder()[token_id]
    assert (added.content, added.special, added.normalized) == (content, special, False)
    assert tokenizer.encode(content, add_special_tokens=False).ids == [token_id]
    # Atomic inside running text, without absorbing neighbouring spaces or newlines.
    encoding = tokenizer.encode(f"hi {content}\nok", add_special_tokens=False)
    assert encoding.ids.count(token_id) == 1
    assert encoding.tokens[encoding.ids.index(token_id)] == content
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == f"hi {content}\nok"


def test_added_token_count(tokenizer: Tokenizer) -> None:
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 151669
    assert sorted(tokenizer.get_added_tokens_decoder()) == list(range(151643, 151669))
