"""HFEngine's batch window, on the tiny random-weight Qwen3 with the real Qwen3 tokenizer: a forming batch stops
waiting for more requests once no event loop is still sending, so a lone request starts at once however long
`batch_wait_s` is, requests sent in one go (a gather) still share one batch, and a request sent in a later step of
the loop joins the running batch instead of holding the first back. The control, `batch_wait_full=True`, waits the
whole window. Every request gives its lone ids."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.hf import HFEngine
from tests.agent_runtime.test_engine_hf_batch_tokens import until
from tests.agent_runtime.test_engine_hf_join import question, run

WINDOW_S = 2.0  # far longer than a few tokens of the tiny model take: a request that waits it out shows
SHORT = SamplingParams(max_new_tokens=4, temperature=0.0)
RUNNING = SamplingParams(max_new_tokens=48, temperature=0.0)


def engine_with(tiny_hf_engine: HFEngine, **options: Any) -> HFEngine:
    return HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, batch_wait_s=WINDOW_S, **options)


async def timed(request: Awaitable[Generation]) -> tuple[float, Generation]:
    started = time.perf_counter()
    generation = await request
    return time.perf_counter() - started, generation


def test_a_lone_request_starts_at_once_and_waits_out_the_window_only_with_batch_wait_full(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    prompt = question(tiny_hf_engine, "What is 2 + 2?")
    expected = run(alone.generate(prompt, SHORT)).ids
    engine = engine_with(tiny_hf_engine)
    try:
        seconds, generation = run(timed(engine.generate(prompt, SHORT)))
        assert generation.ids == expected
        assert seconds < WINDOW_S / 2, f"a lone request waited {seconds:.2f} s for company that was not coming"
        assert engine._sending == 0
    finally:
        run(engine.close())

    full = engine_with(tiny_hf_engine, batch_wait_full=True)  # the control: the window is what it waited for
    try:
        seconds, generation = run(timed(full.generate(prompt, SHORT)))
        assert generation.ids == expected
        assert seconds >= WINDOW_S, f"batch_wait_full answered in {seconds:.2f} s, before its window ended"
    finally:
        run(full.close())


def test_requests_sent_together_share_one_batch_without_waiting_out_the_window(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    prompts = [question(tiny_hf_engine, text) for text in ("Hi", "Name a colour.", "Count to three.")]
    expected = [run(alone.generate(prompt, SHORT)).ids for prompt in prompts]

    async def together(engine: HFEngine) -> list[Generation]:
        async def send(prompt: list[int], busy_s: float) -> Generation:
            time.sleep(busy_s)  # blocking work in the loop's step before this send, as a busy rollout has
            return await engine.generate(prompt, SHORT)

        # one step of the loop sends all three, 20 ms apart: the worker has taken the first long before the last
        return list(await asyncio.gather(*(send(prompt, 0.02 * (i > 0)) for i, prompt in enumerate(prompts))))

    engine = engine_with(tiny_hf_engine)
    try:
        for _ in range(3):
            seconds, generations = run(timed(together(engine)))
            assert [g.ids for g in generations] == expected
            assert seconds < WINDOW_S / 2, f"the batch waited {seconds:.2f} s after every request had come"
        assert dict(engine.batch_sizes) == {3: 3}, f"expected three batches of three, saw {dict(engine.batch_sizes)}"
        assert engine._sending == 0
    finally:
        run(engine.close())


def test_a_request_sent_in_a_later_step_joins_the_running_batch(tiny_hf_engine: HFEngine, alone: HFEngine) -> None:
    first, later = question(tiny_hf_engine, "Count to twenty, slowly."), question(tiny_hf_engine, "Hi")
    expected = [run(alone.generate(first, RUNNING)).ids, run(alone.generate(later, SHORT)).ids]

    async def scenario(engine: HFEngine) -> list[list[int]]:
        tasks = [asyncio.ensure_future(engine.generate(first, RUNNING))]
        # the first batch starts well within the window: nothing is sending once this task waits
        await until(lambda: engine.row_steps > 0, "the first request waited for the window", timeout_s=WINDOW_S / 2)
        tasks.append(asyncio.ensure_future(engine.generate(later, SHORT)))
        _, pending = await asyncio.wait(tasks, timeout=60)
        assert not pending, "a request was never answered"
        return [task.result().ids for task in tasks]

    engine = engine_with(tiny_hf_engine)
    try:
        assert run(scenario(engine)) == expected
        assert dict(engine.batch_sizes) == {1: 1} and engine.joined_requests == 1, "it joined the running batch"
    finally:
        run(engine.close())


def test_the_sending_count_returns_to_zero_after_cancelled_and_refused_requests(tiny_hf_engine: HFEngine) -> None:
    prompt = question(tiny_hf_engine, "Hi")
    engine = engine_with(tiny_hf_engine, batch_wait_full=True)  # the request waits in the window: cancel it there

    async def cancelled() -> None:
        task = asyncio.ensure_future(engine.generate(prompt, SHORT))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        run(cancelled())
        assert engine._sending == 0
    finally:
        run(engine.close())
    with pytest.raises(Exception, match="closed"):
        run(engine.generate(prompt, SHORT))
    assert engine._sending == 0
