"""A minimal vLLM-compatible `/v1/completions` server for tests, serving any `LLMEngine` (in practice `HFEngine`
on the tiny Qwen3 model), run by uvicorn in a background thread on a free local port.

It speaks the subset of vLLM's completions API that `OpenAIEngine` uses: `prompt` as token ids (or one string),
`max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop_token_ids`, `logprobs`, `return_token_ids`,
`skip_special_tokens`; answers carry `choices[0].{text, token_ids, prompt_token_ids, logprobs, finish_reason}`;
errors are `{"error": {"message", "type", "code"}}` with vLLM's status codes (400 for a bad request or a prompt
that does not fit, 401 for a wrong API key, 404 for an unknown model).

Test-only fault injection lives on `server.faults` (plain Python, same process): `fail_next(n, status)` makes
the next n requests fail, `delay_s` answers late (to trigger client timeouts), `omit_token_ids` answers like a
server without `return_token_ids`. A broken or hostile upstream is played with the real answer as its
starting point: `rewrite(choice)` edits the answer's `choices[0]` before it is sent (wrong types, out-of-vocabulary
ids, NaN logprobs; the body is written with Python's `json`, which spells NaN as `NaN`), `raw_body` answers 200
with these bytes instead, `truncate_to` declares the full `Content-Length`, sends that many bytes and drops the
connection, and `trickle_s` sends the answer one byte at a time with that pause between bytes, stopping when the
client leaves (`server.disconnects` counts those). `faults.reset()` clears them all. `server.requests` records
every body received, `server.request_headers` its headers.

Public API: :class:`Faults`, :class:`CompletionsServer` (a context manager: `with CompletionsServer(engine) as
server: server.base_url`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agent_runtime.engines.base import LLMEngine, SamplingParams
from agent_runtime.errors import ContextBudgetExceeded, EngineError

__all__ = ["CompletionsServer", "Faults"]


@dataclass
class Faults:
    """What the server does wrong, set by the test. Thread-safe enough: the test thread writes, one server
    thread reads, and `fail_next` is taken under a lock."""

    delay_s: float = 0.0
    omit_token_ids: bool = False
    rewrite: Callable[[dict[str, Any]], None] | None = None
    raw_body: bytes | None = None
    truncate_to: int | None = None
    trickle_s: float = 0.0
    chunked: bool = False  # send the answer in 64 KiB chunks with no Content-Length
    _fail: list[tuple[int, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        """No faults: the server answers honestly again."""
        self.delay_s, self.omit_token_ids, self.rewrite, self.raw_body = 0.0, False, None, None
        self.truncate_to, self.trickle_s, self.chunked = None, 0.0, False
        while self.take_failure() is not None:
            pass

    def fail_next(self, count: int, status: int = 500, message: str = "injected failure") -> None:
        with self._lock:
            self._fail.extend([(status, message)] * count)

    def take_failure(self) -> tuple[int, str] | None:
        with self._lock:
            return self._fail.pop(0) if self._fail else None


def _error(status: int, message: str) -> JSONResponse:
    kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status
    )


class CompletionsServer:
    def __init__(self, engine: LLMEngine, *, model: str = "tiny-qwen3", api_key: str | None = None) -> None:
        self.engine = engine
        self.model = model
        self.api_key = api_key
        self.faults = Faults()
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []  # each request's headers, lower-cased names
        self.request_ports: list[int | None] = []  # each request's client port (which process sent it)
        self.disconnects = 0  # trickled answers the client walked away from
        app = Starlette(routes=[Route("/v1/completions", self._completions, methods=["POST"])])
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> CompletionsServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test completions server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def __enter__(self) -> CompletionsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def _completions(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not valid JSON")
        self.requests.append(body)
        self.request_headers.append(dict(request.headers))
        self.request_ports.append(request.client.port if request.client else None)
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return _error(401, "Unauthorized: invalid API key")
        if self.faults.delay_s:
            await asyncio.sleep(self.faults.delay_s)
        failure = self.faults.take_failure()
        if failure is not None:
            return _error(*failure)
        if body.get("model") != self.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        try:
            prompt, sampling = self._parse(body)
        except (KeyError, TypeError, ValueError) as e:
            return _error(400, str(e))
        if len(prompt) + sampling.max_new_tokens > self.engine.context_length:
            return _error(
                400,
                f"This model's maximum context length is {self.engine.context_length} tokens. However, you "
                f"requested {len(prompt) + sampling.max_new_tokens} tokens ({len(prompt)} in the messages, "
                f"{sampling.max_new_tokens} in the completion).",
            )
        try:
            generation = await self.engine.generate(prompt, sampling)
        except (ContextBudgetExceeded, ValueError) as e:
            return _error(400, str(e))
        except EngineError as e:
            return _error(500, str(e))
        skip_special = bool(body.get("skip_special_tokens", True))
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.engine.tokenizer.decode(generation.ids, skip_special_tokens=skip_special),
            "logprobs": None,
            "finish_reason": generation.finish_reason,
            "stop_reason": None,
        }
        if body.get("logprobs") is not None and generation.logprobs is not None:
            tokens = [self.engine.tokenizer.decode([i]) for i in generation.ids]
            choice["logprobs"] = {
                "text_offset": [],
                "token_logprobs": generation.logprobs,
                "tokens": tokens,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, generation.logprobs, strict=True)],
            }
        if body.get("return_token_ids") and not self.faults.omit_token_ids:
            choice["prompt_token_ids"] = prompt
            choice["token_ids"] = generation.ids
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(generation.ids),
            "total_tokens": len(prompt) + len(generation.ids),
        }
        answer = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }
        return self._faulty(answer) if self._answer_is_faulty() else JSONResponse(answer)

    def _answer_is_faulty(self) -> bool:
        f = self.faults
        return (
            f.rewrite is not None or f.raw_body is not None or f.truncate_to is not None or f.trickle_s > 0 or f.chunked
        )

    def _faulty(self, answer: dict[str, Any]) -> Response:
        """The answer as a broken upstream sends it (see the module docstring)."""
        faults = self.faults
        if faults.rewrite is not None:
            faults.rewrite(answer["choices"][0])
        body = faults.raw_body if faults.raw_body is not None else json.dumps(answer).encode()
        if faults.truncate_to is not None:
            return _Truncated(body, faults.truncate_to)
        if faults.trickle_s > 0:
            return _Trickled(body, faults.trickle_s, self)
        if faults.chunked:
            pieces = [body[i : i + 65536] for i in range(0, len(body), 65536)]
            return StreamingResponse(iter(pieces), media_type="application/json")
        return Response(body, media_type="application/json")

    def _parse(self, body: dict[str, Any]) -> tuple[list[int], SamplingParams]:
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompt = self.engine.tokenize(prompt)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            if len(prompt) != 1:
                raise ValueError("this test server takes one prompt per request")
            prompt = prompt[0]
        if not isinstance(prompt, list) or not all(isinstance(i, int) for i in prompt):
            raise ValueError("prompt must be a string or a list of token ids")
        if body.get("n", 1) != 1 or body.get("stream", False):
            raise ValueError("this test server supports n=1 without streaming only")
        temperature = float(body.get("temperature", 1.0))
        if temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {temperature}.")
        top_k = int(body.get("top_k", 0))
        return prompt, SamplingParams(
            max_new_tokens=int(body.get("max_tokens", 16)),
            temperature=temperature,
            top_p=float(body.get("top_p", 1.0)),
            top_k=max(top_k, 0),
            stop_token_ids=tuple(int(i) for i in body.get("stop_token_ids") or ()),
            seed=body.get("seed"),
            logprobs=body.get("logprobs") is not None,
        )


class _Truncated(Response):
    """Declares the whole body's length, sends only its first `keep` bytes, then drops the connection (the ASGI
    app fails mid-response, which makes uvicorn close the socket)."""

    def __init__(self, body: bytes, keep: int) -> None:
        super().__init__(body, media_type="application/json")
        self.keep = keep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[: self.keep], "more_body": True})
        raise ConnectionAbortedError("test server: the answer is cut off here on purpose")


class _Trickled(Response):
    """Sends the body one byte every `pause_s`, each byte well inside any per-read timeout; stops when the
    client disconnects and counts it on the server."""

    def __init__(self, body: bytes, pause_s: float, server: CompletionsServer) -> None:
        super().__init__(body, media_type="application/json")
        self.pause_s = pause_s
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            for i in range(len(self.body)):
                if gone.is_set():
                    self.server.disconnects += 1
                    return
                await send({"type": "http.response.body", "body": self.body[i : i + 1], "more_body": True})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), self.pause_s)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
