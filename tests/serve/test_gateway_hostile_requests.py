"""The hostile requests of `test_hostile_requests` against a session of a real listening `Gateway` (issue 40: "the
gateway survives the hostile-request tests of apps/serve (it is the same app)"), with that suite's bodies and
helpers: each answer must be the serving app's (the same status, error type, code and field, asked of a real
`apps/serve` server side by side), none may reach the session's engine, and the gateway keeps serving another
session (a bystander on another engine) and ``/health``.

What applies and what does not, by design:

- the JSON corpus (deep nesting, huge numbers, bad UTF-8, lone surrogates, NUL, empty and null bodies...), wrong
  content types, a declared 50 MB body, a 50 MB body sent whole, a chunked body over the cap, text too long for the
  context, a component that raises (tools mode): as in the suite, against a session URL with its key;
- clients stalling mid-body and trickling their body, and bodies held at once past the budget: against a gateway
  with the suite's short read timeout and small budget (`Gateway(limits=...)`);
- many idle connections, a client that disconnects mid-stream, and one that hangs up mid-body on a completion,
  ``/end`` or ``/reward`` (the app's 499, nothing in the error log), clients that never finish their headers
  (slowloris on the head), and a head too large (uvicorn's answer, the same as the app's): the gateway's own (the
  suite has none of these);
- not applied: the suite's agent-mode cases (`test_a_raising_component_ends_only_its_request_in_agent_mode`): a
  session is tools mode only, the program runs its own loop; and its `/metrics` counts: a gateway has no metrics
  route (its sessions' records are checked instead).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import SamplingParams, ScriptedEngine
from agent_runtime.proxy import EpisodeEndpoint, EpisodeEngine, Gateway, GatewaySession
from agent_runtime.serving import ServeConfig
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.serve.test_hostile_requests import (
    HOSTILE,
    USER,
    VALID,
    Tally,
    answered_yet,
    error_of,
    post,
    raising_protocol,
    raw_head,
    read_reply,
    trickle,
)
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy
from tests.support.calculator_recipe import calculator_recipe

SAMPLING = SamplingParams(max_new_tokens=64)
SHORT = ServeConfig(model_name=MODEL, request_read_timeout_s=2.5, max_request_bytes=64 * 1024,
                    max_buffered_request_bytes=160 * 1024)  # fmt: skip  # the suite's slow-client settings


@dataclasses.dataclass
class Target:
    """A gateway session as the suite's helpers take a server: `url` (below which ``/v1/...`` lies) and `port`;
    and its `key` and `session`."""

    url: str
    port: int
    key: str
    session: GatewaySession

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def auth_line(self) -> str:
        return f"Authorization: Bearer {self.key}\r\n"


class LiveGateway:
    """A `Gateway` on an event loop of its own thread (the suite's helpers block), with sessions opened on it."""

    def __init__(self, tokenizer: HFTokenizer, limits: ServeConfig | None = None) -> None:
        self.tokenizer = tokenizer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gateway = Gateway(limits=limits) if limits else Gateway()
        self.call(self.gateway.start())
        self.port = int(self.gateway.url.rsplit(":", 1)[1])
        self.opened: list[Target] = []

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def session(self, *, delay_s: float = 0.0, context_length: int = 32768, **recipe: Any) -> Target:
        async def open_one() -> GatewaySession:
            engine = ScriptedEngine(self.tokenizer, policy=calculator_policy(self.tokenizer), logprob=-0.25,
                                    delay_s=delay_s, context_length=context_length)  # fmt: skip
            endpoint = EpisodeEndpoint(calculator_recipe(**recipe), EpisodeEngine(engine, SAMPLING), model_name=MODEL)
            return self.gateway.open(endpoint)

        session = self.call(open_one())
        target = Target(session.base_url.removesuffix("/v1"), self.port, session.key, session)
        self.opened.append(target)
        return target

    def health(self) -> int:
        return httpx.get(f"{self.gateway.url}/health", timeout=10).status_code

    def stop(self) -> None:
        async def close() -> None:
            for target in self.opened:
                self.gateway.close(target.session)
                await target.session.endpoint.close()
            await self.gateway.stop()

        self.call(close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def live(tokenizer: HFTokenizer) -> Iterator[LiveGateway]:
    live = LiveGateway(tokenizer)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def target(live: LiveGateway) -> Target:
    """The session the hostile requests go to."""
    return live.session()


@pytest.fixture(scope="module")
def bystander(live: LiveGateway) -> Target:
    """Another session of the same gateway, which must go on being served."""
    return live.session()


@pytest.fixture(scope="module")
def typed(live: LiveGateway) -> Target:
    """The session the content-type cases go to (a valid body under any content type is served, as by the app)."""
    return live.session()


@pytest.fixture(scope="module")
def server(start_server: ServerFactory) -> LiveServer:
    """The serving app (apps/serve's), whose answers the gateway's must equal."""
    return start_server()


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[Tally]:
    tally = Tally()
    yield tally
    print(f"\n{tally.summary()}")
    tally.check()


def answer_of(response: httpx.Response) -> tuple[Any, ...]:
    """What must be the same from the gateway and from the serving app: the status and the error's fields."""
    if response.status_code < 400:
        return (response.status_code,)
    error = error_of(response)
    return response.status_code, error["type"], error["code"], error["param"]


def served(live: LiveGateway, bystander: Target) -> None:
    """The bystander session is served and the gateway answers /health."""
    response = post(bystander, VALID, headers=bystander.auth)  # type: ignore[arg-type]
    assert response.status_code == 200, response.text[:300]
    assert live.health() == 200


def untouched(target: Target) -> None:
    """None of the hostile requests reached the session's engine or its record."""
    assert target.session.endpoint.engine.calls == 0 and target.session.endpoint.log.records == []


# -- the JSON corpus and content types -----------------------------------------------------------------------------


@pytest.mark.parametrize("body", [h[1] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_json_gets_the_serving_apps_answer(
    live: LiveGateway, target: Target, bystander: Target, server: LiveServer, body: bytes, tally: Tally
) -> None:
    through = post(target, body, headers=target.auth)  # type: ignore[arg-type]
    tally.record(through.status_code)
    assert answer_of(through) == answer_of(post(server, body)), through.text[:300]
    untouched(target)
    served(live, bystander)


CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "json"]


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("body", [VALID, b"not json"], ids=["valid", "not_json"])
def test_a_wrong_content_type_gets_the_serving_apps_answer(
    live: LiveGateway, typed: Target, bystander: Target, server: LiveServer, body: bytes, content_type: str
) -> None:
    headers = {"content-type": content_type}
    through = post(typed, body, headers={**headers, **typed.auth})  # type: ignore[arg-type]
    assert answer_of(through) == answer_of(post(server, body, headers=headers)), through.text[:300]
    served(live, bystander)


def test_text_too_long_for_the_context_gets_the_serving_apps_answer(
    live: LiveGateway, bystander: Target, start_server: ServerFactory, tokenizer: HFTokenizer, tally: Tally
) -> None:
    short = live.session(context_length=4096)
    server = start_server(engine=ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), context_length=4096))
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "What is 1 + 1? " + "x" * 4_000_000}],
            "tools": [CALCULATOR_TOOL]}  # fmt: skip
    through = post(short, huge, headers=short.auth)  # type: ignore[arg-type]
    tally.record(through.status_code)
    assert answer_of(through) == answer_of(post(server, huge)) == (400, "invalid_request_error",
                                                                   "context_length_exceeded", "messages")  # fmt: skip
    untouched(short)
    served(live, bystander)


