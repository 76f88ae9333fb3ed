"""`unless_disconnected` on its own: the completion runs in the caller's task and one watcher cancels it when the
ASGI channel says ``http.disconnect``. What must hold whatever the timing: the answer when the work ends first,
`ClientGone` with the work unwound when the client goes first, an outside cancellation (the server stopping)
never swallowed, and no cancellation left behind on the handler's task (its next await must not raise).

The live-server tests (`test_disconnects.py`) check the same through uvicorn with real sockets; these pin the
races a socket cannot time."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from agent_env.deadlines import _timers_of as timers_of
from agent_runtime.serving.disconnect import ClientGone, unless_disconnected


def in_a_loop(case: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The case run on a fresh event loop (the project's tests drive asyncio themselves, no plug-in)."""

    @functools.wraps(case)
    def test(*args: Any, **kwargs: Any) -> None:
        asyncio.run(case(*args, **kwargs))

    return test


class Channel:
    """An ASGI receive channel after the body: it answers only when the test says the client went."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive(self) -> dict[str, Any]:
        return await self.messages.get()

    def hang_up(self) -> None:
        self.messages.put_nowait({"type": "http.disconnect"})


class Work:
    """A completion that waits on `release`; it notes whether it was cancelled and whether it unwound."""

    def __init__(self, *, swallow: bool = False, fail_on_cancel: bool = False) -> None:
        self.release: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.started = asyncio.Event()
        self.cancelled = False
        self.unwound = False
        self.swallow = swallow
        self.fail_on_cancel = fail_on_cancel

    async def run(self) -> str:
        self.started.set()
        try:
            return await self.release
        except asyncio.CancelledError:
            self.cancelled = True
            if self.fail_on_cancel:
                raise RuntimeError("the cleanup broke") from None
            if self.swallow:
                return "finished anyway"
            raise
        finally:
            self.unwound = True


async def _hang_up_once_started(channel: Channel, work: Work) -> None:
    """The client hangs up while the work runs."""
    await work.started.wait()
    channel.hang_up()


async def _settled() -> None:
    """The handler's task can still await: no cancellation was left pending on it."""
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    for _ in range(3):
        await asyncio.sleep(0)


def _watchers_left() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


@in_a_loop
async def test_the_answer_when_the_work_ends_first() -> None:
    channel, work = Channel(), Work()
    work.release.set_result("the answer")
    assert await unless_disconnected(channel.receive, work.run()) == "the answer"
    await _settled()
    assert not work.cancelled
    assert _watchers_left() == []  # the watcher was cancelled and the loop finished it


@in_a_loop
async def test_a_failure_of_the_work_is_raised_as_is() -> None:
    async def broken() -> str:
        raise ValueError("the engine said no")

    with pytest.raises(ValueError, match="the engine said no"):
        await unless_disconnected(Channel().receive, broken())
    await _settled()


@in_a_loop
async def test_a_client_that_hangs_up_cancels_the_work_and_gets_client_gone() -> None:
    channel, work = Channel(), Work()

    hanger = asyncio.ensure_future(_hang_up_once_started(channel, work))
    with pytest.raises(ClientGone):
        await unless_disconnected(channel.receive, work.run())
    assert work.cancelled and work.unwound  # unwound before ClientGone reached the caller
    await _settled()
    await hanger


@pytest.mark.parametrize("kind", ["swallows the cancellation", "fails while unwinding"])
@in_a_loop
async def test_work_that_does_not_end_cancelled_still_gives_client_gone(kind: str) -> None:
    channel = Channel()
    work = Work(swallow=kind == "swallows the cancellation", fail_on_cancel=kind == "fails while unwinding")

    hanger = asyncio.ensure_future(_hang_up_once_started(channel, work))
    with pytest.raises(ClientGone):
        await unless_disconnected(channel.receive, work.run())
    assert work.cancelled
    await _settled()
    await hanger


