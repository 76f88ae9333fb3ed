"""HFEngine's `max_batch_tokens`: a batch's rows share one left-padded cache, so a long prompt among short ones (or
joining them) makes every row hold the long one's positions. With the bound, a request that would take a batch past
it waits for the next batch instead, first in line; on the tiny random-weight Qwen3 with the real Qwen3 tokenizer:
the cache never holds more positions than the bound (`peak_batch_tokens`), every request gives its lone ids, short
requests still batch and join, a request larger than the bound alone runs alone, and a waiting request is neither
lost on close() nor run once its caller gave up. Without the bound (the default) the same requests share a batch
and its cache holds several times the positions (the control that shows the bound is what keeps it down)."""

from __future__ import annotations

import array
import asyncio
from collections.abc import Callable

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_runtime.engines.base import SamplingParams
from agent_runtime.engines.hf import HFEngine
from tests.agent_runtime.test_engine_hf_join import LONG, join_after_first_step, question, run

SHORT = SamplingParams(max_new_tokens=4, temperature=0.0)


def bounded(tiny_hf_engine: HFEngine, max_batch_tokens: int | None) -> HFEngine:
    return HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, max_batch_tokens=max_batch_tokens)


def long_question(engine: HFEngine) -> list[int]:
    return question(engine, "Read this twice before you answer: " + "the quick brown fox jumps over it; " * 40)


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait for `condition`, failing (not hanging) when it does not come."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)
    assert condition(), what


