"""`create_app`: the ASGI application (Starlette) that serves one agent.

Routes:

- ``POST /v1/chat/completions``: OpenAI's chat completions. Without `tools`, agent mode (`agent_mode.py`): the
  server runs the whole episode with the recipe's tools (or runs the recipe's agent program once, when the app is
  given `ProgramEpisodes`). With `tools`, tools mode (`tools_mode.py`): one model turn, tool calls returned for
  the client to run, token-in-token-out across follow-ups. `stream: true` in both.
- ``POST /v1/responses``: OpenAI's Responses API (the Agents SDK's default model), converted to the messages and
  tools of a tools-mode turn and served by that core (`responses_api.py`); the same admission, limits and errors.
- ``POST /v1/messages``: Anthropic's Messages API, the same way (`messages_api.py`); its errors in Anthropic's
  shape, its key as ``x-api-key`` or a bearer token.
- ``GET /v1/models``, ``GET /v1/models/{id}``: the served model.
- ``GET /health``: liveness and what is served. ``GET /metrics``: the counters (`ServerMetrics`) as JSON.
- ``GET /``: the web chat page (``static/``: plain HTML and JavaScript, no build step).
- ``GET /viewer``, ``GET /trajectories``, ``GET /trajectories/{id}``: the trajectory viewer over
  `ServeConfig.trajectories` (else the `trajectory_log`), when either is set (`trajectory_viewer.py`).

A chat completion is admitted in this order, so that nothing costly happens before it is known to be worth it:
the key; the body, read whole under a size cap, a read deadline and a budget of body bytes held across all
requests (`request_body.py`: 413, 408, 429); its shape (`json_guard.py`: nesting and number lengths, before any
recursive decoder); its fields and images (`images.py`: inline data URLs only, under the size limits); its length
against the context, before any tokenizing (`text_budget.py`); and only then a concurrency slot (429). A client
that stalls mid-body therefore holds no slot, and a request that will be refused never waits for one. A body of
megabytes is checked and decoded off the event loop. A client that hangs up while its (not streamed) completion
runs has it cancelled, its engine request with it, and its slot freed: at once, or 50-60 ms after the completion
began for a client that hangs up sooner (`disconnect.py`).

Errors are OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``: 400 for a malformed body, naming
the field (too deep, a number too long, a wrong type or value, a conversation longer than the context, an image
the server does not take, ``messages[i].content[k]``); 401 for a missing or wrong key (when `ServeConfig.api_key`
is set; `/v1/*` and `/metrics` only); 404 for an unknown model or route; 408 for a body that does not arrive in
time; 413 for a body over the cap; 429 at once when `max_concurrency` requests are in flight, or when the bodies
being read already hold `max_buffered_request_bytes`; 500 when the engine, the environment or a plug-in fails
mid-request (that request only: the server goes on serving).

This module knows HTTP routing, auth and the admission order; what a completion does is the modes' business.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from importlib import resources
from typing import Any, Final

import msgspec
import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from agent_protocol import Message, MessageError, ToolSpec, coerce_messages, coerce_tools
from agent_runtime.boundary import boundary
from agent_runtime.engines.base import LLMEngine
from agent_runtime.recipe import Recipe
from agent_runtime.serving.agent_mode import EpisodeSource, complete_agent, stream_agent
from agent_runtime.serving.api_error import ApiError, from_decode_error, from_message_error
from agent_runtime.serving.backend import ServingBackend
from agent_runtime.serving.config import ServeConfig
from agent_runtime.serving.disconnect import WATCH_AFTER_S, ClientGone, unless_disconnected
from agent_runtime.serving.error_response import check_bearer, error_response, route_error
from agent_runtime.serving.images import check_request_images, image_count_limit
from agent_runtime.serving.json_guard import check_json_body
from agent_runtime.serving.messages_api import (
    complete_message,
    decode_messages_request,
    stream_message,
)
from agent_runtime.serving.messages_api import error_response as anthropic_error
from agent_runtime.serving.messages_api import to_chat_request as messages_to_chat
from agent_runtime.serving.openai_wire import ChatCompletionRequest, ModelCard, ModelList, decode_request, encode
from agent_runtime.serving.request_body import BodyBudget, request_body
from agent_runtime.serving.responses_api import (
    complete_response,
    decode_responses_request,
    stream_response,
    to_chat_request,
)
from agent_runtime.serving.sse import EventStream
from agent_runtime.serving.text_budget import check_message_count, check_text_fits
from agent_runtime.serving.tools_mode import complete_tools, stream_tools
from agent_runtime.serving.trajectory_files import TrajectoryFiles
from agent_runtime.serving.trajectory_viewer import viewer_routes

__all__ = ["create_app"]

logger = structlog.get_logger(__name__)

_JSON: Final = "application/json"
_PARSE_OFF_LOOP_BYTES: Final = 1 << 20
_STATIC: Final = {
    "index.html": "text/html; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
}


def _json(value: Any, status: int = 200) -> Response:
    return Response(encode(value), status_code=status, media_type=_JSON)


def _backend(request: Request) -> ServingBackend:
    backend: ServingBackend = request.app.state.backend
    return backend


def _authorize(request: Request, backend: ServingBackend) -> None:
    key = backend.config.api_key
    if key is not None:
        check_bearer(request, key)


Parsed = tuple[Any, ChatCompletionRequest, list[Message], list[ToolSpec]]
"""A request as its route decoded it, the chat completion request it stands for, its messages and tools."""
ParseFn = Callable[[bytes, ServingBackend], Parsed]


def _parse(body: bytes, backend: ServingBackend) -> Parsed:
    """Decode and check a chat completion request; raises `ApiError` (400 naming the field, 404 for the model).
    Nothing here tokenizes: a request is refused or accepted before it costs a slot or the tokenizer's time."""
    check_json_body(body)  # nesting and number lengths, before any recursive decoder sees the body
    try:
        chat = decode_request(body)
    except msgspec.DecodeError as e:
        raise from_decode_error(e) from e
    except (RecursionError, ValueError) as e:  # not expected past check_json_body; still the caller's input
        raise ApiError(400, f"the request body cannot be read: {type(e).__name__}: {e}", code="invalid_json") from e
    messages, tools = _checked(chat, backend)
    return chat, chat, messages, tools


