"""HFEngine's close() and cancelled requests, on the tiny random-weight Qwen3 with the real Qwen3 tokenizer: close()
lets what was sent run on within its timeout, then stops a running batch at its next step and fails what it had not
answered; a model stuck inside a forward pass cannot make close() hang; a request whose caller gave up before the
worker took it never runs, and the batch it would have joined gives its own ids; one whose caller gives up while it
runs (an engine timeout) leaves its batch at the next step instead of generating up to its budget."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_runtime.engines import hf
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.hf import HFEngine
from agent_runtime.errors import EngineUnavailable
from tests.agent_runtime.test_engine_hf import PoisonedModel, run
from tests.agent_runtime.test_engine_hf_join import question

SHORT = SamplingParams(max_new_tokens=8, temperature=0.0)
LONG = SamplingParams(max_new_tokens=1024, temperature=0.0)  # far longer than any test waits for


class HeldModel(PoisonedModel):
    """The real tiny model, except that forward pass number `hold_at` waits until `gate` opens, as a model stuck in a
    kernel would (`held` is set while it waits)."""

    def __init__(self, model: Any, hold_at: int) -> None:
        super().__init__(model, poison=-1)  # no id is -1: nothing is poisoned
        self.hold_at = hold_at
        self.calls = 0
        self.gate = threading.Event()
        self.held = threading.Event()

    def forward(self, input_ids: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.hold_at:
            self.held.set()
            if not self.gate.wait(60):
                raise RuntimeError("the test never opened the gate")
        return super().forward(input_ids, **kwargs)


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """Exceptions that escape a thread (the engine's worker must never let one out)."""
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    return errors


@pytest.fixture
def engine(tiny_hf_engine: HFEngine) -> Iterator[HFEngine]:
    fresh = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, join_running=False)
    yield fresh
    run(fresh.close())


async def started(engine: HFEngine, prompt: list[int], sampling: SamplingParams) -> asyncio.Task[Generation]:
    """Send a request and return once its batch has computed a step."""
    steps = engine.row_steps
    task = asyncio.ensure_future(engine.generate(prompt, sampling))
    while engine.row_steps == steps and not task.done():
        await asyncio.sleep(0.001)
    return task


async def queue_then_close(
    engine: HFEngine, first: asyncio.Future[Generation], queued: list[int]
) -> tuple[float, list[Generation | BaseException]]:
    """Queue `queued` behind the running `first`, close the engine with a 0.05 s timeout: how long close() took,
    and what both requests came to."""
    second = asyncio.ensure_future(engine.generate(queued, SHORT))
    await asyncio.sleep(0)  # in the queue, ahead of close()'s marker
    began = time.perf_counter()
    await engine.close(timeout_s=0.05)
    waited = time.perf_counter() - began
    return waited, list(await asyncio.gather(first, second, return_exceptions=True))


def test_close_lets_requests_already_sent_finish_within_its_timeout(engine: HFEngine, tiny_hf_engine: HFEngine) -> None:
    running, queued = question(engine, "Count to five."), question(engine, "Name a colour.")

    async def close_while_busy() -> list[Generation]:
        first = await started(engine, running, SHORT)
        second = asyncio.ensure_future(engine.generate(queued, SHORT))  # waits for the next batch (no joining)
        await asyncio.sleep(0)  # it is in the queue, ahead of close()'s marker
        await engine.close()
        return [first.result(), second.result()]

    answers = run(close_while_busy())
    expected = [run(tiny_hf_engine.generate(prompt, SHORT)).ids for prompt in (running, queued)]
    assert [a.ids for a in answers] == expected
    with pytest.raises(EngineUnavailable, match="closed"):
        run(engine.generate(running, SHORT))


def test_close_stops_a_running_batch_once_its_timeout_is_spent(
    engine: HFEngine, thread_errors: list[BaseException | None]
) -> None:
    running, queued = question(engine, "Count to a thousand."), question(engine, "Name a colour.")

    async def close_now() -> tuple[float, list[Generation | BaseException]]:
        return await queue_then_close(engine, await started(engine, running, LONG), queued)

    waited, (first, second) = run(close_now())
    print(f"\nclose() during a {LONG.max_new_tokens}-token generation with one queued: returned in {waited:.2f} s "
          f"after {engine.row_steps} row-steps; running: {first}; queued: {second}")  # fmt: skip
    assert waited < 3.0, f"close() took {waited:.1f} s"
    assert isinstance(first, EngineUnavailable) and "while this request ran" in str(first)
    assert isinstance(second, EngineUnavailable) and "before this request ran" in str(second)
    assert engine.row_steps < LONG.max_new_tokens // 2, "the batch should have stopped long before its budget"
    assert thread_errors == []


