"""Requests an attacker (or a broken client) sends, against a real server: clients that stall mid-body, bodies
over the size cap, text too long for the context, JSON nested 100,000 deep, numbers of thousands of digits, and
components that raise inside a request. Each is answered 4xx (or 408/413), never 5xx, never a hang; valid
requests keep being served meanwhile, and the server stays up.

Every hostile request the module sends is tallied with the answer it got (`Tally`): the module prints the count
by status at its end and fails if any got a 5xx or none (``uv run pytest tests/serve/test_hostile_requests.py -s``;
with ``-k`` it counts the selected tests' requests). The components that raise are counted apart: their 500s are
the answer they should get."""

from __future__ import annotations

import copy
import dataclasses
import json
import socket
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

import httpx
import pytest
import structlog

from agent_protocol import Action, ChatProtocol, HFTokenizer, get_protocol
from agent_runtime import ScriptedEngine, read_trajectories
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy
from tests.support.calculator_recipe import calculator_recipe

USER = [{"role": "user", "content": "What is 2 * 21?"}]
VALID = json.dumps({"model": MODEL, "messages": USER}).encode()


@pytest.fixture(scope="module")
def server(start_server: ServerFactory) -> LiveServer:
    return start_server()


@dataclasses.dataclass
class Tally:
    """The hostile requests sent and the answers they got (a status, or None: no answer)."""

    statuses: Counter[int | None] = dataclasses.field(default_factory=Counter)
    #: hostile requests whose error named the field at fault, of those that name one
    named: list[bool] = dataclasses.field(default_factory=list)
    #: requests whose body the server refused while the client was still sending it (a 413 and a closed
    #: connection: the client may see only the close)
    cut_off: int = 0

    def record(self, status: int | None, count: int = 1) -> None:
        self.statuses[status] += count

    def record_reply(self, reply: bytes) -> None:
        """The status of a raw HTTP reply (None when there was none)."""
        self.record(int(reply[9:12]) if reply.startswith(b"HTTP/1.1 ") else None)

    def summary(self) -> str:
        total = sum(self.statuses.values()) + self.cut_off
        by_class = Counter("none" if s is None else f"{s // 100}xx" for s in self.statuses.elements())
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items(), key=lambda x: x[0] or 0))
        named = f"; errors naming the field: {sum(self.named)} / {len(self.named)}" if self.named else ""
        cut = f"; {self.cut_off} refused mid-body (413 and the connection closed)" if self.cut_off else ""
        answered = f"{by_class['4xx'] + self.cut_off} answered 4xx, {by_class['5xx']} answered 5xx"
        others = f"{by_class['2xx']} accepted, {by_class['none']} unanswered"
        return f"hostile requests: {total} tried: {answered}, {others} ({statuses}{cut}){named}"

    def check(self) -> None:
        refused = sum(n for s, n in self.statuses.items() if s is not None and 400 <= s < 500)
        assert refused == sum(self.statuses.values()), self.summary()
        assert all(self.named), self.summary()


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[Tally]:
    """The module's tally, printed (and checked) once its last test ran."""
    tally = Tally()
    yield tally
    print(f"\n{tally.summary()}")
    tally.check()


def post(server: LiveServer, body: bytes | dict[str, Any], **kwargs: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}/v1/chat/completions", content=content, timeout=30, **kwargs)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    return error


def raw_head(server: LiveServer, headers: str, body: bytes = b"") -> socket.socket:
    """A raw connection that sent a POST's head (and `body`, perhaps only part of it) and then stops sending. Its
    path is ``/v1/chat/completions`` below `server.url`'s path (a gateway session's: test_gateway_hostile_requests)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    path = urllib.parse.urlsplit(server.url).path + "/v1/chat/completions"
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\r\n"
    sock.sendall(head.encode() + body)
    return sock


def read_reply(sock: socket.socket, timeout: float) -> bytes:
    """What the server sent back until it closed the connection or `timeout` passed."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and data.split(b"\r\n\r\n", 1)[1].rstrip().endswith(b"}"):
                break
    except TimeoutError:
        pass
    except ConnectionResetError:
        pass
    return data