def _converting(decode: Callable[[bytes], Any], convert: Callable[[Any], ChatCompletionRequest]) -> ParseFn:
    """The parser of a wire format that stands for a chat completion (the Responses API, Anthropic's Messages):
    its request decoded, converted to the chat completion request and checked as one."""

    def parse(body: bytes, backend: ServingBackend) -> Parsed:
        check_json_body(body)
        try:
            asked = decode(body)
        except (RecursionError, ValueError) as e:  # not expected past check_json_body; still the caller's input
            raise ApiError(400, f"the request body cannot be read: {type(e).__name__}: {e}", code="invalid_json") from e
        chat = convert(asked)
        messages, tools = _checked(chat, backend)
        return asked, chat, messages, tools

    return parse


_parse_responses: Final = _converting(decode_responses_request, to_chat_request)
_parse_messages: Final = _converting(decode_messages_request, messages_to_chat)


def _checked(chat: ChatCompletionRequest, backend: ServingBackend) -> tuple[list[Message], list[ToolSpec]]:
    """A decoded request's checks and its messages and tools (see `_parse`)."""
    if chat.model not in backend.model_ids:
        raise ApiError(
            404,
            f"the model {chat.model!r} does not exist; this server serves {backend.config.model_name!r}",
            param="model",
            code="model_not_found",
        )
    if chat.n != 1:
        raise ApiError(400, f"only n=1 is supported, got n={chat.n}", param="n", code="invalid_value")
    if chat.stop:
        raise ApiError(400, "stop sequences are not supported; the model stops at its end-of-turn token",
                       param="stop", code="unsupported_value")  # fmt: skip
    check_message_count(len(chat.messages), context_tokens=backend.context_limit)
    config = backend.config
    check_request_images(
        chat.messages,
        text_only=backend.text_only,
        grid=backend.image_grid,
        max_image_bytes=config.max_image_bytes,
        max_image_pixels=config.max_image_pixels,
        max_request_pixels=config.max_request_pixels,
        max_images=image_count_limit(backend.recipe.max_images, config.max_images),
        context_tokens=backend.context_limit,
    )
    try:
        messages = coerce_messages(chat.messages, images=backend.text_only is None)
        tools = coerce_tools(chat.tools)
    except MessageError as e:
        raise from_message_error(e) from e
    if not messages:
        raise ApiError(400, "`messages` must hold at least one message", param="messages", code="invalid_value")
    check_text_fits(
        messages, tools, context_tokens=backend.context_limit, max_chars_per_token=backend.config.max_chars_per_token
    )
    return messages, tools


Answer = Callable[[ServingBackend, Any, ChatCompletionRequest, list[Message], list[ToolSpec]], Coroutine[Any, Any, Any]]


async def _chat_complete(
    backend: ServingBackend, _: Any, chat: ChatCompletionRequest, messages: list[Message], tools: list[ToolSpec]
) -> Any:
    return await (complete_tools(backend, chat, messages, tools) if tools else complete_agent(backend, chat, messages))


async def _chat_stream(
    backend: ServingBackend, _: Any, chat: ChatCompletionRequest, messages: list[Message], tools: list[ToolSpec]
) -> AsyncGenerator[bytes]:
    return await stream_tools(backend, chat, messages, tools) if tools else stream_agent(backend, chat, messages)


