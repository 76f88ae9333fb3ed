"""Reading a request body under limits, before the request may take a concurrency slot.

`request_body` reads at most `max_bytes` (413 beyond it: refused from ``Content-Length`` before a byte of the body is
read, or as soon as a body without one streams past the cap) within `timeout_s` for the whole body (408 beyond
it, up to 1 % late: `agent_env.deadline`, which sets no timer per request; the deadline covers every read
together, so a client that stalls mid-body or trickles a byte at a time is cut off all the same). Both answers
carry ``Connection: close``: the rest of that body is never read, so the connection cannot serve another request.

Since bodies are read before the concurrency gate, the gate no longer bounds the memory they take; `BodyBudget`
does: every byte of every body being read or parsed is counted against one limit, and a body that would go past
it is answered 429 (``Retry-After: 1``, as the
concurrency gate answers) and dropped. A client that stalls holds only the bytes it sent.

This module knows Starlette's request stream and the two limits; nothing about chat completions.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import ClientDisconnect, Request

from agent_env import deadline
from agent_runtime.serving.api_error import ApiError

__all__ = ["BodyBudget", "request_body"]

_CLOSE: Final = {"Connection": "close"}
_MAX_LENGTH_DIGITS: Final = 18  # a Content-Length longer than this is over any cap (and int() stays cheap)


def _too_large(max_bytes: int, size: str) -> ApiError:
    return ApiError(
        413,
        f"the request body is {size}; this server accepts at most {max_bytes} bytes "
        "(ServeConfig.max_request_bytes, `--max-request-bytes`)",
        code="request_too_large",
        headers=_CLOSE,
    )


class BodyBudget:
    """The bytes of request bodies held at once, across every request being read or parsed. One event loop uses
    it; no locks."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def release(self, size: int) -> None:
        self.held -= size


class request_body:
    """The whole body, counted against `budget` until the block ends. Raises `ApiError` 413 (over `max_bytes`),
    408 (not all there within `timeout_s`) or 429 (`budget` spent); a client that hangs up mid-body raises
    Starlette's `ClientDisconnect`. (A class rather than an `asynccontextmanager`: one generator fewer on every
    request's path.)"""

    __slots__ = ("_budget", "_held", "_max_bytes", "_request", "_timeout_s")

    def __init__(self, request: Request, *, max_bytes: int, timeout_s: float, budget: BodyBudget) -> None:
        self._request, self._max_bytes, self._timeout_s, self._budget = request, max_bytes, timeout_s, budget
        self._held = 0

    async def __aenter__(self) -> bytes:
        body = await _read(self._request, max_bytes=self._max_bytes, timeout_s=self._timeout_s, budget=self._budget)
        self._held = len(body)
        return body

    async def __aexit__(self, *exc_info: object) -> None:
        self._budget.release(self._held)
        self._held = 0


async def _read(request: Request, *, max_bytes: int, timeout_s: float, budget: BodyBudget) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        declared = declared.strip()
        if not declared.isdigit() or len(declared) > _MAX_LENGTH_DIGITS:
            if declared.isdigit():
                raise _too_large(max_bytes, f"{declared[:40]}... bytes long (Content-Length)")
            raise ApiError(400, f"invalid Content-Length {declared[:40]!r}", code="invalid_request", headers=_CLOSE)
        if int(declared) > max_bytes:
            raise _too_large(max_bytes, f"{int(declared)} bytes long (Content-Length)")
    chunks: list[bytes] = []
    size = 0
    receive = request.receive  # read as Starlette's `request.stream()` reads, without its generator
    try:
        async with deadline(timeout_s):  # asyncio.timeout's behaviour without a timer per request (up to 1 % late)
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect
                chunk = message.get("body", b"")
                if size + len(chunk) > max_bytes:
                    raise _too_large(max_bytes, f"over {max_bytes} bytes and still coming")
                if not budget.take(len(chunk)):
                    raise ApiError(
                        429,
                        f"the server holds {budget.limit} bytes of request bodies already; retry shortly",
                        type="rate_limit_error",
                        code="server_overloaded",
                        headers={**_CLOSE, "Retry-After": "1"},
                    )
                size += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError as e:
        budget.release(size)
        raise ApiError(
            408,
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes came); "
            "send it whole and promptly (ServeConfig.request_read_timeout_s, `--request-read-timeout`)",
            code="request_timeout",
            headers=_CLOSE,
        ) from e
    except BaseException:  # gives the budget back and re-raises: a cleanup, not a boundary
        budget.release(size)
        raise
    return b"".join(chunks)