def test_a_raising_component_ends_only_its_request(live: LiveGateway, bystander: Target) -> None:
    broken = live.session(protocol=raising_protocol(RuntimeError("the parser broke")))
    tools = {"model": MODEL, "messages": USER, "tools": [CALCULATOR_TOOL]}
    response = post(broken, tools, headers=broken.auth)  # type: ignore[arg-type]
    assert response.status_code == 500 and error_of(response)["code"] == "parse_error", response.text[:300]
    streamed = post(broken, {**tools, "stream": True}, headers=broken.auth)  # type: ignore[arg-type]
    assert streamed.status_code == 200 and '"parse_error"' in streamed.text
    assert streamed.text.endswith("data: [DONE]\n\n")
    served(live, bystander)


# -- body size -------------------------------------------------------------------------------------------------------


def test_a_declared_body_over_the_cap_is_a_413_at_once(
    live: LiveGateway, target: Target, bystander: Target, tally: Tally
) -> None:
    sock = raw_head(target, target.auth_line + "Content-Length: 50000000\r\n")  # type: ignore[arg-type]
    try:
        reply = read_reply(sock, timeout=5)
    finally:
        sock.close()
    tally.record_reply(reply)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower(), reply[:200]
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and "8388608" in error["message"]
    untouched(target)
    served(live, bystander)


