"""`unless_disconnected`: run a non-streaming completion while watching its client, and cancel it when the client
hangs up.

Once a request's body is read, the ASGI ``receive`` channel has one message left to give: ``http.disconnect``,
which uvicorn sends as soon as the client's socket closes. Nothing else listens for it while a plain (not
streamed) completion runs, so a client that gave up used to leave its request running to the end for nobody:
its concurrency slot held, its engine generating to `max_new_tokens` (four abandoned requests against
``--max-concurrency 4`` refused every other client with 429 for as long as they ran). Here the completion runs
in the request's own task while one watcher task listens on that channel. A disconnect cancels the request's
task, so the completion unwinds where it stands, and by the time `ClientGone` is raised the engine call was
cancelled (the hf engine drops the row from its batch, the openai engine closes its upstream connection, vLLM
aborts the request) and the caller's ``finally`` frees the slot. The cancellation is the watcher's to take back
(`Task.uncancel`), so the handler goes on to answer 499; one that also came from outside (the server stopping)
still propagates. A completion that ends first cancels the watcher. (The completion used to run as a task of its
own, raced against the watcher with `asyncio.wait`: two tasks and a wait per request, about 10 us more in a
micro-benchmark with 16 concurrent handlers.) Streams need none of this: their response listens for the
disconnect itself.

With ``watch_after_s`` (the server passes `WATCH_AFTER_S`), a completion gets its watcher only once it has run that
long: an `agent_env.Alarm` starts it, one loop timer a window shared by all the completions then running, and a
completion that ends first only cancels its alarm. Most completions end well before (an agent-mode episode on a
fast engine takes about a millisecond), and a watcher task made, run to its first wait and cancelled for each of
them was 2-17 us of such a request's 390-410 us of server CPU in process (`bench/bench_serve_parts.py --baseline`,
three runs). What that costs a client that hangs up: its completion is cancelled 50 to 60 ms after it started
instead of at once, when it hangs up within that time; later than that, at once as before.

This module knows ASGI's receive channel, asyncio tasks and `Alarm`; nothing about completions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Final

import structlog
from starlette.types import Receive

from agent_env import Alarm

__all__ = ["WATCH_AFTER_S", "ClientGone", "unless_disconnected"]

logger = structlog.get_logger(__name__)

WATCH_AFTER_S: Final = 0.05
"""How long the server's plain completions run before their client is watched (an `Alarm`: up to 10 ms later)."""


class ClientGone(Exception):
    """The client hung up while its completion ran; the completion was cancelled and has unwound."""


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (after the body, `receive` has nothing else to say)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _Watch:
    """One completion's watcher: a task that listens on `receive` and cancels `handler` when the client goes."""

    __slots__ = ("cut_at", "gone", "handler", "receive", "task")

    def __init__(self, handler: asyncio.Task[Any], receive: Receive) -> None:
        self.handler, self.receive = handler, receive
        self.gone = False
        self.cut_at = 0.0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._listen())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()  # not awaited: it has nothing to clean up, and the loop finishes it

    async def _listen(self) -> None:
        # It runs only while the handler waits inside its work: the handler's `finally` cancels it before it can
        # run again, and a cancelled task resumes with CancelledError, even one whose message had already arrived
        # (or never runs at all, cancelled before its first step).
        await _disconnected(self.receive)
        self.gone, self.cut_at = True, asyncio.get_running_loop().time()
        self.handler.cancel()


async def unless_disconnected[T](
    receive: Receive, work: Coroutine[Any, Any, T], *, watch_after_s: float | None = None
) -> T:
    """`work`'s result, or `ClientGone` once the client behind `receive` hangs up (`work` then cancelled and
    unwound). Call it only after the request's body has been read in full, from the request's own task. The
    client is watched from the start, or once `work` has run `watch_after_s` (module docstring)."""
    handler = asyncio.current_task()
    if handler is None:  # pragma: no cover - always called from a request handler's task
        raise RuntimeError("unless_disconnected must run in a task")
    watch = _Watch(handler, receive)
    alarm = None
    if watch_after_s is None:
        watch.start()
    else:
        alarm = Alarm(watch_after_s, watch.start)
    try:
        result = await work
    except asyncio.CancelledError:
        if not watch.gone or handler.uncancel() > 0:  # a cancellation from outside (the server stopping): it goes on
            raise
    except Exception as e:
        if not watch.gone:
            raise
        # it failed while unwinding from the disconnect: nobody is left to tell but the log
        handler.uncancel()
        logger.warning("cancelled_request_failed", error_type=type(e).__name__, error=str(e)[:500])
    else:
        if not watch.gone:
            return result
        handler.uncancel()  # it swallowed the cancellation and finished: there is nobody to give the answer to
    finally:
        if alarm is not None:
            alarm.cancel()
        watch.stop()
    unwound_s = asyncio.get_running_loop().time() - watch.cut_at
    logger.info("client_gone_request_cancelled", unwound_s=round(unwound_s, 3))
    raise ClientGone("the client hung up before its completion was ready; the completion was cancelled")
