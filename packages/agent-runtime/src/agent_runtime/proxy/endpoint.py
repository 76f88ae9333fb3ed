"""`EpisodeEndpoint`: one episode's OpenAI endpoint, in process: the real tools-mode server (`create_app`) of the
recipe on the episode's engine, reached by a real `openai.AsyncOpenAI` through an ASGI transport.

Each episode gets an app of its own (its own transcript store, request log and metrics) and a key of its own
(the app refuses any other), so concurrent episodes share nothing but the engine, which batches their requests.
No port is opened: the client's requests go straight to the app through the ASGI transport of the HTTP library the
installed `openai` is built on (`openai.DefaultAsyncHttpxClient`'s: httpx, or the fork recent releases ship). A
program in another process, or a framework that only takes a base URL, goes through the rollout worker's
listening gateway (`gateway.py`), which hands each request to `serve` as ASGI, so that a streamed answer passes
through as it is generated; the refusals, caps and records are the same.

Two event loops. The app, its request log and the engine live on the loop that created the endpoint (the
rollout's: OpenRLHF's vLLM actor, the local trainer); the program runs on a loop of its own, in a thread of its
own (`program_thread.py`), and its client (`client()`, made there) hands each request to the app's loop
(`asyncio.run_coroutine_threadsafe`) and awaits the answer on its own: blocking code in the program stalls its
own loop only. Cancelling a request on the program's side cancels it on the app's.

The endpoint counts the program's model calls and enforces the episode's caps where it sees them: a chat completion
(or a Responses API call) past `max_requests` is refused before it reaches the app (HTTP 429,
``too_many_requests``), and a request whose record would open a conversation past `max_conversations` is dropped
from the log and answered with a 429 (``too_many_conversations``). Either ends the episode (`ended`), and every
later request gets the same 429. After `close()` every request is refused (HTTP 503, ``episode_over``): the thread
of a program that ran past its time cannot add to a finished episode. `on_record` sees each record the log keeps,
as it is written (`RequestLog`).

The client has retries off (`max_retries=0`): a failed turn must reach the program as it happened, once, so
that the episode's record is the program's actual conversation. This module knows the serving app and the
OpenAI client; what an episode's records mean is `request_log.py`'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import sys
import uuid
from collections.abc import Callable
from typing import Any, Final

from starlette.types import Message, Receive, Scope, Send

from agent_runtime.agent_program import ProgramCode
from agent_runtime.proxy.episode_engine import EpisodeEngine
from agent_runtime.proxy.request_log import RequestLog
from agent_runtime.recipe import Recipe
from agent_runtime.serving import ServeConfig, create_app
from agent_runtime.serving.api_error import ApiError
from agent_runtime.trajectory import Trajectory

__all__ = ["EpisodeEndpoint"]

_NO_DEADLINE_S: Final = 24 * 3600.0  # the engine call's bound when the rollout sets none (the episode has its own)
_CLOSE_GRACE_S: Final = 1.0  # how long `close` waits for cancelled requests to write their records

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]  # status, raw headers, raw body


class EpisodeEndpoint:
    """The endpoint of one episode. Make it on the rollout's loop; `client()` (on any loop) is an
    `openai.AsyncOpenAI` bound to it; `close()` it on the rollout's loop when the episode ends."""

    def __init__(
        self,
        recipe: Recipe,
        engine: EpisodeEngine,
        *,
        model_name: str,
        engine_timeout_s: float | None = None,
        max_requests: int | None = None,
        max_conversations: int | None = None,
        on_record: Callable[[Trajectory], None] | None = None,
    ) -> None:
        self.key = f"episode-{uuid.uuid4().hex[:16]}"
        self.engine = engine
        config = ServeConfig(
            model_name=model_name, api_key=self.key, engine_timeout_s=engine_timeout_s or _NO_DEADLINE_S
        )
        self.app = create_app(engine, recipe, config)
        self.log = RequestLog(
            max_conversations=max_conversations, on_refused=self._too_many_conversations, on_record=on_record
        )
        self.app.state.backend.writer = self.log  # every request's record comes here (the serving trajectory log)
        self.requests = 0  # the model calls served (chat completions that reached the app)
        self.max_requests = max_requests
        self.loop = asyncio.get_running_loop()
        self.ended: asyncio.Future[tuple[ProgramCode, str]] = self.loop.create_future()
        self.closed = False
        self._inflight: set[asyncio.Task[Any]] = set()
        self._openai = _openai()
        self._http = sys.modules[self._openai.DefaultAsyncHttpxClient.__mro__[1].__module__.partition(".")[0]]
        self._asgi = self._http.ASGITransport(app=self.app)

    # -- the program's side (any loop) ----------------------------------------------------------------------

    def client(self) -> Any:
        """An `openai.AsyncOpenAI` for this episode, to be used on the loop that calls this (no retries: see the
        module docstring). Close it (``await client.close()``) on that loop."""
        http_client = self._openai.DefaultAsyncHttpxClient(
            transport=_handoff(self._http, self), base_url=f"http://{self.key}.proxy", timeout=None
        )
        return self._openai.AsyncOpenAI(
            base_url=f"http://{self.key}.proxy/v1", api_key=self.key, http_client=http_client, max_retries=0
        )

    def sync_client(self) -> Any:
        """An `openai.OpenAI` for this episode, for a synchronous program on its own thread (not the rollout's
        loop's: each request blocks that thread until the endpoint answers). No retries, as `client`."""
        http_client = self._openai.DefaultHttpxClient(
            transport=_sync_handoff_class(self._http)(self), base_url=f"http://{self.key}.proxy", timeout=None
        )
        return self._openai.OpenAI(
            base_url=f"http://{self.key}.proxy/v1", api_key=self.key, http_client=http_client, max_retries=0
        )

    # -- the app's side (the rollout's loop) ----------------------------------------------------------------

    def _admit(self, path: str) -> Answer | None:
        """None if a request to `path` goes to the app (a chat completion then counts as a model call); else
        the refusal (see the module docstring)."""
        if self.closed or self.ended.done():
            return self.over_answer()
        if path.endswith(("/chat/completions", "/responses", "/messages")):  # a model call, on any of the APIs
            if self.max_requests is not None and self.requests >= self.max_requests:
                message = f"the episode made its {self.max_requests} model calls (AgentProgram.max_requests)"
                self.end("too_many_requests", message)
                return _refusal(429, message, "too_many_requests")
            self.requests += 1
        return None

    async def forward(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Answer:
        """One request of the program, answered by the app (or refused, see the module docstring)."""
        refused = self._admit(url.partition("?")[0])
        if refused is not None:
            return refused
        task = asyncio.current_task()
        assert task is not None  # run_coroutine_threadsafe runs this as a task
        self._inflight.add(task)
        try:
            request = self._http.Request(method, url, headers=headers, content=body)
            response = await self._asgi.handle_async_request(request)
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
            if self._ended_with() == "too_many_conversations":  # this request's record may be the one dropped
                return self.over_answer()
            return response.status_code, list(response.headers.raw), raw
        finally:
            self._inflight.discard(task)

    async def serve(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        """One request of the program as ASGI (the listening gateway's path): `scope` addressed to the app's own
        routes, its whole `body` (read by the caller under its limits), then the client's `receive` (for its
        disconnect) and `send`. The app's answer goes to `send` as the app sends it, so a streamed completion's
        events reach the client as they are generated. Refusals, caps and records are `forward`'s: an answer sent
        in one part (a plain completion) is held until it is whole and replaced by the episode's end if its record
        was the one dropped; a stream's record is written when it ends, after its events went out. A request cut
        off by `close` gets ``episode_over`` (or its stream ends there)."""
        refused = self._admit(scope["path"])
        if refused is not None:
            await _send_answer(send, refused)
            return
        started = False
        held: Message | None = None
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def relay(message: Message) -> None:
            nonlocal held, started
            if message["type"] == "http.response.start":
                held = message
                return
            if held is not None:
                if not message.get("more_body", False) and self._ended_with() == "too_many_conversations":
                    await _send_answer(send, self.over_answer())  # this request's record may be the one dropped
                    started, held = True, None
                    return
                await send(held)
                started, held = True, None
            if started:
                await send(message)

        running = asyncio.ensure_future(self.app(scope, replay, relay))
        self._inflight.add(running)
        try:
            await asyncio.wait((running,))
        except asyncio.CancelledError:
            running.cancel()
            raise
        finally:
            self._inflight.discard(running)
        if not running.cancelled():
            running.result()  # the app's own bug, if any: the caller's server answers it
        elif not started:
            await _send_answer(send, self.over_answer())
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _ended_with(self) -> ProgramCode | None:
        if not self.ended.done() or self.ended.cancelled():
            return None
        return self.ended.result()[0]

    def over_answer(self) -> Answer:
        """The answer to a request that comes after the episode ended: the reason, or ``episode_over``."""
        if self._ended_with() is not None:
            code, message = self.ended.result()
            return _refusal(429, message, code)
        return _refusal(503, "this episode is over; its endpoint takes no more requests", "episode_over")

    def end(self, code: ProgramCode, message: str) -> None:
        """End the episode (the first reason wins); the program's runner cancels the program."""
        if not self.ended.done():
            self.ended.set_result((code, message))

    def _too_many_conversations(self, opened: int) -> None:
        self.end(
            "too_many_conversations",
            f"the episode opened more than {opened} conversations (AgentProgram.max_conversations); "
            "the first ones are kept",
        )

    async def close(self) -> None:
        """Refuse every later request and cancel those in flight (waiting a moment for their records)."""
        self.closed = True
        inflight = list(self._inflight)
        for task in inflight:
            task.cancel()
        if inflight:
            await asyncio.wait(inflight, timeout=_CLOSE_GRACE_S)
        if not self.ended.done():
            self.ended.cancel()


def _refusal(status: int, message: str, code: str) -> Answer:
    body = ApiError(status, message, type="invalid_request_error", code=code).body()
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


async def _send_answer(send: Send, answer: Answer) -> None:
    status, headers, content = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content, "more_body": False})


