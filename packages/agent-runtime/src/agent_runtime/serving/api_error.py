"""`ApiError`: an HTTP error answered in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and
the conversions from what can go wrong with a request (malformed JSON, a field of the wrong type, a malformed
message) into one, naming the offending field the way a user would write it (``messages[2].content``).

This module knows the error wire format and msgspec's and agent_protocol's validation errors; nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import msgspec

from agent_protocol import MessageError
from agent_runtime.serving.openai_wire import ErrorBody, ErrorDetail, encode

__all__ = ["ApiError", "from_decode_error", "from_message_error"]

_AT_PATH: Final = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING_FIELD: Final = re.compile(r"missing required field `(?P<field>[^`]+)`")


class ApiError(Exception):
    """Raised by request handling; the app answers it with `status` and the OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # OpenAI's field name
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def detail(self) -> ErrorDetail:
        return ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)

    def body(self) -> bytes:
        return encode(ErrorBody(error=self.detail()))


def _field_path(path: str) -> str | None:
    """`$.messages[0].role` -> `messages[0].role`; `$` -> None."""
    path = path.removeprefix(".")
    return path or None


def from_decode_error(error: msgspec.DecodeError) -> ApiError:
    """A body that is not JSON, or a field of the wrong type or out of range, as a 400 naming the field."""
    text = str(error)
    if not isinstance(error, msgspec.ValidationError):
        return ApiError(400, f"the request body is not valid JSON: {text}", code="invalid_json")
    param: str | None = None
    problem = text
    at = _AT_PATH.search(text)
    if at is not None:
        param = _field_path(at.group("path"))
        problem = text[: at.start()]
    missing = _MISSING_FIELD.search(problem)
    if missing is not None:
        param = f"{param}.{missing.group('field')}" if param else missing.group("field")
    where = f"`{param}`" if param else "the request body"
    return ApiError(400, f"invalid value for {where}: {problem}", param=param, code="invalid_value")


def from_message_error(error: MessageError) -> ApiError:
    """A malformed message or tool spec (see `agent_protocol.coerce_messages`) as a 400 naming the field."""
    return ApiError(
        400, f"invalid value for `{error.location}`: {error.problem}", param=error.location, code="invalid_value"
    )
