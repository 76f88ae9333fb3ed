"""HFEngine's join rule, on the tiny random-weight Qwen3 with the real Qwen3 tokenizer: requests that arrive while a
batch runs wait until they are `join_ratio` times its rows still generating, or until the first of them has waited
`join_wait_steps` decode steps, and then join together, in one prefill; what never joins runs first in the next
batch; a request waiting to join is answered after close() and never runs once its caller gave up. Every request
gives its lone ids. The controls: with `join_ratio=0, join_wait_steps=0` the same arrivals join at once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.hf import HFEngine
from agent_runtime.errors import EngineUnavailable
from tests.agent_runtime.test_engine_hf_batch_tokens import until
from tests.agent_runtime.test_engine_hf_join import question, run

RUNNING = SamplingParams(max_new_tokens=48, temperature=0.0)  # the two rows the others arrive at
SHORT = SamplingParams(max_new_tokens=4, temperature=0.0)
NEVER = 10**9  # join_wait_steps: the wait alone never makes a request join


def engine_with(tiny_hf_engine: HFEngine, **options: Any) -> HFEngine:
    # a wide batch window: the two running requests, sent together, always start as one batch
    return HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, batch_wait_s=0.05, **options)


def running_prompts(engine: HFEngine) -> list[list[int]]:
    return [question(engine, "Count to twenty, slowly."), question(engine, "Name every month, in order.")]


async def start_two(engine: HFEngine) -> list[asyncio.Task[Generation]]:
    """Two requests sent together (one batch of two rows), once it has computed a step."""
    steps = engine.row_steps
    tasks = [asyncio.ensure_future(engine.generate(p, RUNNING)) for p in running_prompts(engine)]
    await until(lambda: engine.row_steps > steps, "the running batch never started")
    return tasks


async def steps_pass(engine: HFEngine, steps: int) -> None:
    """Wait until the running batch of two rows has computed `steps` more decode steps."""
    start = engine.row_steps
    await until(lambda: engine.row_steps >= start + 2 * steps, f"the batch did not compute {steps} more steps")


async def settled(tasks: Sequence[asyncio.Task[Generation]]) -> None:
    """Wait for `tasks`, failing (not hanging) when a request is never answered."""
    _, pending = await asyncio.wait(tasks, timeout=60)
    assert not pending, f"{len(pending)} request(s) never answered"


def lone_ids(alone: HFEngine, requests: Sequence[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    return [run(alone.generate(prompt, sampling)).ids for prompt, sampling in requests]


def test_one_arrival_waits_while_two_rows_run_and_runs_first_after_them(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    late = question(tiny_hf_engine, "Hi")

    async def scenario(engine: HFEngine) -> list[list[int]]:
        tasks = await start_two(engine)
        tasks.append(asyncio.ensure_future(engine.generate(late, SHORT)))
        await settled(tasks)
        return [task.result().ids for task in tasks]

    expected = lone_ids(alone, [*((p, RUNNING) for p in running_prompts(tiny_hf_engine)), (late, SHORT)])
    engine = engine_with(tiny_hf_engine, join_wait_steps=NEVER)
    try:
        assert run(scenario(engine)) == expected
        assert engine.joined_requests == 0 and engine.joins == 0, "1 waiting < 1.0 x 2 running: it must not join"
        assert dict(engine.batch_sizes) == {2: 1, 1: 1}, "it ran in the next batch"
    finally:
        run(engine.close())

    at_once = engine_with(tiny_hf_engine, join_ratio=0, join_wait_steps=0)  # the control: the rule is what waits
    try:
        assert run(scenario(at_once)) == expected
        assert at_once.joined_requests == 1 and dict(at_once.batch_sizes) == {2: 1}
    finally:
        run(at_once.close())


def test_arrivals_as_many_as_the_running_rows_join_together_in_one_prefill(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    later = [(question(tiny_hf_engine, "Hi"), SHORT), (question(tiny_hf_engine, "What is 2 + 2?"), SHORT)]

    async def scenario(engine: HFEngine) -> tuple[list[list[int]], int]:
        tasks = await start_two(engine)
        tasks.append(asyncio.ensure_future(engine.generate(*later[0])))
        await steps_pass(engine, 3)
        joined_while_alone = engine.joined_requests
        tasks.append(asyncio.ensure_future(engine.generate(*later[1])))
        await settled(tasks)
        return [task.result().ids for task in tasks], joined_while_alone

    engine = engine_with(tiny_hf_engine, join_wait_steps=NEVER)
    try:
        ids, joined_while_alone = run(scenario(engine))
        assert ids == lone_ids(alone, [*((p, RUNNING) for p in running_prompts(tiny_hf_engine)), *later])
        assert joined_while_alone == 0, "the first arrival waited for a second"
        assert engine.joined_requests == 2 and engine.joins == 1, "both joined, in one prefill"
        assert dict(engine.batch_sizes) == {2: 1}
    finally:
        run(engine.close())


def test_a_lone_arrival_joins_once_it_has_waited_join_wait_steps(tiny_hf_engine: HFEngine, alone: HFEngine) -> None:
    late = question(tiny_hf_engine, "Hi")

    async def scenario(engine: HFEngine) -> tuple[list[int], bool]:
        tasks = await start_two(engine)
        async with asyncio.timeout(60):
            answer = await engine.generate(late, SHORT)
        running_still = not any(task.done() for task in tasks)
        await settled(tasks)
        return answer.ids, running_still

    engine = engine_with(tiny_hf_engine, join_wait_steps=3)
    try:
        ids, running_still = run(scenario(engine))
        assert ids == lone_ids(alone, [(late, SHORT)])[0]
        assert engine.joined_requests == 1 and engine.joins == 1 and dict(engine.batch_sizes) == {2: 1}
        assert running_still, "it joined and was answered while the two rows still ran"
    finally:
        run(engine.close())


def test_a_request_waiting_to_join_is_answered_after_close_and_skipped_once_its_caller_gave_up(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    late = question(tiny_hf_engine, "Hi")

    async def close_while_it_waits(engine: HFEngine) -> list[int]:
        tasks = await start_two(engine)
        waiting = asyncio.ensure_future(engine.generate(late, SHORT))
        await steps_pass(engine, 2)
        async with asyncio.timeout(60):  # a waiting request left behind would hang here
            await engine.close(timeout_s=None)  # sent before close(): it runs, after the batch it waited on
            await asyncio.wait(tasks)
            return (await waiting).ids

    engine = engine_with(tiny_hf_engine, join_wait_steps=NEVER)
    assert run(close_while_it_waits(engine)) == lone_ids(alone, [(late, SHORT)])[0]
    assert engine.joined_requests == 0 and dict(engine.batch_sizes) == {2: 1, 1: 1}

    async def give_up_while_it_waits(engine: HFEngine) -> None:
        tasks = await start_two(engine)
        waiting = asyncio.ensure_future(engine.generate(late, SHORT))
        await steps_pass(engine, 2)
        waiting.cancel()
        async with asyncio.timeout(60):
            await asyncio.wait(tasks)
            await engine.generate(question(engine, "Hello"), SHORT)  # the worker moved past the abandoned request

    engine = engine_with(tiny_hf_engine, join_wait_steps=NEVER)
    try:
        run(give_up_while_it_waits(engine))
        assert dict(engine.batch_sizes) == {2: 1, 1: 1}, "the abandoned request never ran (the 1 is the last one)"
        assert engine.joined_requests == 0
    finally:
        run(engine.close())


def test_a_request_waiting_to_join_fails_when_close_runs_out_of_time(tiny_hf_engine: HFEngine) -> None:
    long = SamplingParams(max_new_tokens=2_000, temperature=0.0)  # far more steps than close() will wait for

    async def close_at_once(engine: HFEngine) -> list[BaseException | None]:
        steps = engine.row_steps
        tasks = [asyncio.ensure_future(engine.generate(p, long)) for p in running_prompts(engine)]
        await until(lambda: engine.row_steps > steps, "the running batch never started")
        tasks.append(asyncio.ensure_future(engine.generate(question(engine, "Hi"), SHORT)))
        await steps_pass(engine, 2)
        async with asyncio.timeout(30):  # a waiting request left behind would hang here
            await engine.close(timeout_s=0)
            await asyncio.wait(tasks)
        return [task.exception() for task in tasks]

    engine = engine_with(tiny_hf_engine, join_wait_steps=NEVER)
    *running, waiting = run(close_at_once(engine))
    assert all(isinstance(e, EngineUnavailable) and "while this request ran" in str(e) for e in running)
    assert isinstance(waiting, EngineUnavailable) and "before this request ran" in str(waiting)
    assert engine.joined_requests == 0 and dict(engine.batch_sizes) == {2: 1}


@pytest.mark.parametrize("options", [{"join_ratio": -0.5}, {"join_wait_steps": -1}])
def test_the_join_rule_takes_no_negative_values(tiny_hf_engine: HFEngine, options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="join_ratio and join_wait_steps must be >= 0"):
        HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, **options)