def _send(endpoint: EpisodeEndpoint, request: Any, body: bytes) -> concurrent.futures.Future[Answer] | Answer:
    """Hand a client's request to `endpoint.forward` on the endpoint's loop: the future of its answer, or the
    refusal when that loop is closed (the episode is long over)."""
    call = endpoint.forward(request.method, str(request.url), list(request.headers.raw), body)
    try:
        return asyncio.run_coroutine_threadsafe(call, endpoint.loop)
    except RuntimeError:
        call.close()
        return _refusal(503, "this episode is over", "episode_over")


def _handoff(http: Any, endpoint: EpisodeEndpoint) -> Any:
    """The client's transport: each request is answered by `endpoint.forward` on the endpoint's loop."""
    return _handoff_class(http)(endpoint)


@functools.cache
def _handoff_class(http: Any) -> type:
    """The hand-off transport class for `http` (httpx or its fork, whichever the installed openai uses)."""

    class HandOff(http.AsyncBaseTransport):  # type: ignore[misc]  # httpx or its fork, found at runtime
        def __init__(self, endpoint: EpisodeEndpoint) -> None:
            self.endpoint = endpoint

        async def handle_async_request(self, request: Any) -> Any:
            sent = _send(self.endpoint, request, await request.aread())
            status, headers, content = sent if isinstance(sent, tuple) else await asyncio.wrap_future(sent)
            return http.Response(status, headers=headers, content=content, request=request)

    return HandOff


@functools.cache
def _sync_handoff_class(http: Any) -> type:
    """The synchronous client's transport: each request is answered by `endpoint.forward` on the endpoint's loop,
    the calling thread waiting for it."""

    class SyncHandOff(http.BaseTransport):  # type: ignore[misc]  # httpx or its fork, found at runtime
        def __init__(self, endpoint: EpisodeEndpoint) -> None:
            self.endpoint = endpoint

        def handle_request(self, request: Any) -> Any:
            sent = _send(self.endpoint, request, request.read())
            status, headers, content = sent if isinstance(sent, tuple) else sent.result()
            return http.Response(status, headers=headers, content=content, request=request)

    return SyncHandOff


def _openai() -> Any:
    try:
        import openai
    except ImportError as e:  # pragma: no cover - openai is installed wherever agent programs are trained
        raise RuntimeError("agent programs need the `openai` package: pip install openai") from e
    return openai