def test_a_50_mb_body_sent_whole_is_refused(live: LiveGateway, target: Target, bystander: Target, tally: Tally) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 50_000_000}]}).encode()
    try:
        response = post(target, body, headers=target.auth)  # type: ignore[arg-type]
    except httpx.TransportError:  # answered 413 and closed while the client was still sending
        tally.cut_off += 1
    else:
        tally.record(response.status_code)
        assert response.status_code == 413 and error_of(response)["code"] == "request_too_large"
    untouched(target)
    served(live, bystander)


def test_a_chunked_body_over_the_cap_is_a_413(tokenizer: HFTokenizer, tally: Tally) -> None:
    live = LiveGateway(tokenizer, SHORT)
    try:
        target, bystander = live.session(), live.session()
        sock = raw_head(target, target.auth_line + "Transfer-Encoding: chunked\r\n")  # type: ignore[arg-type]
        try:
            chunk = b"x" * 16384
            for size in (16384, 16384, 16384, 16384, 1):  # one byte over the 64 KiB cap
                sock.sendall(b"%x\r\n" % size + chunk[:size] + b"\r\n")
            reply = read_reply(sock, timeout=5)
        finally:
            sock.close()
        tally.record_reply(reply)
        assert reply.startswith(b"HTTP/1.1 413") and b"request_too_large" in reply, reply[:200]
        untouched(target)
        served(live, bystander)
    finally:
        live.stop()


# -- slow clients ----------------------------------------------------------------------------------------------------

STALLED = 80


def test_clients_stalling_mid_body_hold_no_other_session(tokenizer: HFTokenizer, tally: Tally) -> None:
    """80 clients send half a body to one session and stall: the other session is served meanwhile, and the
    stalled ones get the app's 408 at the read timeout."""
    live = LiveGateway(tokenizer, SHORT)
    try:
        target, bystander = live.session(), live.session()
        half = VALID[: len(VALID) // 2]
        head = target.auth_line + f"Content-Length: {len(VALID)}\r\n"
        stalled = [raw_head(target, head, half) for _ in range(STALLED)]  # type: ignore[arg-type]
        try:
            time.sleep(0.3)
            for _ in range(4):
                served(live, bystander)
            assert not any(answered_yet(sock) for sock in stalled)
            replies = [read_reply(sock, timeout=15) for sock in stalled]
        finally:
            for sock in stalled:
                sock.close()
        for reply in replies:
            tally.record_reply(reply)
        assert all(r.startswith(b"HTTP/1.1 408") and b"request_timeout" in r for r in replies), replies[0][:200]
        untouched(target)
    finally:
        live.stop()


def test_a_client_trickling_its_body_is_cut_off_at_the_read_timeout(tokenizer: HFTokenizer, tally: Tally) -> None:
    live = LiveGateway(tokenizer, ServeConfig(model_name=MODEL, request_read_timeout_s=1.0))
    try:
        target, bystander = live.session(), live.session()
        sock = raw_head(target, target.auth_line + f"Content-Length: {len(VALID)}\r\n")  # type: ignore[arg-type]
        started = time.monotonic()
        try:
            reply = trickle(sock, VALID, started)
        finally:
            sock.close()
        tally.record_reply(reply)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert time.monotonic() - started < 3.5
        served(live, bystander)
    finally:
        live.stop()


def test_bodies_held_at_once_are_bounded_across_sessions(tokenizer: HFTokenizer, tally: Tally) -> None:
    """The body budget is the gateway's, across its sessions: two stalled 64 KiB bodies on one session hold it,
    a third (on another session) is a 429, and a small request still fits."""
    live = LiveGateway(tokenizer, SHORT)
    try:
        target, other, bystander = live.session(), live.session(), live.session()
        part = b"x" * (60 * 1024)
        head = f"Content-Length: {64 * 1024}\r\n"
        stalled = [raw_head(target, target.auth_line + head, part) for _ in range(2)]  # type: ignore[arg-type]
        try:
            time.sleep(0.5)
            third = raw_head(other, other.auth_line + head, part)  # type: ignore[arg-type]
            refused = read_reply(third, timeout=5)
            third.close()
            tally.record_reply(refused)
            assert refused.startswith(b"HTTP/1.1 429") and b"server_overloaded" in refused, refused[:200]
            served(live, bystander)
            replies = [read_reply(sock, timeout=10) for sock in stalled]
        finally:
            for sock in stalled:
                sock.close()
        for reply in replies:
            tally.record_reply(reply)
        assert all(reply.startswith(b"HTTP/1.1 408") for reply in replies)
        served(live, bystander)  # every byte was given back
    finally:
        live.stop()


# -- connections -----------------------------------------------------------------------------------------------------


def test_many_idle_connections_do_not_stop_the_gateway(live: LiveGateway, bystander: Target) -> None:
    idle = [socket.create_connection(("127.0.0.1", live.port), timeout=10) for _ in range(300)]
    try:
        served(live, bystander)
    finally:
        for sock in idle:
            sock.close()
    served(live, bystander)


def test_a_client_that_disconnects_mid_stream_leaves_its_session_serving(live: LiveGateway, bystander: Target) -> None:
    slow = live.session(delay_s=1.0)
    body = {"model": MODEL, "messages": USER, "tools": [CALCULATOR_TOOL], "stream": True}
    url = f"{slow.url}/v1/chat/completions"
    with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body, headers=slow.auth) as stream:
        assert stream.status_code == 200
        first = next(stream.iter_lines())  # the role chunk; the completion is being generated
        assert first.startswith("data: ")
    # the connection is closed mid-stream
    served(live, bystander)
    again = post(slow, VALID, headers=slow.auth)  # type: ignore[arg-type]
    assert again.status_code == 200, again.text[:300]
    assert live.health() == 200


