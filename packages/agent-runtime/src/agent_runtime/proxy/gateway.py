"""`Gateway`: one listening HTTP server per rollout worker, through which programs in other processes (or any
client that takes only a base URL) reach their episodes' endpoints.

    async with Gateway() as gateway:                 # loopback, an ephemeral port; host/port for a cluster
        session = gateway.open(endpoint)             # an `EpisodeEndpoint` made on this loop
        session.base_url, session.key                # http://127.0.0.1:PORT/sessions/<id>/v1, the endpoint's key
        ...
        gateway.close(session)

Each episode is a session with an id (not a secret: it is in the URL) and a key (the secret: its endpoint's key,
compared with `hmac.compare_digest`). Routes:

- ``/sessions/{id}/v1/...``: handed to the session's `EpisodeEndpoint.serve`, so it is the same tools-mode app,
  with the same caps, request count and records, as an in-process program's; the gateway adds no turn logic.
- ``POST /sessions/{id}/end`` (optional body ``{"answer": "..."}``): the program says it is done; its episode
  ends normally with that answer (None without one). Once only (409 ``session_already_ended`` after).
- ``POST /sessions/{id}/reward`` (body ``{"reward": <finite number>}``): the program's own score of its episode,
  kept on the session (`GatewaySession.reward`) for the recipe's rewards (`run_program` puts it in the episode
  record's ``metadata["program_reward"]``). Once only (409 ``reward_already_posted``).

An unknown id is a 404 (``session_not_found``); a missing or wrong key a 401 (``invalid_api_key``), before the
session's endpoint sees anything (its request count does not move). A closed session keeps answering with its
endpoint's last word (503 ``episode_over``, or the 429 that ended it) for its last `closed_kept` sessions; older
ones are forgotten (404). Bodies are read under the serving app's limits (`request_body`: 413, 408, 429, with
`ServeConfig`'s defaults, or the gateway's `limits`; a client that hangs up mid-body gets the app's 499) and `/end`
and `/reward` bodies are checked as its own are (`check_json_body`, 400 ``invalid_json`` or ``invalid_value``); the
forwarded requests are then checked by the app itself. Every error is an `ApiError` in OpenAI's shape
(`serving.error_response`, shared with the serving app).

Streaming: a request goes to the endpoint as ASGI (`EpisodeEndpoint.serve`), so a streamed chat completion's
server-sent events reach the client as the app sends them.

Context: a session's requests run under the context variables of the task that opened it (the episode's), as an
in-process program's requests do, and the server's own tasks under an empty context. Without that, every request
carried the context of the episode whose first request happened to start the gateway, and the local trainer's
lockstep engine, which tells episodes apart by a context variable, held the whole round's requests as that one
episode's until its stall timer (120 s, the example's time budget too) went off.

The server is uvicorn's (the `proxy` and `serve` extras, imported when a gateway starts), started on the loop that calls
`start` (the rollout's, where the endpoints and the engine live); it takes no signal handlers (the trainer keeps
its own) and leaves the process's logging configuration alone. Why in-process function programs do not use it:
they need no port, and the ASGI hand-off skips the HTTP encoding and the socket (`endpoint.py`).

This module knows HTTP, the endpoint's `serve` and the serving app's limits; nothing about records or rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import math
import socket
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import msgspec
import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agent_runtime.proxy.endpoint import Answer, EpisodeEndpoint
from agent_runtime.serving import ServeConfig
from agent_runtime.serving.api_error import ApiError, from_decode_error
from agent_runtime.serving.error_response import check_bearer, error_response, route_error
from agent_runtime.serving.json_guard import check_json_body
from agent_runtime.serving.request_body import BodyBudget, request_body

__all__ = ["Gateway", "GatewayError", "GatewaySession"]

logger = structlog.get_logger(__name__)

_LIMITS: Final = ServeConfig(model_name="gateway")  # the serving app's body limits, as its defaults set them
_METHODS: Final = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_HOP_BY_HOP: Final = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})
_SCOPE_KEYS: Final = ("type", "asgi", "http_version", "method", "scheme", "server", "client", "headers",
                      "query_string", "extensions")  # fmt: skip  # what a request's scope says of it, no routing
_START_TIMEOUT_S: Final = 10.0
_WILDCARDS: Final = frozenset({"0.0.0.0", "::", ""})
_GONE: Final = Response(status_code=499)  # to a client that hung up mid-body, as the serving app answers it


class GatewayError(RuntimeError):
    """The gateway could not start (its address is taken, or not this machine's), or is used before it starts."""


class _EndBody(msgspec.Struct, forbid_unknown_fields=True):
    answer: str | None = None


class _RewardBody(msgspec.Struct, forbid_unknown_fields=True):
    reward: float


class GatewaySession:
    """One episode on the gateway: its `id`, `key` and `base_url` (what the program is given), its `endpoint`,
    `finished` (set to the answer by ``/end``) and `reward` (set by ``/reward``). `context`: the context variables
    of the task that opened it (the episode's), under which its requests run."""

    def __init__(self, endpoint: EpisodeEndpoint, url: str) -> None:
        self.context = contextvars.copy_context()
        self.id = uuid.uuid4().hex
        self.key = endpoint.key
        self.base_url = f"{url}/sessions/{self.id}/v1"
        self.endpoint = endpoint
        self.finished: asyncio.Future[str | None] = endpoint.loop.create_future()
        self.reward: float | None = None
        self.closed = False


class Gateway:
    """The listening server (see the module docstring). `host`/`port`: where it listens (loopback and a port the
    system picks by default); `advertised_host`: the host in the sessions' URLs (default: `host`, or this machine's
    address when `host` is a wildcard); `limits`: the request body limits (`ServeConfig`'s ``max_request_bytes``,
    ``request_read_timeout_s``, ``max_buffered_request_bytes``; the serving app's defaults). An async context
    manager, or `start()`/`stop()` on one loop."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised_host: str | None = None,
        closed_kept: int = 4096,
        limits: ServeConfig = _LIMITS,
    ) -> None:
        self.host = host
        self.port = port
        self.advertised_host = advertised_host
        self.closed_kept = closed_kept
        self._sessions: dict[str, GatewaySession] = {}
        self._closed: OrderedDict[str, tuple[str, Answer]] = OrderedDict()  # id -> (key, its last answer)
        self.limits = limits
        self._budget = BodyBudget(limits.max_buffered_request_bytes)
        self._server: Any = None
        self._serving: asyncio.Task[None] | None = None
        self._url: str | None = None
        self.app = Starlette(
            routes=[
                Route("/sessions/{sid}/v1/{path:path}", _Asgi(self._forward), methods=_METHODS),
                Route("/sessions/{sid}/end", self._end, methods=["POST"]),
                Route("/sessions/{sid}/reward", self._reward, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
            ],
            exception_handlers={ApiError: _api_error, HTTPException: route_error},
        )

    @property
    def url(self) -> str:
        """``http://HOST:PORT``, once started."""
        if self._url is None:
            raise GatewayError("the gateway is not started: `await gateway.start()` (or `async with gateway`)")
        return self._url

    @property
    def sessions(self) -> int:
        """The sessions open now."""
        return len(self._sessions)

    # -- lifetime ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (on the running loop, which must be the endpoints' loop)."""
        if self._serving is not None:
            raise GatewayError("the gateway is already started")
        config_class, server_class = _uvicorn()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise GatewayError(f"the gateway cannot listen on {self.host}:{self.port}: {e}") from e
        port = sock.getsockname()[1]
        host = self.advertised_host or (_this_host() if self.host in _WILDCARDS else self.host)
        config = config_class(  # log_config=None: the process's logging stays as its app configured it
            self.app, log_config=None, lifespan="off", access_log=False, timeout_graceful_shutdown=2
        )
        self._server = server_class(config)
        # a context of its own: the server's tasks must not carry the context of whichever episode started it
        serve = self._server.serve(sockets=[sock])
        self._serving = asyncio.create_task(serve, name="agent-gateway", context=contextvars.Context())
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):
                while not self._server.started:
                    if self._serving.done():
                        break
                    await asyncio.sleep(0.005)
        except TimeoutError:
            pass
        if not self._server.started:
            await self.stop()
            sock.close()
            raise GatewayError(f"the gateway did not start on {self.host}:{port}")
        self._url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        logger.info("gateway_started", url=self._url)

    async def stop(self) -> None:
        """Stop listening; open sessions stay with their endpoints (close those first)."""
        serving, self._serving = self._serving, None
        if serving is None or self._server is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):  # a server that failed to start has said why in its log
            await serving
        self._url = None
        logger.info("gateway_stopped", sessions=len(self._sessions))

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- sessions ---------------------------------------------------------------------------------------------

    def open(self, endpoint: EpisodeEndpoint) -> GatewaySession:
        """A session for `endpoint` (made on this gateway's loop)."""
        url = self.url
        if self._serving is not None and endpoint.loop is not self._serving.get_loop():
            raise GatewayError("the endpoint lives on another event loop than the gateway; start one per loop")
        session = GatewaySession(endpoint, url)
        self._sessions[session.id] = session
        return session

    def close(self, session: GatewaySession) -> None:
        """Take `session` off the gateway: its later requests get its endpoint's last answer (close the
        endpoint itself too: `EpisodeEndpoint.close`)."""
        if self._sessions.pop(session.id, None) is None:
            return
        session.closed = True
        if not session.finished.done():
            session.finished.cancel()
        self._closed[session.id] = (session.key, session.endpoint.over_answer())
        while len(self._closed) > self.closed_kept:
            self._closed.popitem(last=False)

    def _lookup(self, request: Request) -> GatewaySession | Answer:
        """The open session the request names, or a closed one's last answer; 404 or 401 otherwise."""
        sid = request.path_params["sid"]
        session = self._sessions.get(sid)
        key = session.key if session is not None else self._closed.get(sid, ("", None))[0]
        if not key:
            raise ApiError(404, f"no session {sid[:64]!r} on this gateway", code="session_not_found")
        check_bearer(request, key)
        if session is None:
            return self._closed[sid][1]
        if session.closed or session.endpoint.closed or session.endpoint.ended.done():
            return session.endpoint.over_answer()
        return session

    async def _body(self, request: Request) -> bytes | None:
        """The body, read under the limits; None if the client hung up before it was whole (nobody to answer: the
        serving app's 499, not an exception in the server's error log)."""
        try:
            async with request_body(
                request, max_bytes=self.limits.max_request_bytes, timeout_s=self.limits.request_read_timeout_s,
                budget=self._budget,
            ) as body:  # fmt: skip
                return body
        except ClientDisconnect:
            logger.info("client_disconnected", path=request.url.path)
            return None

    # -- routes -----------------------------------------------------------------------------------------------

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/sessions/{id}/v1/...`` (ASGI, so that a stream passes through): the request, its body read under the
        limits, to the session's endpoint (`EpisodeEndpoint.serve`) at the app's own ``/v1/...``."""
        request = Request(scope, receive)
        found = self._lookup(request)
        body = await self._body(request)
        if body is None:
            return
        if not isinstance(found, GatewaySession):
            await _answer(found)(scope, receive, send)
            return
        path = f"/v1/{request.path_params['path']}"
        inner: dict[str, Any] = {key: scope[key] for key in _SCOPE_KEYS if key in scope}
        inner.update(path=path, raw_path=path.encode(), root_path="")
        # in the opener's context, as an in-process program's requests are (an engine that tells episodes apart
        # by a context variable, such as the local trainer's lockstep, sees the request as the episode's)
        # (a task awaited is cancelled with its awaiter, so a client that goes away cancels it as before)
        await asyncio.create_task(found.endpoint.serve(inner, body, receive, send), context=found.context)

    async def _session_body(self, request: Request) -> tuple[GatewaySession, bytes] | Response:
        """The open session a ``/end`` or ``/reward`` request names and its body; or the answer instead: the
        lookup's (404, 401, a closed session's last word), or 499 to a client that hung up mid-body."""
        found = self._lookup(request)
        body = await self._body(request)
        if body is None:
            return _GONE
        if not isinstance(found, GatewaySession):
            return _answer(found)
        return found, body

    async def _end(self, request: Request) -> Response:
        opened = await self._session_body(request)
        if isinstance(opened, Response):
            return opened
        found, body = opened
        ended = _decode(body, _EndBody) if body.strip() else _EndBody()
        if found.finished.done():
            raise ApiError(409, "this session has already ended", code="session_already_ended")
        found.finished.set_result(ended.answer)
        return _json({"status": "ended", "answer": ended.answer})

    async def _reward(self, request: Request) -> Response:
        opened = await self._session_body(request)
        if isinstance(opened, Response):
            return opened
        found, body = opened
        posted = _decode(body, _RewardBody)
        if not math.isfinite(posted.reward):
            raise ApiError(400, f"reward must be a finite number, got {posted.reward}", param="reward",
                           code="invalid_value")  # fmt: skip
        if found.reward is not None:
            raise ApiError(409, f"this session's reward is already posted ({found.reward})",
                           code="reward_already_posted")  # fmt: skip
        found.reward = float(posted.reward)
        return _json({"status": "recorded", "reward": found.reward})

    async def _health(self, request: Request) -> Response:
        return _json({"status": "ok", "sessions": len(self._sessions)})


@functools.cache
def _uvicorn() -> tuple[type[Any], type[Any]]:
    """uvicorn's `Config`, and its server without its signal handlers (the process's Ctrl-C and SIGTERM stay the
    trainer's). Imported here, when a gateway starts: in-process function programs do not need it."""
    try:
        import uvicorn
    except ImportError as e:
        raise GatewayError("the gateway needs uvicorn: install agent-runtime[proxy] (or [serve])") from e

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return uvicorn.Config, Server


def _decode(body: bytes, kind: type[Any]) -> Any:
    check_json_body(body)
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.DecodeError as e:
        raise from_decode_error(e) from e


def _json(value: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status_code=status, media_type="application/json")


class _Asgi:
    """An ASGI callable Starlette's `Route` passes the raw request to (it wraps functions and methods)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _answer(answer: Answer) -> Response:
    status, headers, content = answer
    response = Response(content, status_code=status)
    kept = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]
    response.raw_headers = [*kept, (b"content-length", str(len(content)).encode())]
    return response


async def _api_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ApiError):  # pragma: no cover - registered for ApiError only
        raise exc
    return error_response(exc)


def _this_host() -> str:
    """This machine's address, as the other machines of a cluster reach it (the address of its hostname)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()
