"""Server-sent events the way OpenAI streams chat completions: ``data: <json>\\n\\n`` per chunk, then
``data: [DONE]\\n\\n``; an error mid-stream is ``data: {"error": {...}}\\n\\n`` (the openai client raises it).

`EventStream` is the streaming response: it always closes its event generator and runs `on_close`, whether the
stream ended, failed or the client went away, so a request's slot and its trajectory record are never lost.
This module knows SSE framing and Starlette's streaming response; nothing about chat or agents.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any, Final

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from agent_runtime.serving.openai_wire import encode

__all__ = ["SSE_DONE", "EventStream", "sse_data"]

SSE_DONE: Final = b"data: [DONE]\n\n"

_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(payload: Any) -> bytes:
    """One SSE event carrying `payload` (a wire Struct or builtins) as JSON."""
    return b"data: " + encode(payload) + b"\n\n"


class EventStream(StreamingResponse):
    """`text/event-stream` response over an async generator of ready-made SSE frames."""

    def __init__(self, frames: AsyncGenerator[bytes], *, on_close: Callable[[], None] | None = None) -> None:
        super().__init__(frames, media_type="text/event-stream", headers=_HEADERS)
        self._frames = frames
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._frames.aclose()  # a client that left mid-stream: run the generator's cleanup now
            finally:
                if self._on_close is not None:
                    self._on_close()