def test_after_the_hostile_requests_the_gateway_serves(live: LiveGateway, target: Target, bystander: Target) -> None:
    """The session the corpus went to still serves a valid request (runs last, in file order)."""
    untouched(target)
    assert post(target, VALID, headers=target.auth).status_code == 200  # type: ignore[arg-type]
    served(live, bystander)
    assert target.session.endpoint.requests >= 1 and len(target.session.endpoint.log.records) == 1


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/end", "/reward"])
def test_a_client_that_hangs_up_mid_body_is_no_server_error(
    live: LiveGateway, bystander: Target, route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Half a body, then the connection closed: nobody to answer, and nothing for the server's error log (the
    serving app's answer to a `ClientDisconnect`); the session is neither ended nor rewarded."""
    gone = live.session()
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=10)
    path = gone.url.removeprefix(f"http://127.0.0.1:{live.port}") + route
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{gone.auth_line}Content-Length: 100\r\n\r\n{{".encode())
    time.sleep(0.3)  # the gateway is reading the body
    sock.close()
    with caplog.at_level("ERROR"):
        time.sleep(0.5)
        served(live, bystander)
    assert [r.getMessage() for r in caplog.records if r.levelno >= 40] == []
    assert not gone.session.finished.done() and gone.session.reward is None and gone.session.endpoint.requests == 0


def test_clients_trickling_their_headers_hold_no_other_session(live: LiveGateway, bystander: Target) -> None:
    """Slowloris on the head: clients that never finish their headers hold a connection each, not the server (the
    serving app's uvicorn has no header timeout either: closing them is a proxy's job in front of both)."""
    path = bystander.url.removeprefix(f"http://127.0.0.1:{live.port}") + "/v1/chat/completions"
    slow = []
    for _ in range(STALLED):
        sock = socket.create_connection(("127.0.0.1", live.port), timeout=10)
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Slow: a".encode())
        slow.append(sock)
    try:
        for sock in slow:
            sock.sendall(b"b")  # one more byte of a header that never ends
        served(live, bystander)
        assert not any(answered_yet(sock) for sock in slow)
    finally:
        for sock in slow:
            sock.close()
    served(live, bystander)


def test_a_head_too_large_gets_the_serving_apps_answer(
    live: LiveGateway, bystander: Target, server: LiveServer
) -> None:
    target = live.session()
    replies = []
    head = f"{target.auth_line}X-Huge: {'x' * 200_000}\r\nContent-Length: 2\r\n"
    for where in (target, server):
        sock = raw_head(where, head, b"{}")  # type: ignore[arg-type]
        try:
            replies.append(read_reply(sock, timeout=5).split(b"\r\n", 1)[0])
        finally:
            sock.close()
    assert replies[0] == replies[1] and replies[0].startswith(b"HTTP/1.1 4"), replies
    untouched(target)
    served(live, bystander)
