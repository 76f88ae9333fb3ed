"""Reading a request body under limits, before the request may take a concurrency slot.

`read_body` reads at most `max_bytes` (413 beyond it: refused from ``Content-Length`` before a byte of the body is
read, or as soon as a body without one streams past the cap) within `timeout_s` for the whole body (408 beyond
it: the deadline covers every read together, so a client that stalls mid-body or trickles a byte at a time is cut
off all the same). Both answers carry ``Connection: close``: the rest of that body is never read, so the
connection cannot serve another request.

This module knows Starlette's request stream and the two limits; nothing about chat completions.
"""

from __future__ import annotations

import asyncio
from typing import Final

from starlette.requests import Request

from agent_runtime.serving.api_error import ApiError

__all__ = ["read_body"]

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


async def read_body(request: Request, *, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body; raises `ApiError` 413 (over `max_bytes`) or 408 (not all there within `timeout_s`).
    A client that hangs up mid-body raises Starlette's `ClientDisconnect`."""
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
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise _too_large(max_bytes, f"over {max_bytes} bytes and still coming")
                chunks.append(chunk)
    except TimeoutError as e:
        raise ApiError(
            408,
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes came); "
            "send it whole and promptly (ServeConfig.request_read_timeout_s, `--request-read-timeout`)",
            code="request_timeout",
            headers=_CLOSE,
        ) from e
    return b"".join(chunks)
