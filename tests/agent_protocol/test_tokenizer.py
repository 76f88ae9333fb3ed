"""The tokenizer wrapper: exact encoding, and errors that name the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_protocol import HFTokenizer, Tokenizer, TokenizerLoadError, load_tokenizer


def test_loads_a_file_or_a_model_directory(qwen3_tokenizer_file: Path, tmp_path: Path) -> None:
    from_file = HFTokenizer.from_file(qwen3_tokenizer_file)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_bytes(qwen3_tokenizer_file.read_bytes())
    from_dir = load_tokenizer(model_dir)
    assert isinstance(from_dir, Tokenizer)
    text = "<|im_start|>user\nHello, world!<|im_end|>\n"
    assert from_file.encode(text) == from_dir.encode(text) == [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198]
    assert from_file.decode(from_file.encode(text)) == text
    assert from_file.decode([151645], skip_special_tokens=True) == ""
    assert from_file.token_to_id("<|im_end|>") == 151645
    assert from_file.token_to_id("not a token at all") is None
    assert from_file.vocab_size == 151669
    assert from_file.encode_batch(["a", text]) == [from_file.encode("a"), from_file.encode(text)]


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(TokenizerLoadError, match="no such file") as info:
        HFTokenizer.from_file(missing)
    assert info.value.path == str(missing)
    assert str(missing) in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"{ this is not json", b'{"version": "1.0", "model": {"type": "NoSuchModel"}}', b"\xff\xfe\x00garbage"],
    ids=["bad_json", "bad_spec", "not_utf8"],
)
def test_corrupt_file_names_the_path(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(TokenizerLoadError) as info:
        HFTokenizer.from_file(path)
    assert str(path) in str(info.value)


def test_load_tokenizer_rejects_other_things() -> None:
    with pytest.raises(TypeError, match="cannot use int as a tokenizer"):
        load_tokenizer(3)


def test_long_texts_take_the_gil_free_path_and_give_the_same_ids(qwen3_tokenizer_file: Path) -> None:
    from agent_protocol import GIL_FREE_MIN_CHARS
    from tests.agent_protocol.golden import renders

    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)
    texts = [r.text for r in renders()]
    joined = "".join(texts)  # every golden render: special tokens, tool calls, think blocks, CJK and emoji
    assert len(joined) >= GIL_FREE_MIN_CHARS
    cut = GIL_FREE_MIN_CHARS  # the shortest text that takes the batch path, and one just below it
    for text in (joined, joined[:cut], joined[: cut - 1], joined[17 : 17 + cut]):
        assert tokenizer.encode(text) == list(tokenizer.backend.encode(text, add_special_tokens=False).ids)