async def together(engine: HFEngine, requests: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    """Send `requests` at once (they reach the worker within its batch wait) and return their ids."""
    done = await asyncio.gather(*(engine.generate(prompt, sampling) for prompt, sampling in requests))
    return [generation.ids for generation in done]


def test_a_long_prompt_waits_for_its_own_batch_and_the_cache_stays_within_the_bound(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    a, b = question(tiny_hf_engine, "Hi"), question(tiny_hf_engine, "Hello there")
    long = long_question(tiny_hf_engine)
    assert len(long) > 8 * len(b), "the long prompt must dwarf the short ones"
    bound = len(long) + SHORT.max_new_tokens  # the long one fits alone; with anything else it does not
    assert 2 * (len(b) + SHORT.max_new_tokens) <= bound < 2 * len(long)
    requests = [(a, SHORT), (b, SHORT), (long, SHORT)]
    lone = [run(alone.generate(prompt, sampling)).ids for prompt, sampling in requests]

    engine = bounded(tiny_hf_engine, bound)
    try:
        assert run(together(engine, requests)) == lone
        assert dict(engine.batch_sizes) == {2: 1, 1: 1}, "the short ones batched; the long one ran on its own"
        assert engine.deferred_requests == 1
        assert 0 < engine.peak_batch_tokens <= bound
    finally:
        run(engine.close())

    unbounded = bounded(tiny_hf_engine, None)  # the default: one batch, every row as long as the long prompt
    try:
        assert run(together(unbounded, requests)) == lone
        assert dict(unbounded.batch_sizes) == {3: 1} and unbounded.deferred_requests == 0
        assert unbounded.peak_batch_tokens >= 3 * len(long) > bound
    finally:
        run(unbounded.close())


def test_a_long_request_arriving_mid_batch_waits_and_a_short_one_still_joins(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    running = question(tiny_hf_engine, "Count to twenty, slowly.")
    long, short = long_question(tiny_hf_engine), question(tiny_hf_engine, "Hi")
    bound = len(long) + SHORT.max_new_tokens + 8  # the long one alone fits; joined to the running row it does not
    assert 2 * (len(running) + LONG.max_new_tokens) <= bound < 2 * len(long)

    engine = bounded(tiny_hf_engine, bound)
    try:
        tasks = run(join_after_first_step(engine, (running, LONG), [(long, SHORT)]))
        assert engine.joined_requests == 0 and engine.deferred_requests == 1
        assert dict(engine.batch_sizes) == {1: 2}, "the long request ran after the running batch, alone"
        assert [t.result().ids for t in tasks] == [
            run(alone.generate(running, LONG)).ids,
            run(alone.generate(long, SHORT)).ids,
        ]
        assert engine.peak_batch_tokens <= bound

        tasks = run(join_after_first_step(engine, (running, LONG), [(short, SHORT)]))
        assert engine.joined_requests == 1, "a request the bound has room for joins as before"
        assert tasks[1].result().ids == run(alone.generate(short, SHORT)).ids
        assert engine.peak_batch_tokens <= bound
    finally:
        run(engine.close())


def test_a_request_larger_than_the_bound_runs_alone_rather_than_never(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    a, b = question(tiny_hf_engine, "Hi"), question(tiny_hf_engine, "Hello there")
    engine = bounded(tiny_hf_engine, 1)
    try:
        assert run(together(engine, [(a, SHORT), (b, SHORT)])) == [
            run(alone.generate(a, SHORT)).ids,
            run(alone.generate(b, SHORT)).ids,
        ]
        assert dict(engine.batch_sizes) == {1: 2}
        assert engine.peak_batch_tokens <= len(b) + SHORT.max_new_tokens  # one row at a time
    finally:
        run(engine.close())


def test_a_waiting_request_is_answered_after_close_and_skipped_once_its_caller_gave_up(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    running = question(tiny_hf_engine, "Count to twenty, slowly.")
    long = long_question(tiny_hf_engine)
    bound = len(long) + SHORT.max_new_tokens + 8

    async def close_while_one_waits(engine: HFEngine) -> list[list[int]]:
        steps = engine.row_steps
        first = asyncio.ensure_future(engine.generate(running, LONG))
        await until(lambda: engine.row_steps > steps, "the first request never started")
        waiting = asyncio.ensure_future(engine.generate(long, SHORT))
        await until(lambda: engine.deferred_requests > 0, "the long request never waited for a later batch")
        await engine.close(timeout_s=None)  # requests sent before close() run, the waiting one included
        return [(await first).ids, (await waiting).ids]

    engine = bounded(tiny_hf_engine, bound)
    assert run(close_while_one_waits(engine)) == [
        run(alone.generate(running, LONG)).ids,
        run(alone.generate(long, SHORT)).ids,
    ]
    assert dict(engine.batch_sizes) == {1: 2}

    async def give_up_while_it_waits(engine: HFEngine) -> None:
        steps = engine.row_steps
        first = asyncio.ensure_future(engine.generate(running, LONG))
        await until(lambda: engine.row_steps > steps, "the first request never started")
        waiting = asyncio.ensure_future(engine.generate(long, SHORT))
        await until(lambda: engine.deferred_requests > 0, "the long request never waited for a later batch")
        waiting.cancel()
        await first
        await engine.generate(question(engine, "Hi"), SHORT)  # the worker has moved past the abandoned request

    engine = bounded(tiny_hf_engine, bound)
    try:
        run(give_up_while_it_waits(engine))
        assert dict(engine.batch_sizes) == {1: 2}, "the abandoned request never ran"
    finally:
        run(engine.close())


def test_the_bound_must_be_positive(tiny_hf_engine: HFEngine) -> None:
    with pytest.raises(ValueError, match="max_batch_tokens must be at least 1"):
        HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, max_batch_tokens=0)


def test_looking_at_kept_prefixes_for_the_bound_counts_no_hit(tiny_hf_engine: HFEngine) -> None:
    engine = bounded(tiny_hf_engine, 1_000_000)
    try:
        first = question(engine, "Hi")
        reply = run(engine.generate(first, SHORT))
        kept = first + reply.ids[:-1]  # the prompt and every generated id but the last
        assert engine.prefix_cache.reusable(array.array("q", [*kept, 1, 2])) == len(kept)
        run(engine.generate(first + reply.ids + engine.tokenize("<|im_start|>user\nAgain<|im_end|>\n"), SHORT))
        assert (engine.prefix_cache.hits, engine.prefix_cache.misses) == (1, 1), "one lookup counted per request"
    finally:
        run(engine.close())
