"""`deadline`: asyncio.timeout's behaviour (checked side by side with it), shared timers, bounded lateness."""

from __future__ import annotations

import asyncio
import functools
import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from agent_env import deadlines
from agent_env.deadlines import MIN_GRAIN_S, Alarm, deadline
from agent_env.deadlines import _timers_of as timers_of

TIMEOUTS: list[Callable[[float | None], Any]] = [asyncio.timeout, deadline]


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["asyncio.timeout", "deadline"])
def test_a_block_past_its_time_raises_timeout_error_and_the_task_goes_on(
    timeout: Callable[[float | None], Any],
) -> None:
    async def main() -> tuple[float, int, str]:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError):
            async with timeout(0.05):
                await asyncio.sleep(5)
        took = time.perf_counter() - t0
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0)  # no cancellation is left pending on the task
        return took, task.cancelling(), "still running"

    took, cancelling, state = asyncio.run(main())
    assert 0.05 <= took < 0.05 + MIN_GRAIN_S + 0.5
    assert cancelling == 0
    assert state == "still running"


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["asyncio.timeout", "deadline"])
def test_a_block_in_time_is_untouched(timeout: Callable[[float | None], Any]) -> None:
    async def main() -> str:
        async with timeout(5):
            await asyncio.sleep(0.01)
            value = "done"
        async with timeout(None):
            await asyncio.sleep(0.01)
        return value

    assert asyncio.run(main()) == "done"


def cancel_from_outside(timeout: Callable[[float | None], Any], seconds: float, *, overrun_s: float = 0.0) -> None:
    """Cancel a task from outside while it is inside `timeout(seconds)`, after it ran `overrun_s` without
    yielding; the task must end with CancelledError."""

    async def worker(entered: asyncio.Event) -> None:
        async with timeout(seconds):
            entered.set()
            time.sleep(overrun_s)
            await asyncio.sleep(5)

    async def main() -> None:
        entered = asyncio.Event()
        task = asyncio.create_task(worker(entered))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["asyncio.timeout", "deadline"])
def test_a_cancellation_from_outside_stays_a_cancellation(timeout: Callable[[float | None], Any]) -> None:
    cancel_from_outside(timeout, 5)


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["asyncio.timeout", "deadline"])
def test_an_outside_cancellation_that_meets_the_deadline_is_not_a_timeout(
    timeout: Callable[[float | None], Any],
) -> None:
    # past the deadline without yielding: both cancellations are pending at once
    cancel_from_outside(timeout, 0.05, overrun_s=0.2)


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["asyncio.timeout", "deadline"])
def test_nested_the_inner_one_fires_and_the_outer_one_goes_on(timeout: Callable[[float | None], Any]) -> None:
    async def main() -> list[str]:
        seen = []
        async with timeout(5):
            try:
                async with timeout(0.02):
                    await asyncio.sleep(5)
            except TimeoutError:
                seen.append("inner timed out")
            await asyncio.sleep(0.01)
            seen.append("outer finished")
        return seen

    assert asyncio.run(main()) == ["inner timed out", "outer finished"]


def test_many_blocks_share_timers_and_leave_none_behind() -> None:
    async def one(index: int) -> str:
        try:
            async with deadline(0.1):
                await asyncio.sleep(0.01 if index % 2 else 5)
            return "in time"
        except TimeoutError:
            return "timed out"

    async def main() -> tuple[list[str], int, int]:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(one(i)) for i in range(1000)]
        await asyncio.sleep(0)
        windows = len(timers_of(loop).due)  # one timer each
        results = await asyncio.gather(*tasks)
        await asyncio.sleep(0.05)
        return results, windows, len(timers_of(loop).due)

    results, windows, left = asyncio.run(main())
    assert results.count("in time") == 500 and results.count("timed out") == 500
    assert 1 <= windows <= 3  # the 1,000 deadlines entered within a few ms fall in one or two 10 ms windows
    assert left == 0