def test_a_model_stuck_in_a_forward_pass_cannot_make_close_hang(
    tiny_hf_engine: HFEngine, monkeypatch: pytest.MonkeyPatch, thread_errors: list[BaseException | None]
) -> None:
    monkeypatch.setattr(hf, "ABORT_GRACE_S", 0.2)
    model = HeldModel(tiny_hf_engine.model, hold_at=3)  # the prefill and one step run, the next one sticks
    engine = HFEngine(model, tiny_hf_engine.tokenizer, join_running=False)
    running, queued = question(engine, "Count to a thousand."), question(engine, "Name a colour.")

    async def close_while_stuck() -> tuple[float, list[Generation | BaseException]]:
        first = asyncio.ensure_future(engine.generate(running, LONG))
        assert await asyncio.to_thread(model.held.wait, 30), "the model never reached the held pass"
        return await queue_then_close(engine, first, queued)

    try:
        waited, (first, second) = run(close_while_stuck())
    finally:
        model.gate.set()  # the stuck pass returns: the worker sees the engine closed and ends
    print(f"\nclose() with a forward pass stuck (grace 0.2 s): returned in {waited:.2f} s; running: {first}")
    assert waited < 3.0, f"close() took {waited:.1f} s"
    assert isinstance(first, EngineUnavailable) and "did not return" in str(first)
    assert isinstance(second, EngineUnavailable) and "before this request ran" in str(second)
    worker = engine._worker
    assert worker is not None
    worker.join(10)
    assert not worker.is_alive(), "the worker should end once the stuck pass returns"
    assert thread_errors == [], "answering a request close() had failed must not raise in the worker"


def test_a_request_cancelled_before_the_worker_takes_it_never_runs(
    tiny_hf_engine: HFEngine, thread_errors: list[BaseException | None]
) -> None:
    model = HeldModel(tiny_hf_engine.model, hold_at=2)  # the running request's first decode step waits
    engine = HFEngine(model, tiny_hf_engine.tokenizer)  # joining on: the cancelled request would join
    running, given_up, later = (question(engine, text) for text in ("Count to five.", "Name a colour.", "Hi"))

    async def cancel_while_held() -> tuple[Generation, Generation]:
        first = asyncio.ensure_future(engine.generate(running, SHORT))
        assert await asyncio.to_thread(model.held.wait, 30), "the model never reached the held pass"
        second = asyncio.ensure_future(engine.generate(given_up, SHORT))
        await asyncio.sleep(0)  # queued while the worker is busy
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        model.gate.set()
        return await first, await engine.generate(later, SHORT)

    try:
        first, third = run(cancel_while_held())
    finally:
        model.gate.set()
        run(engine.close())
    assert first.ids == run(tiny_hf_engine.generate(running, SHORT)).ids
    assert third.ids == run(tiny_hf_engine.generate(later, SHORT)).ids
    assert engine.joined_requests == 0, "the cancelled request must not have joined the running batch"
    assert dict(engine.batch_sizes) == {1: 2}, "two batches of one: the cancelled request ran in neither"
    assert thread_errors == []


def test_a_running_request_whose_caller_gives_up_leaves_its_batch(
    tiny_hf_engine: HFEngine, thread_errors: list[BaseException | None]
) -> None:
    model = HeldModel(tiny_hf_engine.model, hold_at=3)  # the prefill and one step run, the next one waits
    engine = HFEngine(model, tiny_hf_engine.tokenizer)
    running, later = question(engine, "Count to a thousand."), question(engine, "Hi")

    async def give_up_while_running() -> Generation:
        first = asyncio.ensure_future(engine.generate(running, LONG))
        assert await asyncio.to_thread(model.held.wait, 30), "the model never reached the held pass"
        first.cancel()  # as an engine timeout does
        with pytest.raises(asyncio.CancelledError):
            await first
        model.gate.set()
        return await engine.generate(later, SHORT)

    try:
        answer = run(give_up_while_running())
    finally:
        model.gate.set()
        run(engine.close())
    assert answer.ids == run(tiny_hf_engine.generate(later, SHORT)).ids
    assert engine.abandoned_requests == 1
    # 3 steps of the abandoned row (the held one included), then at most the 8 of the later request
    assert engine.row_steps <= 3 + SHORT.max_new_tokens, f"{engine.row_steps} rows computed"
    assert thread_errors == []


def test_an_engine_timeout_stops_the_generation_it_gave_up_on(tiny_hf_engine: HFEngine) -> None:
    from agent_runtime.engine_call import EngineFailure, call_engine

    model = HeldModel(tiny_hf_engine.model, hold_at=3)
    engine = HFEngine(model, tiny_hf_engine.tokenizer)
    prompt = question(engine, "Count to a thousand.")

    async def time_out() -> Generation | EngineFailure:
        outcome = await call_engine(engine, prompt, LONG, timeout_s=0.05)
        model.gate.set()
        return outcome

    try:
        outcome = run(time_out())
        run(engine.close(timeout_s=5.0))  # the worker ends once its batch has (at most 5 s: then close() stops it)
    finally:
        model.gate.set()
    print(f"\na {LONG.max_new_tokens}-token generation timed out by call_engine: {engine.row_steps} row-steps "
          f"computed, abandoned_requests={engine.abandoned_requests}")  # fmt: skip
    assert isinstance(outcome, EngineFailure) and outcome.code == "engine_timeout"
    assert engine.abandoned_requests == 1
    assert engine.row_steps <= 3, f"the timed-out row went on: {engine.row_steps} rows computed"