@in_a_loop
async def test_a_disconnect_as_the_work_ends_leaves_no_cancellation_behind() -> None:
    """The release and the disconnect land in the same loop iteration, in both orders: the handler either answers
    or gets ClientGone, and its task is never left with a stray cancellation either way."""
    for disconnect_first in (False, True):
        channel, work = Channel(), Work()

        async def handler(channel: Channel, work: Work) -> str:
            try:
                return await unless_disconnected(channel.receive, work.run())
            except ClientGone:
                return "gone"
            finally:
                await _settled()  # raises CancelledError if a cancellation was left on this task

        task = asyncio.ensure_future(handler(channel, work))
        await work.started.wait()
        if disconnect_first:
            channel.hang_up()
            work.release.set_result("the answer")
        else:
            work.release.set_result("the answer")
            channel.hang_up()
        assert await task in ("the answer", "gone")
        assert not task.cancelled()


@in_a_loop
async def test_an_outside_cancellation_is_never_swallowed() -> None:
    """The server stopping cancels the handler: the work is cancelled with it and the cancellation goes on, also
    when the client hangs up at the same moment."""
    for also_hang_up in (False, True):
        channel, work = Channel(), Work()
        task = asyncio.ensure_future(unless_disconnected(channel.receive, work.run()))
        await work.started.wait()
        if also_hang_up:
            channel.hang_up()
            await asyncio.sleep(0)  # the watcher runs and cancels first
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert work.cancelled and work.unwound
        await asyncio.sleep(0)
        assert _watchers_left() == []


# -- a deferred watch (the server's): the watcher starts only once the work has run `watch_after_s` ------------


@in_a_loop
async def test_deferred_work_that_ends_first_starts_no_watcher() -> None:
    made = _count_tasks()
    for _ in range(20):
        channel, work = Channel(), Work()
        work.release.set_result("the answer")
        assert await unless_disconnected(channel.receive, work.run(), watch_after_s=0.05) == "the answer"
    assert made() == 0  # no watcher task was made for any of them
    assert _alarms_left() == 0  # each cancelled its alarm as it ended
    await asyncio.sleep(0.12)  # the window's timer fires with nothing left to start
    assert not timers_of(asyncio.get_running_loop()).due and made() == 0
    assert _watchers_left() == []


@in_a_loop
async def test_deferred_a_client_that_hangs_up_at_once_is_noticed_after_the_grace() -> None:
    channel, work = Channel(), Work()
    channel.hang_up()  # gone before the work even starts
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(ClientGone):
        await unless_disconnected(channel.receive, work.run(), watch_after_s=0.05)
    waited = asyncio.get_running_loop().time() - t0
    assert work.cancelled and work.unwound
    assert 0.05 <= waited < 0.5, waited  # 50-60 ms on an idle loop (the alarm's window); the bound leaves room for CI
    await _settled()


@in_a_loop
async def test_deferred_a_long_completion_is_watched_and_cancelled_at_once() -> None:
    channel, work = Channel(), Work()
    task = asyncio.ensure_future(unless_disconnected(channel.receive, work.run(), watch_after_s=0.02))
    await work.started.wait()
    await asyncio.sleep(0.1)  # past the grace: its watcher listens now
    assert _alarms_left() == 0 and len(_watchers_left()) == 2  # the handler's task and its watcher
    t0 = asyncio.get_running_loop().time()
    channel.hang_up()
    with pytest.raises(ClientGone):
        await task
    assert asyncio.get_running_loop().time() - t0 < 0.02  # noticed on the next iterations, not at a sweep
    assert work.cancelled and work.unwound


@in_a_loop
async def test_deferred_an_outside_cancellation_is_never_swallowed() -> None:
    for wait_s in (0.0, 0.05):  # cancelled before its watcher starts, and after
        channel, work = Channel(), Work()
        task = asyncio.ensure_future(unless_disconnected(channel.receive, work.run(), watch_after_s=0.01))
        await work.started.wait()
        await asyncio.sleep(wait_s)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert work.cancelled and work.unwound
        await asyncio.sleep(0)
        assert _watchers_left() == [] and _alarms_left() == 0


def _alarms_left() -> int:
    """The running loop's alarms neither run nor cancelled (`agent_env.deadlines`' windows)."""
    return sum(len(window) for window in timers_of(asyncio.get_running_loop()).due.values())


def _count_tasks() -> Callable[[], int]:
    """From now on, count the tasks made on the running loop; the count, when called."""
    made = 0

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        nonlocal made
        made += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    asyncio.get_running_loop().set_task_factory(factory)
    return lambda: made
