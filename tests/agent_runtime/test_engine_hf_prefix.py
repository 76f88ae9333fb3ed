"""HFEngine's prefix cache on the tiny random-weight Qwen3: multi-turn episodes (each prompt = the previous prompt +
the generated ids + feedback ids) give the ids transformers' own `generate` gives from the whole prompt, alone
and batched with rows of other prefix lengths; a change of weights, the bounds and unsupported caches; and the
prompt checks and logprobs-on-request that came with it."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
import transformers

from agent_runtime.engines.base import Generation, PromptView, SamplingParams
from agent_runtime.engines.hf import HFEngine
from tests.support.greedy_reference import greedy_reference

TURN = SamplingParams(max_new_tokens=6, temperature=0.0)
OPENING = "<|im_start|>user\nWhat is 12 * 34 + 5? Use the calculator.<|im_end|>\n<|im_start|>assistant\n"
FEEDBACK = "<|im_end|>\n<|im_start|>user\n<tool_response>\n413\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def episode(engine: HFEngine, opening: str, turns: int) -> Iterator[tuple[list[int], Generation]]:
    """Turns of one token-in-token-out episode: (prompt, generation), each prompt extending the last."""
    prompt = engine.tokenize(opening)
    feedback = engine.tokenize(FEEDBACK)
    for _ in range(turns):
        generation = run(engine.generate(prompt, TURN))
        yield prompt, generation
        prompt = prompt + generation.ids + feedback


@pytest.fixture
def engine(tiny_hf_engine: HFEngine) -> Iterator[HFEngine]:
    """A fresh engine (empty prefix cache) on the session's tiny model."""
    fresh = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer)
    yield fresh
    run(fresh.close())


def test_each_turn_continues_from_the_last_and_gives_the_ids_of_a_full_prefill(engine: HFEngine) -> None:
    assert engine.prefix_caching
    turns = list(episode(engine, OPENING, 4))
    for prompt, generation in turns:
        assert generation.ids == greedy_reference(engine.model, prompt, TURN.max_new_tokens)
    assert (engine.prefix_cache.hits, engine.prefix_cache.misses) == (3, 1)
    # every turn after the first prefilled only its last generated id and the feedback
    expected_reuse = sum(len(prompt) + len(generation.ids) - 1 for prompt, generation in turns[:-1])
    assert engine.prefix_cache.reused_tokens == expected_reuse
    assert len(engine.prefix_cache) == 1, "each turn's kept sequence replaces the one it extended"
    last_prompt, last = turns[-1]
    assert engine.prefix_cache.tokens == len(last_prompt) + len(last.ids) - 1


def test_logprobs_from_a_kept_prefix_match_a_full_prefill(engine: HFEngine, tiny_hf_engine: HFEngine) -> None:
    uncached = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, prefix_cache_sequences=0)
    try:
        assert not uncached.prefix_caching
        for prompt, generation in episode(engine, OPENING, 3):
            plain = run(uncached.generate(prompt, TURN))
            assert generation.ids == plain.ids
            assert generation.logprobs == pytest.approx(plain.logprobs, abs=1e-4)
        assert uncached.prefix_cache.hits == 0 and len(uncached.prefix_cache) == 0
    finally:
        run(uncached.close())


def test_a_batch_mixes_rows_with_kept_prefixes_of_different_lengths(engine: HFEngine) -> None:
    # three episodes at different depths: turn 3, turn 2 (both with kept prefixes) and a new one (none)
    deep = list(episode(engine, OPENING, 3))
    shallow = list(episode(engine, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", 2))
    feedback = engine.tokenize(FEEDBACK)
    prompts = [
        deep[-1][0] + deep[-1][1].ids + feedback,
        shallow[-1][0] + shallow[-1][1].ids + feedback,
        engine.tokenize("<|im_start|>user\nA new episode with a longer opening than the others.<|im_end|>\n"),
    ]
    budgets = [6, 2, 4]  # rows finish at different steps

    async def together() -> list[Generation]:
        samplings = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in budgets]
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, samplings, strict=True))))

    hits = engine.prefix_cache.hits
    batched = run(together())
    assert engine.batch_sizes[3] == 1, f"expected one batch of three, saw {dict(engine.batch_sizes)}"
    assert engine.prefix_cache.hits == hits + 2
    for prompt, generation, budget in zip(prompts, batched, budgets, strict=True):
        assert generation.ids == greedy_reference(engine.model, prompt, budget)
    # what each row kept is its own sequence: the next turn of every episode still matches a full prefill
    for prompt, generation in zip(prompts, batched, strict=True):
        follow_up = prompt + generation.ids + feedback
        expected = greedy_reference(engine.model, follow_up, TURN.max_new_tokens)
        assert run(engine.generate(follow_up, TURN)).ids == expected
    assert engine.prefix_cache.hits == hits + 5


def test_a_weight_change_drops_every_kept_prefix(tiny_hf_engine: HFEngine) -> None:
    model = copy.deepcopy(tiny_hf_engine.model)
    engine = HFEngine(model, tiny_hf_engine.tokenizer)
    try:
        (first_prompt, first), (second_prompt, second) = episode(engine, OPENING, 2)
        assert engine.prefix_cache.hits == 1
        with torch.no_grad():  # an optimizer step, as a trainer sharing the model would take
            for parameter in model.model.layers[0].parameters():
                parameter.add_(torch.randn_like(parameter))
        follow_up = second_prompt + second.ids + engine.tokenize(FEEDBACK)  # extends the kept sequence
        after = run(engine.generate(follow_up, TURN))
        assert engine.prefix_cache.hits == 1, "a kept prefix from the old weights was reused"
        assert after.ids == greedy_reference(model, follow_up, TURN.max_new_tokens)
        assert after.ids != greedy_reference(tiny_hf_engine.model, follow_up, TURN.max_new_tokens), "weights unchanged?"
        engine.clear_prefix_cache()
        run(engine.generate(first_prompt + first.ids, TURN))
        assert len(engine.prefix_cache) == 1 and engine.prefix_cache.hits == 1
    finally:
        run(engine.close())


