"""The turn core reads a family's turn boundaries from its protocol: which generated tokens close a turn
(`turn_end_texts`), which one did (`ended_by`, handed to `render_feedback`), and which tokens every engine must
stop on (`stop_texts`, carried by each request). A protocol with two closing tokens drives a real scripted engine
with the real Qwen3 tokenizer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent_protocol import HFTokenizer, Message, MessageLike, get_protocol
from agent_protocol.protocols.qwen3 import Qwen3Protocol, ThinkingMode
from agent_runtime import SamplingParams, ScriptedEngine
from agent_runtime.conversation import Conversation


class TwoEnds(Qwen3Protocol):
    """Qwen3 whose turns may also end on <|endoftext|>, recording what the turn core tells its feedback."""

    stop_texts = ("<|im_end|>", "<|endoftext|>", "<|fim_pad|>")

    def __init__(self) -> None:
        super().__init__("two-ends", ThinkingMode.NONE)
        self.told: list[tuple[bool, str | None]] = []

    @property
    def turn_end_texts(self) -> tuple[str, ...]:
        return ("<|im_end|>", "<|endoftext|>")

    def render_feedback(
        self, messages: Sequence[MessageLike], *, turn_closed: bool = True, ended_by: str | None = None
    ) -> str:
        self.told.append((turn_closed, ended_by))
        return super().render_feedback(messages, turn_closed=turn_closed, ended_by=ended_by)


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


async def _turn(protocol: TwoEnds, tokenizer: HFTokenizer, completion: str, max_new_tokens: int) -> tuple:
    conversation = Conversation(protocol, tokenizer, max_new_tokens=max_new_tokens)
    await conversation.open_segment([Message(role="user", content="hi")])
    request = conversation.request(max_new_tokens)
    assert request is not None
    sampling = request.sampling(SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=(7,)))
    engine = ScriptedEngine(tokenizer, [completion], stop_token_ids=())  # stops only where the request says
    generation = await engine.generate(request.prompt_ids, sampling)
    reply = conversation.accept(generation, call_id_prefix="c")
    await conversation.feedback_ids([Message(role="user", content="more")])
    return sampling, generation, reply


def test_each_closing_token_closes_the_turn_and_is_handed_to_the_feedback(tokenizer: HFTokenizer) -> None:
    for end in ("<|im_end|>", "<|endoftext|>"):
        protocol = TwoEnds()
        _, generation, reply = asyncio.run(_turn(protocol, tokenizer, f"Hello.{end}tail", 64))
        assert generation.ids[-1] == tokenizer.token_to_id(end)  # the engine stopped on it, and kept it
        assert reply.closed and not reply.truncated and reply.ended_by == end
        assert protocol.told == [(True, end)]


def test_a_stop_token_that_does_not_close_a_turn_leaves_it_open(tokenizer: HFTokenizer) -> None:
    protocol = TwoEnds()
    _, generation, reply = asyncio.run(_turn(protocol, tokenizer, "Hello.<|fim_pad|>tail", 64))
    assert generation.finish_reason == "stop" and generation.ids[-1] == tokenizer.token_to_id("<|fim_pad|>")
    assert not reply.closed and reply.ended_by is None
    assert protocol.told == [(False, None)]


def test_a_cut_off_turn_is_not_closed(tokenizer: HFTokenizer) -> None:
    protocol = TwoEnds()
    _, generation, reply = asyncio.run(_turn(protocol, tokenizer, "A long answer that goes on.<|im_end|>", 3))
    assert generation.finish_reason == "length"
    assert not reply.closed and reply.truncated and reply.ended_by is None
    assert protocol.told == [(False, None)]


def test_every_request_carries_the_protocols_stop_tokens(tokenizer: HFTokenizer) -> None:
    sampling, _, _ = asyncio.run(_turn(TwoEnds(), tokenizer, "x<|im_end|>", 8))
    wanted = [tokenizer.token_to_id(t) for t in TwoEnds.stop_texts]
    assert sampling.stop_token_ids == (7, *wanted)  # the caller's own first, then the protocol's
    qwen3 = Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=8)
    assert qwen3.stop_token_ids == (tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>"))


def test_a_summary_gets_its_own_budget_not_the_turn_limit() -> None:
    from agent_runtime.conversation import TurnRequest

    base = SamplingParams(max_new_tokens=24, temperature=0.5)
    turn = TurnRequest(prompt_ids=[1, 2], max_new_tokens=100)
    summary = TurnRequest(prompt_ids=[1, 2], max_new_tokens=100, purpose="summary")
    assert turn.sampling(base).max_new_tokens == 24  # a turn: the recipe's limit
    assert summary.sampling(base).max_new_tokens == 100  # a summary: its budget (already within the context)
    assert summary.sampling(base).temperature == 0.5