def answered_yet(sock: socket.socket) -> bool:
    """Whether the server has sent anything on `sock` (or closed it), without waiting."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)
    return True


# -- stalled clients ----------------------------------------------------------------------------------------------


STALLED = 80  # more than the default max_concurrency (64), which they all held before the body was read first


def test_clients_stalling_mid_body_do_not_lock_out_valid_requests(start_server: ServerFactory, tally: Tally) -> None:
    """More clients than `max_concurrency` send half a body and stall: valid requests still get 200 meanwhile, and
    the stalled ones get 408 once the read timeout passes."""
    server = start_server(request_read_timeout_s=2.5)
    half = VALID[: len(VALID) // 2]
    stalled = [raw_head(server, f"Content-Length: {len(VALID)}\r\n", half) for _ in range(STALLED)]
    try:
        time.sleep(0.3)  # every stalled request is in the server, waiting for the rest of its body
        statuses = [post(server, VALID).status_code for _ in range(6)]
        unanswered = sum(not answered_yet(sock) for sock in stalled)
        assert statuses == [200] * 6, statuses
        assert unanswered == STALLED  # the valid requests were served while every stalled client still stalled
        replies = [read_reply(sock, timeout=15) for sock in stalled]
    finally:
        for sock in stalled:
            sock.close()
    for reply in replies:
        tally.record_reply(reply)
    timed_out = sum(reply.startswith(b"HTTP/1.1 408") for reply in replies)
    metrics = server.metrics()
    served = f"valid requests served meanwhile: {statuses.count(200)} / {len(statuses)}"
    print(f"\n{STALLED} clients stalled mid-body: {timed_out} got 408 at the read timeout; {served}; refused with 429: "
          f"{metrics['rejected_overloaded']}")  # fmt: skip
    assert timed_out == STALLED, {r[:40] for r in replies}
    assert b"request_timeout" in replies[0]
    assert metrics["in_flight"] == 0 and metrics["rejected_overloaded"] == 0 and metrics["server_errors"] == 0
    assert metrics["client_errors"] == STALLED


def trickle(sock: socket.socket, body: bytes, started: float) -> bytes:
    """Send all but the last byte of `body`, one every 0.2 s, until the server answers or 3 s have passed since
    `started`; then its reply."""
    for byte in body[:-1]:
        if answered_yet(sock) or time.monotonic() - started > 3:
            break  # (sending on after the answer would make the server's close a reset)
        sock.sendall(bytes([byte]))
        time.sleep(0.2)
    return read_reply(sock, timeout=5)


def test_a_client_trickling_its_body_is_cut_off_at_the_read_timeout(start_server: ServerFactory, tally: Tally) -> None:
    """The read timeout bounds the whole body, not each read: a byte every 0.2 s does not keep it open."""
    server = start_server(request_read_timeout_s=1.0)
    sock = raw_head(server, f"Content-Length: {len(VALID)}\r\n")
    started = time.monotonic()
    try:
        reply = trickle(sock, VALID, started)
    finally:
        sock.close()
    tally.record_reply(reply)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert time.monotonic() - started < 3.5


# -- body size ----------------------------------------------------------------------------------------------------


def test_a_declared_body_over_the_cap_is_a_413_at_once(server: LiveServer, tally: Tally) -> None:
    """A 50 MB Content-Length is refused from the head alone, before a byte of the body is read."""
    sock = raw_head(server, "Content-Length: 50000000\r\n")
    try:
        reply = read_reply(sock, timeout=5)
    finally:
        sock.close()
    tally.record_reply(reply)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and "8388608" in error["message"]


def test_a_50_mb_body_sent_whole_is_refused(server: LiveServer, tally: Tally) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 50_000_000}]}).encode()
    try:
        response = post(server, body)
    except httpx.TransportError:  # the server answered 413 and closed while the client was still sending
        tally.cut_off += 1
    else:
        tally.record(response.status_code)
        assert response.status_code == 413 and error_of(response)["code"] == "request_too_large"
    assert post(server, VALID).status_code == 200


def test_a_chunked_body_over_the_cap_is_a_413(start_server: ServerFactory, tally: Tally) -> None:
    """Without a Content-Length, the cap is checked as the body streams in."""
    server = start_server(max_request_bytes=64 * 1024)
    sock = raw_head(server, "Transfer-Encoding: chunked\r\n")
    try:
        chunk = b"x" * 16384
        for size in (16384, 16384, 16384, 16384, 1):  # one byte over the cap, and no more (nothing left unread
            sock.sendall(b"%x\r\n" % size + chunk[:size] + b"\r\n")  # that would make the close a reset)
        reply = read_reply(sock, timeout=5)
    finally:
        sock.close()
    tally.record_reply(reply)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert post(server, VALID).status_code == 200


# -- text too long for the context --------------------------------------------------------------------------------


class RecordingTokenizer:
    """The Qwen3 tokenizer, remembering the length of the longest text it was asked to encode."""

    def __init__(self, inner: HFTokenizer) -> None:
        self.inner = inner
        self.longest = 0

    def encode(self, text: str) -> list[int]:
        self.longest = max(self.longest, len(text))
        return self.inner.encode(text)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.inner.token_to_id(token)


@pytest.mark.parametrize("tools", [None, [CALCULATOR_TOOL]], ids=["agent", "tools"])
def test_text_too_long_for_the_context_is_refused_before_it_is_tokenized(
    start_server: ServerFactory, tokenizer: HFTokenizer, tools: list[dict[str, Any]] | None, tally: Tally
) -> None:
    recording = RecordingTokenizer(tokenizer)
    engine = ScriptedEngine(recording, policy=calculator_policy(tokenizer), context_length=4096)
    server = start_server(engine=engine)
    assert post(server, VALID).status_code == 200
    before = recording.longest
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "What is 1 + 1? " + "x" * 4_000_000}]}
    if tools:
        huge["tools"] = tools
    response = post(server, huge)
    tally.record(response.status_code)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "characters" in error["message"] and "4096" in error["message"]
    assert recording.longest == before  # the 4 MB text never reached the tokenizer


# -- deep nesting and huge numbers --------------------------------------------------------------------------------


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def call_message(arguments: str) -> list[dict[str, Any]]:
    return [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]  # fmt: skip


def body_with(field: str, raw_value: str) -> bytes:
    """A valid request whose message 0 carries `field` set to `raw_value` (raw JSON text)."""
    return f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi", "{field}": {raw_value}}}]}}'.encode()


def request_with(raw_value: str, **fields: Any) -> bytes:
    """A request of `fields` (plus model and messages when not given) where the value "@" stands for `raw_value`."""
    return json.dumps({"model": MODEL, "messages": USER, **fields}).replace('"@"', raw_value).encode()


DIGITS = "9" * 5000
ARGUMENTS = "messages[1].tool_calls[0].function.arguments"
HOSTILE: list[tuple[str, bytes, str | None]] = [
    # (name, body, the field the error must name (None: the body as a whole))
    ("deep_array_in_message", body_with("x", nested(100_000)), "messages[0].x"),
    ("deep_objects_in_message", body_with("x", nested_objects(100_000)), "messages[0].x"),
    ("deep_array_2000", body_with("x", nested(2000)), "messages[0].x"),
    ("deep_content", body_with("content", nested(100_000, '"x"')), "messages[0]"),
    ("deep_tool_schema", request_with(nested_objects(50_000), tools=[{"type": "function", "function": {
        "name": "f", "parameters": "@"}}]), "tools[0].function.parameters"),
    ("deep_tool_choice", request_with(nested(100_000), tool_choice="@"), "tool_choice"),
    ("deep_body", nested(100_000).encode(), None),
    ("unclosed_deep_body", b"[" * 100_000, None),
    ("huge_int_in_message", body_with("x", DIGITS), "messages[0].x"),
    ("huge_int_seed", request_with(DIGITS, seed="@"), "seed"),
    ("huge_float_mantissa", body_with("x", "0." + DIGITS), "messages[0].x"),
    ("huge_exponent_temperature", request_with("1e999", temperature="@"), "temperature"),
    ("seed_beyond_int64", request_with("", seed=10**30), "seed"),
    ("max_tokens_beyond_int32", request_with("", max_tokens=10**12), "max_tokens"),
    ("top_k_beyond_int32", request_with("", top_k=10**12), "top_k"),
    ("arguments_string_huge_int", request_with("", messages=call_message('{"expression": ' + DIGITS + "}")),
     ARGUMENTS),
    ("arguments_string_deep", request_with("", messages=call_message('{"expression": ' + nested(2000) + "}")),
     ARGUMENTS),
    ("arguments_object_deep", request_with('{"expression": ' + nested(2000) + "}", messages=call_message("@")),
     ARGUMENTS),
    ("lone_surrogate_content", b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}'
     % MODEL.encode(), "messages[0].content"),
    ("invalid_utf8", b'{"model": "%s", "messages": [{"role": "user", "content": "\xff\xfe"}]}' % MODEL.encode(), None),
    ("nul_in_json", b'{"model": "%s", "messages": [\x00]}' % MODEL.encode(), None),
    ("empty_body", b"", None),
    ("null_body", b"null", None),
    ("huge_number_body", DIGITS.encode(), None),
    ("many_tiny_messages", request_with("", messages=[{"role": "user", "content": ""}] * 200_000), "messages"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_json_is_a_400_naming_the_field(
    server: LiveServer, body: bytes, param: str | None, tally: Tally
) -> None:
    response = post(server, body)
    tally.record(response.status_code)
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    if param is None:
        return
    tally.named.append(error["param"] is not None and error["param"].startswith(param) and param in error["message"])
    assert error["param"] is not None and error["param"].startswith(param), error
    assert param in error["message"]


TOWER_124 = "[" * 122 + "[[]]" + "]" * 122  # 124 levels, the innermost two of them empty pairs


@pytest.mark.parametrize(
    ("x", "status"),
    [
        (nested(10), 200),
        (nested(125), 200),  # the body's own object, `messages`, message 0, then 125 levels: 128 in all
        (nested(126), 400),
        ("[" + TOWER_124 + "," + nested(124) + "]", 200),  # two towers side by side: 128 in all
        ("[[" + TOWER_124 + "]]", 400),  # 129 levels, found past the empty pairs dropped first
    ],
    ids=["shallow", "128_levels", "129_levels", "two_towers_of_128", "129_levels_empty_leaves"],
)
def test_nesting_is_refused_exactly_past_the_limit(server: LiveServer, x: str, status: int, tally: Tally) -> None:
    response = post(server, body_with("x", x))
    if status == 400:  # the ones at the limit are no hostile requests: they must be served
        tally.record(response.status_code)
    assert response.status_code == status, response.text[:300]
    if status == 400:
        assert error_of(response)["param"].startswith("messages[0].x[0]")


def test_bodies_held_at_once_are_bounded_and_small_requests_still_pass(
    start_server: ServerFactory, tally: Tally
) -> None:
    """Bodies are read before a slot is taken, so their bytes are budgeted across requests: once the stalled
    bodies hold the budget, a further big body is a 429, while a small request still fits and is served."""
    server = start_server(
        max_request_bytes=64 * 1024, max_buffered_request_bytes=160 * 1024, request_read_timeout_s=2.5
    )
    part = b"x" * (60 * 1024)
    stalled = [raw_head(server, f"Content-Length: {64 * 1024}\r\n", part) for _ in range(2)]  # 120 KiB held
    try:
        time.sleep(0.5)
        third = raw_head(server, f"Content-Length: {64 * 1024}\r\n", part)  # would hold 180 KiB
        refused = read_reply(third, timeout=5)
        third.close()
        tally.record_reply(refused)
        assert refused.startswith(b"HTTP/1.1 429"), refused[:200]
        assert b"retry-after: 1" in refused.lower() and b"server_overloaded" in refused
        assert post(server, VALID).status_code == 200  # a small body still fits
        replies = [read_reply(sock, timeout=10) for sock in stalled]
    finally:
        for sock in stalled:
            sock.close()
    for reply in replies:
        tally.record_reply(reply)
    assert all(reply.startswith(b"HTTP/1.1 408") for reply in replies)
    metrics = server.metrics()
    assert metrics["rejected_body_budget"] == 1 and metrics["server_errors"] == 0
    assert post(server, VALID).status_code == 200  # every byte was given back


def test_after_the_hostile_requests_the_server_counted_no_5xx_and_serves(server: LiveServer) -> None:
    """The server the corpus above went to (runs after it in file order; holds whichever subset was selected)."""
    metrics = server.metrics()
    assert metrics["server_errors"] == 0 and metrics["in_flight"] == 0
    assert post(server, VALID).status_code == 200


# -- a component that raises inside a request ---------------------------------------------------------------------


def raising_protocol(error: BaseException) -> ChatProtocol:
    """Qwen3's protocol, except that reading the model's output raises `error` (a bug in a protocol plug-in)."""
    base = get_protocol("qwen3")

    class Broken(type(base)):  # type: ignore[misc]
        def parse_assistant_text(self, text: str, *, call_id_prefix: str = "call") -> Action:
            raise error

    broken = copy.copy(base)
    broken.__class__ = Broken
    return broken


@pytest.fixture(params=[RuntimeError("the parser broke"), RecursionError("too deep"), SystemExit(3)],
                ids=["RuntimeError", "RecursionError", "SystemExit"])  # fmt: skip
def broken_server(request: pytest.FixtureRequest, start_server: ServerFactory, tmp_path: Any) -> Iterator[LiveServer]:
    recipe = dataclasses.replace(calculator_recipe(), protocol=raising_protocol(request.param))
    yield start_server(recipe=recipe, trajectory_log=str(tmp_path / "log.jsonl"))


@pytest.fixture
def logged() -> Iterator[list[MutableMapping[str, Any]]]:
    """The server's log events during the test (captured: no console rendering of tracebacks)."""
    with structlog.testing.capture_logs() as events:
        yield events


