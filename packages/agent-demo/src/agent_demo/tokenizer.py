"""The demo tokenizer: a small byte-level BPE trained with `tokenizers` on the demo task's conversations, carrying
Qwen3's 26 added tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``, ``<think>``, ...)
with Qwen3's special / non-special flags, so the Qwen3 chat protocol applies unchanged.

Choices, for a model of about a million parameters:

- every digit is its own pre-token, so numbers are always written digit by digit: the model copies operands into
  the tool call and the tool's result into the answer one digit per token;
- apart from digits, merges may cross words, so the fixed parts of the conversation (the tools block of the
  system prompt, ``{"name": "calculator", "arguments": {"expression": "``, ``The answer is ``) become a few
  tokens each: an episode is about 90 tokens instead of 300, which makes CPU training several times faster;
- the corpus is the text of expert episodes in the pieces a session tokenizes separately (the prompt, each
  generated turn, each feedback), with the added tokens cut out, so no merge straddles a piece boundary or an
  added token: a token-in-token-out transcript then equals the tokenization of the episode's whole text;
- the 256 byte symbols are all in the vocabulary, so any text (a user's question at serving time) still encodes.

The vocabulary comes out at about 800 (the corpus saturates below the 1024 asked for) plus the added tokens at the
end, in Qwen3's order. This module knows text and `tokenizers`; it knows nothing about models or training.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Final

import structlog
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from agent_demo.expert import expert_turn
from agent_demo.task import Phrasing, Problem, generate_problems
from agent_protocol import ChatProtocol, Message, ToolSpecLike

__all__ = [
    "QWEN3_ADDED_TOKENS",
    "episode_pieces",
    "episode_text",
    "train_demo_tokenizer",
    "train_piece_tokenizer",
]

logger = structlog.get_logger(__name__)

QWEN3_ADDED_TOKENS: Final[tuple[tuple[str, bool], ...]] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
"""Qwen3's added tokens in Qwen3's id order, each with its `special` flag (True: skipped by
``decode(skip_special_tokens=True)``)."""

ALL_PHRASINGS: Final[tuple[Phrasing, ...]] = ("plain", "word")
_ADDED_PATTERN: Final = re.compile("|".join(re.escape(text) for text, _ in QWEN3_ADDED_TOKENS))


def episode_pieces(problem: Problem, protocol: ChatProtocol, tools: Sequence[ToolSpecLike]) -> list[str]:
    """The texts of the expert's episode on `problem` in the pieces a session tokenizes one by one: the rendered
    prompt, the expert's tool call, the tool's feedback (which opens the next turn), the expert's answer."""
    prompt = protocol.render_prompt([Message(role="user", content=problem.question)], tools=tools)
    call = expert_turn(prompt, protocol, phrasings=ALL_PHRASINGS)
    feedback = protocol.render_feedback([Message(role="tool", content=problem.answer, tool_call_id="call_0")])
    answer = expert_turn(prompt + call + feedback, protocol, phrasings=ALL_PHRASINGS)
    return [prompt, call, feedback, answer]


def episode_text(problem: Problem, protocol: ChatProtocol, tools: Sequence[ToolSpecLike]) -> str:
    """The whole text of the expert's episode on `problem`, as the session's transcript decodes."""
    return "".join(episode_pieces(problem, protocol, tools))


def _pieces(texts: Iterable[str]) -> Iterable[str]:
    for text in texts:
        for piece in _ADDED_PATTERN.split(text):
            if piece:
                yield piece


def _qwen3_decoder(tokenizer: Tokenizer) -> Tokenizer:
    """The same tokenizer with Qwen3's ByteLevel decoder options (the Python binding takes none and writes
    ``true`` where Qwen3's file has ``false``; decoding is the same either way, the file reads like Qwen3's)."""
    spec = json.loads(tokenizer.to_str())
    spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return Tokenizer.from_str(json.dumps(spec))


def train_demo_tokenizer(
    protocol: ChatProtocol,
    tools: Sequence[ToolSpecLike],
    *,
    vocab_size: int = 1024,
    episodes: int = 3000,
    seed: int = 0,
) -> Tokenizer:
    """Train the demo tokenizer on `episodes` expert episodes of the training split (see the module docstring).
    `vocab_size` bounds the learned vocabulary; the added tokens come on top."""
    problems = generate_problems("train", episodes, seed=seed)
    texts = [piece for problem in problems for piece in episode_pieces(problem, protocol, tools)]
    return train_piece_tokenizer(texts, vocab_size=vocab_size)


def train_piece_tokenizer(texts: Sequence[str], *, vocab_size: int = 1024) -> Tokenizer:
    """A demo tokenizer (see the module docstring) trained on `texts`: the pieces of episodes a session tokenizes
    one by one (any demo task's; the added tokens are cut out of them here)."""
    if vocab_size < 257:
        raise ValueError(f"vocab_size must leave room for the 256 byte symbols and merges, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_pieces(texts), trainer=trainer)
    for text, special in QWEN3_ADDED_TOKENS:
        token = AddedToken(text, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        if special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
    tokenizer = _qwen3_decoder(tokenizer)
    logger.info(
        "demo_tokenizer_trained",
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        pieces=len(texts),
        mean_piece_tokens=round(sum(len(tokenizer.encode(t).ids) for t in texts[:1600]) / min(len(texts), 1600), 1),
    )
    return tokenizer
