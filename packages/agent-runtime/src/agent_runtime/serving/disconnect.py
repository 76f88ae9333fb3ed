"""`unless_disconnected`: run a non-streaming completion while watching its client, and cancel it when the client
hangs up.

Once a request's body is read, the ASGI ``receive`` channel has one message left to give: ``http.disconnect``,
which uvicorn sends as soon as the client's socket closes. Nothing else listens for it while a plain (not
streamed) completion runs, so a client that gave up used to leave its request running to the end for nobody:
its concurrency slot held, its engine generating to `max_new_tokens` (four abandoned requests against
``--max-concurrency 4`` refused every other client with 429 for as long as they ran). Here the completion runs
as a task beside a watcher of that channel; whichever ends first wins. A disconnect cancels the completion and
waits for it to unwind, so by the time `ClientGone` is raised the engine call was cancelled (the hf engine drops
the row from its batch, the openai engine closes its upstream connection, vLLM aborts the request) and the
caller's ``finally`` frees the slot. Streams need none of this: their response listens for the disconnect itself.

This module knows ASGI's receive channel and asyncio tasks; nothing about completions.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    awaited). Call it only after the request's body has been read in full."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself was cancelled (the server is stopping): so is the work
        task.cancel()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if task.done():
        return task.result()  # it finished first: its answer (or its exception), as if awaited directly
    task.cancel()
    started = asyncio.get_running_loop().time()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception as e:  # it failed while unwinding: nobody is left to tell but the log
        logger.warning("cancelled_request_failed", error_type=type(e).__name__, error=str(e)[:500])
    logger.info("client_gone_request_cancelled", unwound_s=round(asyncio.get_running_loop().time() - started, 3))
    raise ClientGone("the client hung up before its completion was ready; the completion was cancelled")
