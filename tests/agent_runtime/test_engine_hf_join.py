"""HFEngine's running batches take in requests that arrive while they run, on the tiny random-weight Qwen3 with the
real Qwen3 tokenizer: a joined request gives the ids and logprobs it gives alone (shorter and longer than the
running rows, greedy and seeded), is answered as soon as it finishes, leaves its sequence for its next turn, and a
joined request that breaks the model fails alone; with joining off, nothing joins."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.hf import HFEngine
from agent_runtime.errors import EngineError
from tests.agent_runtime.test_engine_hf import PoisonedModel
from tests.support.greedy_reference import greedy_reference

LONG = SamplingParams(max_new_tokens=64, temperature=0.0, logprobs=True)  # the row the others join
FEEDBACK = "<|im_end|>\n<|im_start|>user\n<tool_response>\n413\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def question(engine: HFEngine, text: str) -> list[int]:
    return engine.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture
def engine(tiny_hf_engine: HFEngine) -> Iterator[HFEngine]:
    fresh = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer)
    yield fresh
    run(fresh.close())


async def join_after_first_step(
    engine: HFEngine,
    first: tuple[Sequence[int], SamplingParams],
    later: Sequence[tuple[Sequence[int], SamplingParams]],
) -> list[asyncio.Task[Generation]]:
    """Start `first`, wait until its batch has computed a step, then send `later`: they arrive mid-batch."""
    steps = engine.row_steps
    tasks = [asyncio.ensure_future(engine.generate(*first))]
    while engine.row_steps == steps:
        await asyncio.sleep(0.001)
    tasks += [asyncio.ensure_future(engine.generate(*request)) for request in later]
    await asyncio.wait(tasks)
    return tasks


def test_requests_arriving_mid_batch_join_it_and_give_their_lone_ids(engine: HFEngine, alone: HFEngine) -> None:
    running = question(engine, "Count to twenty, slowly.")
    shorter = question(engine, "Hi")
    longer = question(engine, "Explain, step by step and with care, why 12 * 34 + 5 is 413, then check it twice.")
    assert len(shorter) < len(running) < len(longer), "one joins a longer cache, one a shorter"
    later = [
        (shorter, SamplingParams(max_new_tokens=5, temperature=0.0, logprobs=True)),
        (longer, SamplingParams(max_new_tokens=12, temperature=0.0, logprobs=True)),
    ]
    tasks = run(join_after_first_step(engine, (running, LONG), later))
    assert engine.joined_requests == 2, "both requests should have joined the running batch"
    assert dict(engine.batch_sizes) == {1: 1}, "one batch ran them all (a failed one is retried alone)"
    for (prompt, sampling), task in zip([(running, LONG), *later], tasks, strict=True):
        lone = run(alone.generate(prompt, sampling))
        joined = task.result()
        assert joined.ids == lone.ids
        assert joined.logprobs == pytest.approx(lone.logprobs, abs=1e-4)
        assert joined.finish_reason == lone.finish_reason == "length"
    short_prompt, short_sampling = later[0]
    assert tasks[1].result().ids == greedy_reference(engine.model, short_prompt, short_sampling.max_new_tokens)


def test_a_seeded_request_that_joins_draws_what_it_draws_alone(engine: HFEngine, alone: HFEngine) -> None:
    seeded = SamplingParams(max_new_tokens=10, temperature=1.0, top_k=50, seed=11)
    prompt = question(engine, "Pick a number.")
    tasks = run(join_after_first_step(engine, (question(engine, "Count to twenty."), LONG), [(prompt, seeded)]))
    assert engine.joined_requests == 1 and dict(engine.batch_sizes) == {1: 1}
    assert tasks[1].result().ids == run(alone.generate(prompt, seeded)).ids


def test_a_joined_request_is_answered_when_it_finishes_not_when_its_batch_does(engine: HFEngine) -> None:
    async def scenario() -> tuple[bool, Generation]:
        steps = engine.row_steps
        long_task = asyncio.ensure_future(engine.generate(question(engine, "Count to twenty."), LONG))
        while engine.row_steps == steps:
            await asyncio.sleep(0.001)
        short = await engine.generate(question(engine, "Hi"), SamplingParams(max_new_tokens=2, temperature=0.0))
        still_running = not long_task.done()
        await long_task
        return still_running, short

    still_running, short = run(scenario())
    assert engine.joined_requests == 1 and dict(engine.batch_sizes) == {1: 1}
    assert len(short.ids) == 2
    assert still_running, "the short request should have come back while the long one was still generating"


def test_a_joined_rows_sequence_is_kept_for_its_next_turn(engine: HFEngine) -> None:
    prompt = question(engine, "What is 12 * 34 + 5? Use the calculator.")
    turn = SamplingParams(max_new_tokens=6, temperature=0.0)
    tasks = run(join_after_first_step(engine, (question(engine, "Count to twenty."), LONG), [(prompt, turn)]))
    assert engine.joined_requests == 1 and dict(engine.batch_sizes) == {1: 1}
    follow_up = prompt + tasks[1].result().ids + engine.tokenize(FEEDBACK)
    hits, reused = engine.prefix_cache.hits, engine.prefix_cache.reused_tokens
    second = run(engine.generate(follow_up, turn))
    assert engine.prefix_cache.hits == hits + 1
    assert engine.prefix_cache.reused_tokens - reused == len(prompt) + len(tasks[1].result().ids) - 1
    assert second.ids == greedy_reference(engine.model, follow_up, turn.max_new_tokens)


def test_a_joined_request_that_breaks_the_model_fails_alone(tiny_hf_engine: HFEngine, alone: HFEngine) -> None:
    poison = 4242
    engine = HFEngine(PoisonedModel(tiny_hf_engine.model, poison), tiny_hf_engine.tokenizer)
    running = question(tiny_hf_engine, "Count to twenty.")
    try:
        tasks = run(join_after_first_step(engine, (running, LONG), [([1, poison, 2], LONG)]))
        assert engine.joined_requests == 1
        assert dict(engine.batch_sizes) == {1: 3}, "the batch, then each of its requests alone"
        error = tasks[1].exception()
        assert isinstance(error, EngineError) and "device-side assert triggered" in str(error)
        assert tasks[0].result().ids == run(alone.generate(running, LONG)).ids  # retried alone, from the start
    finally:
        run(engine.close())


def test_with_joining_off_a_request_waits_for_the_next_batch(tiny_hf_engine: HFEngine, alone: HFEngine) -> None:
    engine = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, join_running=False)
    later = (question(engine, "Hi"), SamplingParams(max_new_tokens=3, temperature=0.0))
    try:
        tasks = run(join_after_first_step(engine, (question(engine, "Count to twenty."), LONG), [later]))
        assert engine.joined_requests == 0
        assert dict(engine.batch_sizes) == {1: 2}
        assert tasks[1].result().ids == run(alone.generate(*later)).ids
    finally:
        run(engine.close())
