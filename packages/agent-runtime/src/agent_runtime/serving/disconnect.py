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

This module knows ASGI's receive channel and asyncio tasks; nothing about completions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog
from starlette.types import Receive

__all__ = ["ClientGone", "unless_disconnected"]

logger = structlog.get_logger(__name__)


class ClientGone(Exception):
    """The client hung up while its completion ran; the completion was cancelled and has unwound."""


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (after the body, `receive` has nothing else to say)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected[T](receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result, or `ClientGone` once the client behind `receive` hangs up (`work` then cancelled and
    unwound). Call it only after the request's body has been read in full, from the request's own task."""
    handler = asyncio.current_task()
    if handler is None:  # pragma: no cover - always called from a request handler's task
        raise RuntimeError("unless_disconnected must run in a task")
    loop = asyncio.get_running_loop()
    gone = False
    cut_at = 0.0

    async def watch() -> None:
        # It runs only while the handler waits inside `work`: the handler's `finally` cancels it before it can run
        # again, and a cancelled task resumes with CancelledError, even one whose message had already arrived.
        nonlocal gone, cut_at
        await _disconnected(receive)
        gone, cut_at = True, loop.time()
        handler.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except asyncio.CancelledError:
        if not gone or handler.uncancel() > 0:  # a cancellation from outside (the server stopping): it goes on
            raise
    except Exception as e:
        if not gone:
            raise
        # it failed while unwinding from the disconnect: nobody is left to tell but the log
        handler.uncancel()
        logger.warning("cancelled_request_failed", error_type=type(e).__name__, error=str(e)[:500])
    else:
        if not gone:
            return result
        handler.uncancel()  # it swallowed the cancellation and finished: there is nobody to give the answer to
    finally:
        watcher.cancel()  # not awaited: it has nothing to clean up, and the loop finishes it
    logger.info("client_gone_request_cancelled", unwound_s=round(loop.time() - cut_at, 3))
    raise ClientGone("the client hung up before its completion was ready; the completion was cancelled")