def test_a_long_deadline_fires_late_by_at_most_one_percent() -> None:
    async def main() -> float:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError):
            async with deadline(1.0):
                await asyncio.sleep(5)
        return time.perf_counter() - t0

    took = asyncio.run(main())
    assert 1.0 <= took < 1.0 + 0.01 + 0.3  # its window, and a loaded machine's scheduling


def test_deadline_needs_a_task() -> None:
    async def main() -> None:
        async with deadline(1):
            pass

    coroutine = main()
    with pytest.raises(RuntimeError):  # no running loop, so no task
        coroutine.send(None)
    coroutine.close()


# -- Alarm: the shared timer by itself ---------------------------------------------------------------------------


def test_an_alarm_rings_once_not_early_and_a_cancelled_one_never() -> None:
    async def main() -> tuple[list[tuple[str, float]], bool, bool]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        rung: list[tuple[str, float]] = []
        kept = Alarm(0.05, lambda: rung.append(("kept", loop.time() - t0)))
        dropped = Alarm(0.05, lambda: rung.append(("dropped", loop.time() - t0)))
        dropped.cancel()
        dropped.cancel()  # twice is harmless
        pending_before = kept.pending
        await asyncio.sleep(0.2)
        return rung, pending_before, kept.pending

    rung, pending_before, pending_after = asyncio.run(main())
    assert [name for name, _ in rung] == ["kept"]
    assert 0.05 <= rung[0][1] < 0.05 + MIN_GRAIN_S + 0.1  # its window, and a loaded machine's scheduling
    assert pending_before and not pending_after


def test_a_failing_alarm_is_reported_and_the_rest_of_its_window_still_rings() -> None:
    async def main() -> tuple[list[int], list[dict[str, object]]]:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, object]] = []
        loop.set_exception_handler(lambda loop, context: reported.append(context))
        rung: list[int] = []

        def fail() -> None:
            raise ValueError("a broken callback")

        for index in range(5):  # all five fall in one 10 ms window
            Alarm(0.02, fail if index == 2 else functools.partial(rung.append, index))
        await asyncio.sleep(0.1)
        return rung, reported

    rung, reported = asyncio.run(main())
    assert sorted(rung) == [0, 1, 3, 4]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], ValueError)


def test_an_alarm_cancelled_by_another_of_its_window_never_rings() -> None:
    async def main() -> tuple[list[str], list[dict[str, object]]]:
        reported: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
        rung: list[str] = []
        alarms: dict[str, Alarm] = {}

        def ring(name: str) -> None:
            rung.append(name)
            for other in alarms.values():  # the first to ring cancels all the others, then sets one more
                other.cancel()
            alarms["later"] = Alarm(0.02, functools.partial(rung.append, "later"))

        for name in ("a", "b", "c", "d"):  # all four fall in one 10 ms window
            alarms[name] = Alarm(0.02, functools.partial(ring, name))
        await asyncio.sleep(0.15)
        return rung, reported

    rung, reported = asyncio.run(main())
    assert len(rung) == 2 and rung[0] in "abcd" and rung[1] == "later", rung
    assert reported == []  # the window's set changed while it rang, and nothing broke


def test_an_alarm_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        Alarm(1, lambda: None)


class NoAttributeLoop(asyncio.SelectorEventLoop):
    """A loop that refuses the attribute the timers are kept in, as a loop without a ``__dict__`` would."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == deadlines._ATTRIBUTE:
            raise AttributeError(name)
        super().__setattr__(name, value)


def test_a_loop_that_takes_no_attributes_keeps_its_timers_in_the_weak_map_and_is_not_kept_alive_by_them() -> None:
    loop = NoAttributeLoop()
    rang: list[str] = []

    async def main() -> None:
        Alarm(0.01, lambda: rang.append("rang"))
        await asyncio.sleep(0.05)

    loop.run_until_complete(main())
    assert rang == ["rang"]
    assert loop in deadlines._timers and not hasattr(loop, deadlines._ATTRIBUTE)
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert gone() is None  # the map's value (the loop's timers) does not hold its key alive
