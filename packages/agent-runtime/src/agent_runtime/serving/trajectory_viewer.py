"""The trajectory viewer's routes, and `create_viewer_app`: the viewer alone, over trajectory files, no model.

Routes:

- ``GET /viewer``: the page (``static/viewer.html`` and ``viewer.js``: plain HTML and JavaScript, no build step).
- ``GET /trajectories?offset=&limit=&min_reward=&max_reward=&stop_reason=&error_code=&task_key=&file=``: a page
  of record summaries (`TrajectoryFiles.page`): ``items``, ``next_offset``, ``done``, the files, and the count
  (and first line numbers) of the malformed lines met so far.
- ``GET /trajectories/{id}``: one record as the page draws it (`trajectory_view`).

A served agent (`create_app`) carries these routes over its own ``--trajectory-log`` (behind its API key, when it
has one, as ``/metrics`` is); ``uv run apps/serve --trajectories PATH`` serves them alone (`create_viewer_app`),
``/`` then being the viewer. Errors are the server's OpenAI-shaped ones: 400 naming the bad parameter, 404 for an
id the index never gave. Files are read off the event loop. This module knows HTTP; the files are
`trajectory_files.py`'s business.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_protocol import Tokenizer
from agent_runtime.serving.api_error import ApiError
from agent_runtime.serving.trajectory_files import MAX_PAGE, TrajectoryFiles, TrajectoryFilesError, TrajectoryFilter

__all__ = ["VIEWER_STATIC", "create_viewer_app", "viewer_routes"]

VIEWER_STATIC: Final = {
    "viewer.html": "text/html; charset=utf-8",
    "viewer.js": "text/javascript; charset=utf-8",
    "viewer.css": "text/css; charset=utf-8",
}
_JSON: Final = "application/json"
_encoder: Final = msgspec.json.Encoder()

Authorize = Callable[[Request], None]


def _int(request: Request, name: str, default: int, low: int, high: int | None = None) -> int:
    value = _optional_int(request, name, low, high)
    return default if value is None else value


def _optional_int(request: Request, name: str, low: int, high: int | None = None) -> int | None:
    value = _number(request, name, int, "an integer")
    if value is not None and (value < low or (high is not None and value > high)):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ApiError(400, f"`{name}` must be {bounds}, got {value}", param=name, code="invalid_value")
    return value


def _float(request: Request, name: str) -> float | None:
    return _number(request, name, float, "a finite number")


def _number[N: (int, float)](request: Request, name: str, kind: type[N], what: str) -> N | None:
    """The query parameter `name` as a `kind` (None when absent or empty); a 400 naming it when it is not one."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        raise ApiError(400, f"`{name}` must be {what}, got {raw!r}", param=name, code="invalid_value")
    return value


def _text(request: Request, name: str) -> str | None:
    raw = request.query_params.get(name)
    return raw if raw else None


def _filter(request: Request) -> TrajectoryFilter:
    return TrajectoryFilter(
        min_reward=_float(request, "min_reward"),
        max_reward=_float(request, "max_reward"),
        stop_reason=_text(request, "stop_reason"),
        error_code=_text(request, "error_code"),
        task_key=_text(request, "task_key"),
        file=_optional_int(request, "file", 0),
    )


def _static(name: str, folder: Any) -> Callable[[Request], Awaitable[Response]]:
    body = (folder / name).read_bytes()

    async def endpoint(request: Request) -> Response:
        return Response(body, media_type=VIEWER_STATIC[name], headers={"Cache-Control": "no-cache"})

    return endpoint


def viewer_routes(files: TrajectoryFiles, authorize: Authorize | None = None, *, root: bool = False) -> list[Route]:
    """The viewer's routes over `files`; `authorize` (the server's key check) guards the data routes; with
    `root`, ``/`` is the viewer too."""

    def check(request: Request) -> None:
        if authorize is not None:
            authorize(request)

    async def page(request: Request) -> Response:
        check(request)
        offset = _int(request, "offset", 0, 0)
        limit = _int(request, "limit", 50, 1, MAX_PAGE)
        where = _filter(request)
        try:
            result = await asyncio.to_thread(files.page, offset, limit, where)
        except TrajectoryFilesError as e:
            raise ApiError(400, str(e), code="invalid_value") from e
        return Response(_encoder.encode(result), media_type=_JSON)

    async def record(request: Request) -> Response:
        check(request)
        record_id = request.path_params["record_id"]
        try:
            view = await asyncio.to_thread(files.record, record_id)
        except TrajectoryFilesError as e:
            raise ApiError(404, str(e), param="id", code="trajectory_not_found") from e
        except OSError as e:  # the file went away, or cannot be read any more
            raise ApiError(404, f"trajectory {record_id!r} cannot be read: {e}", code="trajectory_not_found") from e
        return Response(_encoder.encode(view), media_type=_JSON)

    folder = resources.files("agent_runtime.serving") / "static"
    routes = [
        Route("/trajectories", page, methods=["GET"]),
        Route("/trajectories/{record_id:path}", record, methods=["GET"]),
        Route("/viewer", _static("viewer.html", folder), methods=["GET"]),
        *[Route(f"/static/{name}", _static(name, folder), methods=["GET"]) for name in VIEWER_STATIC],
    ]
    if root:
        routes.append(Route("/", _static("viewer.html", folder), methods=["GET"]))
    return routes


async def _api_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ApiError):  # pragma: no cover - registered for ApiError only
        raise exc
    return Response(exc.body(), status_code=exc.status, media_type=_JSON, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):  # pragma: no cover - registered for HTTPException only
        raise exc
    error = ApiError(exc.status_code, f"no route for {request.method} {request.url.path}", code="not_found")
    return Response(error.body(), status_code=error.status, media_type=_JSON)


def create_viewer_app(path: str | Path, *, tokenizer: Tokenizer | None = None) -> Starlette:
    """The viewer alone over the trajectory files at `path` (a JSONL file or a directory of them): no model, no
    chat. `tokenizer` decodes each token into its piece (without one, tokens show their ids). Raises
    `TrajectoryFilesError` when `path` does not exist."""
    files = TrajectoryFiles(path, tokenizer=tokenizer)

    async def health(request: Request) -> Response:
        return Response(_encoder.encode({"status": "ok", "trajectories": str(files.root)}), media_type=_JSON)

    routes = [*viewer_routes(files, root=True), Route("/health", health, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={ApiError: _api_error, HTTPException: _http_error})
