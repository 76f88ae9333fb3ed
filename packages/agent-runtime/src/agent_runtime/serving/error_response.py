"""The HTTP answers of an `ApiError`, of a request no route takes, and of a request without the right key, in
OpenAI's error shape: one place for the serving app (`app.py`) and the agent programs' gateway
(`agent_runtime.proxy.gateway`), so that both answer a bad request with the same status, code and body.

This module knows Starlette's responses and the error wire format; nothing about chat completions.
"""

from __future__ import annotations

import hmac
from typing import Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from agent_runtime.serving.api_error import ApiError

__all__ = ["check_bearer", "error_response", "route_error"]

_JSON: Final = "application/json"


def error_response(error: ApiError) -> Response:
    """`error` as its status, headers and OpenAI error body."""
    return Response(error.body(), status_code=error.status, media_type=_JSON, headers=error.headers)


async def route_error(request: Request, exc: Exception) -> Response:
    """Starlette's `HTTPException` handler: no route (404), a route without that method (405), or another
    refusal of Starlette's, as an OpenAI error."""
    if not isinstance(exc, HTTPException):  # pragma: no cover - registered for HTTPException only
        raise exc
    kind = "not_found" if exc.status_code == 404 else "invalid_request"
    message = f"no route for {request.method} {request.url.path}" if exc.status_code in (404, 405) else exc.detail
    return error_response(ApiError(exc.status_code, message, code=kind, headers=exc.headers))


def check_bearer(request: Request, key: str) -> None:
    """Raise `ApiError` 401 unless `request` sends ``Authorization: Bearer <key>`` or, as Anthropic's clients do,
    ``x-api-key: <key>`` (compared in constant time)."""
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if not header and (other := request.headers.get("x-api-key")) is not None:
        scheme, given = "bearer", other
    elif not header:
        raise ApiError(
            401, "missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)",
            code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise ApiError(401, "incorrect API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
