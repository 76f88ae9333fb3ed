"""`PieceCache`: encoding through it gives the ids of a whole encode, on every family's renders and the real
tokenizers of four families, cold and warm; tokenizers whose pieces are not independent get no cache, and the
tests show why that guard matters (a forced cache would change their ids)."""

from __future__ import annotations

import json
import random
import string
from functools import cache

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st

from agent_protocol import HFTokenizer, get_protocol
from agent_protocol.piece_cache import PieceCache
from agent_protocol.tokenizer import PIECE_CACHE_MIN_CHARS, SHORT_PIECES_KEPT, SHORT_PIECES_MIN_CHARS
from tests.agent_protocol.golden import GOLDEN
from tests.support.family_tokenizers import load_family_tokenizer
from tests.support.hostile_text import FUZZ
from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

FAMILIES = ("qwen3", "gpt_oss", "llama3.1", "deepseek_v3")


@cache
def tokenizer(family: str) -> HFTokenizer:
    if family == "qwen3":
        return HFTokenizer.from_file(qwen3_tokenizer_path())
    return load_family_tokenizer(family)


@cache
def rendered_texts() -> list[str]:
    """Every golden render of every family (official templates' output), and prompts that repeat a long system
    message and tool listing, as a recipe's episodes do."""
    texts = [p.read_text(encoding="utf-8") for p in sorted((GOLDEN / "rendered").glob("*.txt"))]
    assert len(texts) > 100
    rng = random.Random(0)
    for text in texts[:40]:
        head = text[: len(text) // 2]
        texts.extend(head + f"<|im_start|>user\nQuestion {rng.randrange(10**6)}<|im_end|>\n" for _ in range(3))
    return texts


def whole(tok: HFTokenizer, text: str) -> list[int]:
    return list(tok.backend.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("min_chars", [1, 7, 256])
def test_cached_ids_equal_whole_encodes_on_every_render(family: str, min_chars: int) -> None:
    tok = tokenizer(family)
    assert tok.pieces is not None, f"{family}'s tokenizer should allow a piece cache"
    pieces = PieceCache(tok.pieces.added, min_chars=min_chars)
    texts = rendered_texts()
    for text in texts + texts:  # the second pass takes its long pieces from the cache
        assert pieces.encode(text, lambda runs, t=tok: [whole(t, r) for r in runs]) == whole(tok, text), text[:200]
    assert pieces.hits > 0
    assert pieces.misses > 0
    assert pieces.head_hits > 0


def test_the_tokenizer_encodes_through_the_cache_and_reuses_a_system_prompt() -> None:
    tok = tokenizer("qwen3")
    assert tok.pieces is not None
    tok.pieces.clear()
    system = "You answer with the calculator. " * 40
    prompts = [f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhat is {i}?<|im_end|>\n" for i in range(5)]
    hits, head_hits = tok.pieces.hits, tok.pieces.head_hits
    assert [tok.encode(p) for p in prompts] == [whole(tok, p) for p in prompts]
    # The second prompt takes the system piece and the two runs of added tokens from the cache, and keeps what
    # they start (up to the new user message) as a head; each later prompt takes that head in one lookup, and its
    # closing run.
    assert tok.pieces.hits - hits == 3 + 3 * 1
    assert tok.pieces.head_hits - head_hits == 3
    # After the first prompt, only what is new is encoded: the user's message (the text between its added tokens).
    encoded: list[str] = []
    assert tok.pieces.encode(
        prompts[0].replace("What is 0?", "Why?"), lambda texts: encoded.extend(texts) or [whole(tok, t) for t in texts]
    ) == whole(tok, prompts[0].replace("What is 0?", "Why?"))
    assert encoded == ["user\nWhy?"]
    plain = HFTokenizer(tok.backend, piece_cache=False)
    assert plain.pieces is None
    assert [plain.encode(p) for p in prompts] == [whole(tok, p) for p in prompts]


def test_a_feedback_is_cut_at_every_added_token_and_only_its_new_pieces_are_encoded() -> None:
    tok = tokenizer("qwen3")
    assert tok.pieces is not None and tok.short_pieces is not None
    tok.short_pieces.clear()
    protocol = get_protocol("qwen3")

    def feedback(result: str) -> str:
        return protocol.render_feedback([{"role": "tool", "content": result}])

    first = feedback("41")
    assert SHORT_PIECES_MIN_CHARS <= len(first) < PIECE_CACHE_MIN_CHARS, "a feedback takes the short path"
    long_pieces = dict(tok.pieces._pieces)
    assert tok.encode(first) == whole(tok, first)
    misses = tok.short_pieces.misses
    assert tok.encode(feedback("42")) == whole(tok, feedback("42"))
    assert tok.short_pieces.misses == misses + 1, "only the new result's piece reached the tokenizer"
    assert "\n42\n" in tok.short_pieces._pieces, "the result between <tool_response> tags is a piece of its own"
    assert tok.encode(feedback("42")) == whole(tok, feedback("42"))
    assert tok.short_pieces.misses == misses + 1, "a feedback seen before is all cached"
    text = "a plain short text"  # shorter than SHORT_PIECES_MIN_CHARS: encoded whole, the cache untouched
    assert tok.encode(text) == whole(tok, text) and tok.short_pieces.misses == misses + 1
    for result in range(SHORT_PIECES_KEPT * 2):  # a stream of one-off results: bounded, and kept apart
        assert tok.encode(feedback(str(result))) == whole(tok, feedback(str(result)))
    assert len(tok.short_pieces) <= SHORT_PIECES_KEPT
    assert tok.pieces._pieces == long_pieces, "short texts never touch the long texts' pieces"


def with_tokens(*contents: str) -> HFTokenizer:
    """Qwen3's tokenizer with more added tokens."""
    backend = tokenizers.Tokenizer.from_str(tokenizer("qwen3").backend.to_str())
    backend.add_special_tokens([tokenizers.AddedToken(c, normalized=False) for c in contents])
    return HFTokenizer(backend)


def test_a_head_is_taken_only_where_the_new_text_is_cut_as_it_was() -> None:
    # "<x>yz" is an added token that starts with another one, "<x>": a head that ends after "<x>" must not be
    # taken for a text that goes on with "yz", where the tokenizer reads one token across the head's end.
    tok = with_tokens("<x>", "<x>yz")
    assert tok.pieces is not None
    pieces = PieceCache(tok.pieces.added, min_chars=1, min_head_chars=1)
    start = "<|im_start|>" + "a" * 300

    def encode(text: str) -> list[int]:
        return pieces.encode(text, lambda runs: [whole(tok, r) for r in runs])

    for tail in ("<x>q1", "<x>q2", "<x>q3"):
        assert encode(start + tail) == whole(tok, start + tail)
    assert pieces.head_hits == 1  # kept by the second text (everything up to its new piece), taken by the third
    for tail, taken in (("<x>yz", False), ("<x>y", True), ("<x>", True), ("<x>yzq4", True)):
        used = pieces.head_hits
        assert encode(start + tail) == whole(tok, start + tail), tail
        assert pieces.head_hits == used + taken, tail
    # ("<x>" is the head itself; "<x>yzq4" takes the head "<x>yz" kept by the first text of the loop.)
    # A text that starts with a head but is cut elsewhere (the head's end is inside one of its pieces) does not
    # take it either.
    used = pieces.head_hits
    assert encode(start + "<x>q3 more") == whole(tok, start + "<x>q3 more")
    text = start[:200]
    assert encode(text) == whole(tok, text)
    assert pieces.head_hits == used + 1


ALPHABET = string.printable + "éü中文😀\u0301 \t\n"
TAGS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|eot_id|>", "<|start|>", "<|end|>",
        "<｜User｜>", "<｜Assistant｜>", "<|im_", "im_end|>", "<"]  # fmt: skip


@FUZZ
@given(st.lists(st.sampled_from(TAGS) | st.text(ALPHABET, max_size=600), max_size=12))
def test_any_text_cut_anywhere_encodes_as_a_whole(parts: list[str]) -> None:
    text = "".join(parts)
    for family in FAMILIES:
        tok = tokenizer(family)
        assert tok.pieces is not None
        pieces = PieceCache(tok.pieces.added, min_chars=1, min_head_chars=1)
        for cut in (len(text), len(text), len(text) // 2, len(text) // 3, len(text)):  # heads of this text taken
            assert pieces.encode(text[:cut], lambda runs, t=tok: [whole(t, r) for r in runs]) == whole(tok, text[:cut])


@FUZZ
@given(st.lists(st.sampled_from(TAGS) | st.text(ALPHABET, max_size=200), max_size=8))
def test_any_short_text_encodes_through_the_tokenizer_as_a_whole(parts: list[str]) -> None:
    text = "".join(parts)[: PIECE_CACHE_MIN_CHARS - 1]
    for family in FAMILIES:
        tok = tokenizer(family)
        for _ in range(2):  # cold, then warm (its pieces cached)
            assert tok.encode(text) == whole(tok, text), family


def test_the_cache_is_bounded_in_pieces_and_characters() -> None:
    tok = tokenizer("qwen3")
    assert tok.pieces is not None
    pieces = PieceCache(tok.pieces.added, min_chars=10, max_pieces=3, max_chars=100)
    for i in range(10):
        text = f"<|im_start|>{'x' * 20}{i}<|im_end|>"
        assert pieces.encode(text, lambda runs: [whole(tok, r) for r in runs]) == whole(tok, text)
        assert len(pieces) <= 3
    # a piece longer than the whole bound is not kept
    pieces.encode("<|im_start|>" + "y" * 200, lambda runs: [whole(tok, r) for r in runs])
    assert all(len(p) <= 100 for p in pieces._pieces)
    assert sum(len(p) for p in pieces._pieces) <= 100


def edited(family: str, edit: dict[str, object]) -> tokenizers.Tokenizer:
    """`family`'s tokenizer with one part of its configuration replaced."""
    spec = json.loads(tokenizer(family).backend.to_str())
    spec.update(edit)
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def stripping(family: str) -> tokenizers.Tokenizer:
    spec = json.loads(tokenizer(family).backend.to_str())
    for token in spec["added_tokens"]:
        if token["content"] == "<|im_end|>":
            token["lstrip"] = token["rstrip"] = True
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def metaspace_first() -> tokenizers.Tokenizer:
    """A word-level tokenizer that marks the start of a text only, as sentencepiece models do."""
    from tokenizers import AddedToken, models, pre_tokenizers

    vocab = {"[UNK]": 0, "▁hello": 1, "hello": 2, "▁world": 3, "world": 4, "▁there": 5}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    backend.add_special_tokens([AddedToken("<|im_end|>", normalized=False)])
    return backend


UNSAFE = {
    "metaspace_first": metaspace_first,
    "byte_level_prefix_space": lambda: edited(
        "qwen3",
        {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}},
    ),
    "stripping_added_token": lambda: stripping("qwen3"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_tokenizers_whose_pieces_depend_on_each_other_get_no_cache(case: str) -> None:
    backend = UNSAFE[case]()
    assert PieceCache.for_backend(backend) is None
    tok = HFTokenizer(backend)
    assert tok.pieces is None
    text = "<|im_start|>user\n hello there, world <|im_end|>\n<|im_start|>assistant\n" + "word " * 200
    assert tok.encode(text) == whole(tok, text)


@pytest.mark.parametrize("case", ["metaspace_first", "stripping_added_token"])
def test_a_forced_cache_would_change_those_tokenizers_ids(case: str) -> None:
    """The guard is needed: cutting these tokenizers' texts at added tokens gives other ids."""
    backend = UNSAFE[case]()
    tok = HFTokenizer(backend, piece_cache=False)
    added = {t.content: int(i) for i, t in backend.get_added_tokens_decoder().items()}
    forced = PieceCache(added, min_chars=1)
    text = "<|im_start|>user\n hello there <|im_end|>\n<|im_start|>assistant\n"
    if case == "metaspace_first":
        text = "hello<|im_end|>world there"
    assert forced.encode(text, lambda runs: [whole(tok, r) for r in runs]) != whole(tok, text)