async def chat_completions(request: Request) -> Response:
    return await _serve(request, _parse, _chat_complete, _chat_stream)


async def responses(request: Request) -> Response:
    """The Responses API: always one tools-mode turn (with or without tools), whatever the route's wire."""
    return await _serve(request, _parse_responses, complete_response, stream_response, always_tools=True)


async def messages(request: Request) -> Response:
    """Anthropic's Messages API: one tools-mode turn, as `responses`; its refusals in Anthropic's error shape."""
    try:
        return await _serve(request, _parse_messages, complete_message, stream_message, always_tools=True)
    except ApiError as e:
        _count_error(request, e)
        return anthropic_error(e)


async def _serve(
    request: Request,
    parse: Callable[[bytes, ServingBackend], Parsed],
    complete: Answer,
    stream: Answer,
    *,
    always_tools: bool = False,
) -> Response:
    """Admit, parse and answer one completion request (see the module docstring for the order)."""
    backend = _backend(request)
    metrics = backend.metrics
    metrics.requests += 1
    _authorize(request, backend)
    config = backend.config
    budget: BodyBudget = request.app.state.body_budget
    try:  # the body is read and checked before the request takes a slot: a stalled client holds none
        async with request_body(
            request, max_bytes=config.max_request_bytes, timeout_s=config.request_read_timeout_s, budget=budget
        ) as body:
            # megabytes of JSON, or images (each is decoded to be checked): checked and decoded off the event loop
            if len(body) > _PARSE_OFF_LOOP_BYTES or b"image" in body or b"\\u" in body:
                asked, chat, messages, tools = await asyncio.to_thread(parse, body, backend)
            else:
                asked, chat, messages, tools = parse(body, backend)
    except ClientDisconnect:  # gone before its request was read: nobody to answer
        metrics.client_disconnects += 1
        logger.info("client_disconnected", path=request.url.path)
        return Response(status_code=499)
    except ApiError as e:
        if e.code == "server_overloaded":  # the bodies being read hold the whole budget
            metrics.rejected_body_budget += 1
        raise
    if not backend.try_enter():
        raise ApiError(
            429,
            f"the server is at its limit of {config.max_concurrency} requests in flight; retry shortly",
            type="rate_limit_error",
            code="server_overloaded",
            headers={"Retry-After": "1"},
        )
    streaming = False
    started = time.perf_counter()
    try:
        with boundary(passes=(ApiError, HTTPException), limit=None) as failed:  # a bug (a plug-in's sys.exit too)
            tools_mode = bool(tools) or always_tools
            mode = "tools" if tools_mode else "agent"
            if tools_mode:
                metrics.requests_tools += 1
            else:
                metrics.requests_agent += 1
            log = logger.bind(mode=mode, stream=chat.stream, messages=len(messages))
            if chat.stream:
                metrics.requests_streamed += 1
                frames = await stream(backend, asked, chat, messages, tools)
                streaming = True

                def done() -> None:
                    backend.leave()
                    log.info("request_served", duration_ms=round((time.perf_counter() - started) * 1000, 1))

                return EventStream(frames, on_close=done)
            work = complete(backend, asked, chat, messages, tools)
            try:  # a client that hangs up meanwhile has its completion cancelled and its slot freed (disconnect.py)
                result = await unless_disconnected(request.receive, work, watch_after_s=WATCH_AFTER_S)
            except ClientGone:
                metrics.client_disconnects += 1
                log.info("client_disconnected", duration_ms=round((time.perf_counter() - started) * 1000, 1))
                return Response(status_code=499)
            metrics.completed += 1
            duration_ms = round((time.perf_counter() - started) * 1000, 1)
            agent = getattr(result, "agent", None)
            if agent is not None:  # agent mode: one line for the request and its episode
                log.info(
                    "request_served", duration_ms=duration_ms, episode_id=agent.episode_id, engine=backend.engine.name,
                    stop_reason=agent.stop_reason, turns=agent.turns, reward=agent.reward,
                )  # fmt: skip
            else:
                log.info("request_served", duration_ms=duration_ms)
            return _json(result)
        raised = failed.exception
        if isinstance(raised, MessageError):
            raise from_message_error(raised) from raised
        why = failed.message
        logger.error("request_failed", code=failed.code, error_type=type(raised).__name__, error=why, exc_info=raised)
        raise ApiError(500, f"internal error: {why}", type="server_error", code=failed.code) from raised
    finally:
        if not streaming:
            backend.leave()


async def list_models(request: Request) -> Response:
    backend = _backend(request)
    _authorize(request, backend)
    return _json(ModelList(data=[ModelCard(id=name, created=backend.created) for name in backend.model_ids]))


