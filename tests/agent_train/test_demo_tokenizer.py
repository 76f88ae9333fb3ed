"""The demo tokenizer carries Qwen3's added tokens, so the Qwen3-Instruct-2507 protocol applies unchanged: renders
round-trip, numbers are written digit by digit, a session's token-in-token-out transcript equals the tokenization
of its text, and transformers' AutoTokenizer (with the shipped chat template) agrees with it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from agent_demo.expert import ExpertPolicy
from agent_demo.recipe import make_recipe
from agent_demo.task import generate_problems
from agent_demo.tokenizer import QWEN3_ADDED_TOKENS, episode_pieces, episode_text, train_demo_tokenizer
from agent_protocol import HFTokenizer, Message, ToolCall
from agent_runtime import AgentRuntime, ScriptedEngine

RECIPE = make_recipe()
PROTOCOL = RECIPE.chat_protocol()
TOOLS = RECIPE.environment().tools


@pytest.fixture(scope="module")
def raw() -> Tokenizer:
    return train_demo_tokenizer(PROTOCOL, TOOLS)


@pytest.fixture(scope="module")
def tok(raw: Tokenizer) -> HFTokenizer:
    return HFTokenizer(raw)


def test_it_carries_qwen3_added_tokens_with_their_flags_and_order(raw: Tokenizer, qwen3_tokenizer_file: Path) -> None:
    qwen3 = json.loads(qwen3_tokenizer_file.read_text(encoding="utf-8"))["added_tokens"]
    assert [(t["content"], t["special"]) for t in qwen3] == list(QWEN3_ADDED_TOKENS)
    ours = json.loads(raw.to_str())["added_tokens"]
    assert [(t["content"], t["special"]) for t in ours] == list(QWEN3_ADDED_TOKENS)
    ids = [t["id"] for t in ours]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # contiguous at the end, in Qwen3's order
    assert ids[-1] == raw.get_vocab_size(with_added_tokens=True) - 1
    assert 300 <= raw.get_vocab_size(with_added_tokens=True) <= 2048


def test_renders_round_trip_and_added_tokens_are_single_ids(tok: HFTokenizer) -> None:
    for problem in generate_problems("test", 50, seed=3):
        text = episode_text(problem, PROTOCOL, TOOLS)
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert len(ids) < 120  # the fixed parts of the conversation are a few tokens each
    for content, _ in QWEN3_ADDED_TOKENS:
        assert tok.encode(content) == [tok.token_to_id(content)]
    full = PROTOCOL.render_messages(
        [
            Message(role="user", content="What is 12 * 34 + 5?"),
            Message(role="assistant", tool_calls=(ToolCall(id="c", name="calculator", arguments={"expression": "1"}),)),
            Message(role="tool", content="413", tool_call_id="c"),
            Message(role="assistant", content="The answer is 413."),
        ],
        tools=TOOLS,
    )
    assert tok.decode(tok.encode(full)) == full


def test_any_text_encodes_byte_level(tok: HFTokenizer) -> None:
    text = "Grüße, 世界! émoji 🙂 tabs\tand\r\nnewlines"
    assert tok.decode(tok.encode(text)) == text


def test_numbers_are_written_one_digit_per_token(tok: HFTokenizer) -> None:
    for problem in generate_problems("train", 20, seed=4):
        ids = tok.encode(episode_text(problem, PROTOCOL, TOOLS))
        pieces = [tok.decode([i]) for i in ids]
        for piece in pieces:
            if any(ch.isdigit() for ch in piece):
                assert len(piece) == 1, piece
        digits = [p for p in pieces if p.isdigit()]
        assert "".join(digits).endswith(problem.answer * 2)  # the tool's result, then the answer


def test_session_transcripts_equal_the_tokenized_text(tok: HFTokenizer) -> None:
    """Token-in-token-out: what the session appends turn by turn is what tokenizing the whole episode gives."""
    engine = ScriptedEngine(tok, policy=ExpertPolicy(tok, PROTOCOL, phrasings=("plain", "word")))
    runtime = AgentRuntime(engine, RECIPE.make_session(tok))
    problems = generate_problems("test", 20, seed=5)
    results = asyncio.run(runtime.run_many([p.question for p in problems], tasks=[p.row() for p in problems]))
    for problem, result in zip(problems, results, strict=True):
        segment = result.trajectory.last_segment
        assert result.reward == 1.0
        pieces = episode_pieces(problem, PROTOCOL, TOOLS)
        assert segment.ids == [i for piece in pieces for i in tok.encode(piece)]
        assert segment.ids == tok.encode("".join(pieces))  # no merge straddles a turn boundary


def test_transformers_loads_it_with_the_chat_template(raw: Tokenizer, tok: HFTokenizer, tmp_path: Path) -> None:
    pytest.importorskip("jinja2")
    transformers = pytest.importorskip("transformers")
    from agent_train.demo.model import build_demo_model, save_model_dir

    save_model_dir(build_demo_model(raw, seed=0), raw, tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert auto.eos_token == "<|im_end|>" and auto.pad_token == "<|endoftext|>"
    for problem in generate_problems("test", 20, seed=6):
        text = episode_text(problem, PROTOCOL, TOOLS)
        assert auto.encode(text) == tok.encode(text)
        messages = [{"role": "user", "content": problem.question}]
        specs = [t.to_openai() for t in TOOLS]
        rendered = auto.apply_chat_template(messages, tools=specs, tokenize=False, add_generation_prompt=True)
        assert rendered == PROTOCOL.render_prompt(messages, tools=TOOLS)
