"""Run blocking work on its own daemon thread and await it from asyncio.

Why not `asyncio.to_thread`: a tool that hangs forever would hold one of the default executor's few workers
(six on a two-core machine) for good, so a handful of hung tools would stall every later `to_thread` in the
process, sibling episodes included; and `asyncio.run` joins that executor at exit, so one hung thread would
hang the program's shutdown. Here each call gets a fresh daemon thread: a caller that stops waiting (a
timeout) gets control back at once, the abandoned thread finishes or dies with the process, and nothing else
waits for it. The thread is leaked, not killed: Python cannot kill a thread.

This module knows nothing about tools; it runs a callable.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable

__all__ = ["run_in_daemon_thread"]


async def run_in_daemon_thread[T](fn: Callable[[], T], *, name: str = "agent-env-worker") -> T:
    """Run `fn()` on a new daemon thread (with the caller's contextvars) and return its result.

    Cancelling the awaiting coroutine returns immediately; the thread keeps running until `fn` returns,
    and its result is then dropped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def deliver_result(value: T) -> None:
        if not future.done():
            future.set_result(value)

    def deliver_error(error: BaseException) -> None:
        if not future.done():
            future.set_exception(error)

    def post(callback: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            loop.call_soon_threadsafe(callback)

    def target() -> None:
        try:
            value = context.run(fn)
        except Exception as error:
            post(functools.partial(deliver_error, error))
        except BaseException as error:  # SystemExit and friends cannot be set on a future as they are
            wrapped = RuntimeError(f"{type(error).__name__} raised in a worker thread: {error}")
            post(functools.partial(deliver_error, wrapped))
        else:
            post(functools.partial(deliver_result, value))

    threading.Thread(target=target, name=name, daemon=True).start()
    return await future