def test_the_least_recently_used_sequences_are_evicted_beyond_the_bounds(tiny_hf_engine: HFEngine) -> None:
    engine = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, prefix_cache_sequences=2)
    openings = [f"<|im_start|>user\nQuestion number {i}<|im_end|>\n<|im_start|>assistant\n" for i in range(3)]
    try:
        firsts = [next(episode(engine, opening, 1)) for opening in openings]
        assert len(engine.prefix_cache) == 2
        misses = engine.prefix_cache.misses
        # newest first, so a follow-up's own kept sequence never evicts a sibling's before it is asked for
        for (prompt, generation), kept in zip(reversed(firsts), [True, True, False], strict=True):
            run(engine.generate(prompt + generation.ids, TURN))
            assert engine.prefix_cache.misses == misses + (not kept)
            misses = engine.prefix_cache.misses
    finally:
        run(engine.close())
    small = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, prefix_cache_tokens=10)
    try:
        run(small.generate(small.tokenize(OPENING), TURN))  # longer than 10 tokens: not kept
        assert len(small.prefix_cache) == 0 and small.prefix_cache.tokens == 0
    finally:
        run(small.close())


def test_a_sliding_window_model_always_prefills_in_full(tiny_hf_engine: HFEngine) -> None:
    config = transformers.Qwen3Config(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    engine = HFEngine(model, tiny_hf_engine.tokenizer)
    try:
        assert not engine.prefix_caching
        prompt = list(range(1, 30))
        first = run(engine.generate(prompt, TURN))
        follow_up = prompt + first.ids + [5, 6, 7]
        assert run(engine.generate(follow_up, TURN)).ids == greedy_reference(model, follow_up, TURN.max_new_tokens)
        assert engine.prefix_cache.hits == 0 and len(engine.prefix_cache) == 0
    finally:
        run(engine.close())


def test_logprobs_are_computed_only_for_the_requests_that_ask(
    engine: HFEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = engine.tokenize(OPENING)
    asked = run(engine.generate(prompt, TURN))
    assert asked.logprobs is not None and len(asked.logprobs) == len(asked.ids)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a log-softmax over the vocabulary without a request for logprobs")

    monkeypatch.setattr(torch, "logsumexp", refuse)
    monkeypatch.setattr(torch, "log_softmax", refuse)
    quiet = run(engine.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=False)))
    assert quiet.logprobs is None and quiet.ids == asked.ids


def test_prompt_ids_are_checked_as_ints_whatever_their_container(engine: HFEngine) -> None:
    ids = engine.tokenize(OPENING)
    expected = run(engine.generate(ids, TURN)).ids
    history = [*ids, 99, 100]
    assert run(engine.generate(PromptView(history, len(ids)), TURN)).ids == expected
    assert run(engine.generate(tuple(ids), TURN)).ids == expected
    assert run(engine.generate(torch.tensor(ids).tolist(), TURN)).ids == expected
    with pytest.raises(ValueError, match="prompt ids must be ints"):
        run(engine.generate([1.0, 2.5], TURN))  # type: ignore[list-item]
    with pytest.raises(ValueError, match="prompt ids must be ints"):
        run(engine.generate([1, 2**70], TURN))
    with pytest.raises(ValueError, match="prompt id 151669 is outside"):
        run(engine.generate([*ids, 151669, 3], TURN))


def test_finished_rows_leave_the_running_batch_and_the_rest_match_a_lone_run(
    engine: HFEngine, tiny_hf_engine: HFEngine
) -> None:
    """Rows of one batch that finish at different steps stop being computed; the rows still running give the ids
    and logprobs they give alone, and each finished row's kept sequence serves its next turn."""
    alone = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, prefix_cache_sequences=0)
    feedback = engine.tokenize(FEEDBACK)
    prompts = [
        engine.tokenize(f"<|im_start|>user\nQuestion {i}: what is {i} * 7?<|im_end|>\n<|im_start|>assistant\n")
        for i in range(3)
    ]
    budgets = [6, 2, 4]
    samplings = [SamplingParams(max_new_tokens=n, temperature=0.0, logprobs=True) for n in budgets]

    async def together() -> list[Generation]:
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, samplings, strict=True))))

    try:
        batched = run(together())
        assert engine.batch_sizes[3] == 1, f"expected one batch of three, saw {dict(engine.batch_sizes)}"
        # steps 1-2: three rows; the 2-token row leaves, steps 3-4: two; the 4-token row leaves, steps 5-6: one
        assert engine.row_steps == 3 + 3 + 2 + 2 + 1 + 1
        for prompt, sampling, generation in zip(prompts, samplings, batched, strict=True):
            lone = run(alone.generate(prompt, sampling))
            assert generation.ids == lone.ids == greedy_reference(engine.model, prompt, sampling.max_new_tokens)
            assert generation.logprobs == pytest.approx(lone.logprobs, abs=1e-4)
        hits = engine.prefix_cache.hits
        for prompt, generation in zip(prompts, batched, strict=True):
            follow_up = prompt + generation.ids + feedback
            expected = greedy_reference(engine.model, follow_up, TURN.max_new_tokens)
            assert run(engine.generate(follow_up, TURN)).ids == expected
        assert engine.prefix_cache.hits == hits + 3, "every row, finished early or not, kept its sequence"
    finally:
        run(alone.close())