async def get_model(request: Request) -> Response:
    backend = _backend(request)
    _authorize(request, backend)
    model_id = request.path_params["model_id"]
    if model_id not in backend.model_ids:
        raise ApiError(404, f"the model {model_id!r} does not exist", param="model", code="model_not_found")
    return _json(ModelCard(id=model_id, created=backend.created))


async def health(request: Request) -> Response:
    backend = _backend(request)
    return _json(
        {
            "status": "ok",
            "model": backend.config.model_name,
            "recipe": backend.recipe.name,
            "engine": backend.engine.name,
            "protocol": backend.protocol.name,
            "agent": backend.episodes.kind if backend.episodes is not None else "session",
            "tools": [spec.name for spec in backend.session.environment.tools],
            "in_flight": backend.metrics.in_flight,
            "max_concurrency": backend.config.max_concurrency,
            "api_key_required": backend.config.api_key is not None,
            "viewer": bool(backend.config.trajectories or backend.config.trajectory_log),  # /viewer is served
            "images": {
                "accepted": backend.text_only is None,
                "max_image_bytes": backend.config.max_image_bytes,
                "max_images": image_count_limit(backend.recipe.max_images, backend.config.max_images),
            },
            "transcript_store": {k: v for k, v in backend.store.stats().items() if k in ("kind", "state")},
            "uptime_s": round(time.time() - backend.created, 1),
        }
    )


async def metrics_view(request: Request) -> Response:
    backend = _backend(request)
    _authorize(request, backend)
    counters = msgspec.to_builtins(backend.metrics)
    if engine_stats := backend.engine.stats():  # the HTTP engine's upstreams and session affinity
        counters["engine"] = engine_stats
    counters["transcript_store"] = backend.store.stats()
    return _json(counters)


def _static_routes() -> list[Route]:
    folder = resources.files("agent_runtime.serving") / "static"
    files = {name: (folder / name).read_bytes() for name in _STATIC}

    def serve(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return Response(files[name], media_type=_STATIC[name], headers={"Cache-Control": "no-cache"})

        return endpoint

    return [Route("/", serve("index.html"), methods=["GET"])] + [
        Route(f"/static/{name}", serve(name), methods=["GET"]) for name in _STATIC
    ]


async def _api_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, ApiError):  # pragma: no cover - registered for ApiError only
        raise exc
    _count_error(request, exc)
    return error_response(exc)


def _count_error(request: Request, exc: ApiError) -> None:
    metrics = _backend(request).metrics
    if exc.code == "server_overloaded":  # no slot or no room for the body: counted where refused
        pass
    elif exc.status >= 500:
        metrics.server_errors += 1
    else:
        metrics.client_errors += 1


def create_app(
    engine: LLMEngine,
    recipe: Recipe,
    config: ServeConfig | None = None,
    *,
    close_engine: bool = False,
    episodes: EpisodeSource | None = None,
) -> Starlette:
    """The server of `recipe` on `engine`. `config` defaults to serving the recipe under its own name.
    With `close_engine`, the engine is closed when the app shuts down (the app then owns it). `episodes` opens
    each agent-mode episode (None: the recipe's own session; `agent_runtime.proxy.ProgramEpisodes` runs the
    recipe's agent program instead), and is closed when the app shuts down."""
    backend = ServingBackend(engine, recipe, config or ServeConfig(model_name=recipe.name))
    backend.episodes = episodes

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        logger.info(
            "server_started", model=backend.config.model_name, recipe=recipe.name, engine=engine.name,
            max_concurrency=backend.config.max_concurrency, trajectory_log=backend.config.trajectory_log,
        )  # fmt: skip
        ping = getattr(backend.store, "ping", None)
        if ping is not None:  # a shared store that cannot be reached fails the start, saying why
            await ping()
        try:
            yield
        finally:
            if episodes is not None:  # a program's gateway stops listening
                await episodes.aclose()
            await backend.store.aclose()
            if backend.writer is not None:
                backend.writer.close()
            if close_engine:
                await engine.close()
            logger.info("server_stopped", requests=backend.metrics.requests)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_view, methods=["GET"]),
        *_static_routes(),
    ]
    browsed = backend.config.trajectories or backend.config.trajectory_log
    if browsed is not None:  # the log may not exist before the first request
        files = TrajectoryFiles(browsed, tokenizer=engine.tokenizer, allow_missing=True)
        routes += viewer_routes(files, lambda request: _authorize(request, backend))
    app = Starlette(
        routes=routes,
        exception_handlers={ApiError: _api_error, HTTPException: route_error},
        lifespan=lifespan,
    )
    app.state.backend = backend
    app.state.body_budget = BodyBudget(backend.config.max_buffered_request_bytes)
    return app