def test_a_raising_component_ends_only_its_request_in_tools_mode(
    broken_server: LiveServer, logged: list[MutableMapping[str, Any]]
) -> None:
    server = broken_server
    outcomes: list[int] = []

    def one() -> None:
        outcomes.append(post(server, {"model": MODEL, "messages": USER, "tools": [CALCULATOR_TOOL]}).status_code)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert outcomes == [500] * 4
    response = post(server, {"model": MODEL, "messages": USER, "tools": [CALCULATOR_TOOL]})
    error = error_of(response)
    assert error["type"] == "server_error" and error["code"] == "parse_error", error
    streamed = post(server, {"model": MODEL, "messages": USER, "tools": [CALCULATOR_TOOL], "stream": True})
    assert (
        streamed.status_code == 200 and '"parse_error"' in streamed.text and streamed.text.endswith("data: [DONE]\n\n")
    )
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert server.trajectory_log is not None
    records = list(read_trajectories(server.trajectory_log))
    assert len(records) == 6 and all(r.errors and r.errors[-1].code == "parse_error" for r in records)
    assert server.metrics()["in_flight"] == 0
    assert sum(e["event"] == "component_failed" and e.get("code") == "parse_error" for e in logged) == 6


def test_a_raising_component_ends_only_its_request_in_agent_mode(
    broken_server: LiveServer, logged: list[MutableMapping[str, Any]]
) -> None:
    server = broken_server
    response = post(server, {"model": MODEL, "messages": USER})
    assert response.status_code >= 500 and error_of(response)["type"] == "server_error"
    assert error_of(response)["code"] in ("parse_error", "internal_error")  # the session's code, or the server's
    streamed = post(server, {"model": MODEL, "messages": USER, "stream": True})
    assert streamed.status_code == 200 and '"error"' in streamed.text and streamed.text.endswith("data: [DONE]\n\n")
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert server.trajectory_log is not None
    records = list(read_trajectories(server.trajectory_log))
    assert len(records) == 2  # both episodes recorded, with what broke them
    assert all(r.errors and r.errors[-1].code in ("parse_error", "internal_error") for r in records)
    assert server.metrics()["in_flight"] == 0
    assert any(e["log_level"] in ("warning", "error") for e in logged)
