"""The Redis transcript store (`--store redis://...`) against a real `redis-server` on a free loopback port: the same
ids as the in-memory store, two servers continuing each other's conversations token-exactly, a take that leaves the
entry for a retry, TTL expiry, an entry over the bound, Redis killed mid-conversation (answers go on, follow-ups
re-rendered and counted) and restarted, and a store URL that is malformed or unreachable at startup.

CI installs Debian's redis-server (`.ci/run`) and sets AGENT_SERVE_REQUIRE_REDIS=1, so there a missing binary fails
these tests; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
from starlette.testclient import TestClient

from agent_protocol import HFTokenizer, Message, get_protocol
from agent_runtime import ScriptedEngine
from agent_runtime.conversation import Conversation
from agent_runtime.serving import (
    RedisTranscriptStore,
    ServeConfig,
    ServeConfigError,
    StoreUnavailable,
    create_app,
)
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.support.calculator_policy import CALCULATOR_TOOL, answer_text, calculator_policy, tool_call_text
from tests.support.calculator_recipe import calculator_recipe

REDIS = shutil.which("redis-server")
if REDIS is None:
    if os.environ.get("AGENT_SERVE_REQUIRE_REDIS") == "1":
        raise RuntimeError("redis-server is missing; install Debian's redis-server (`apt-get install -y redis-server`)")
    pytest.skip("redis-server is missing (apt-get install -y redis-server)", allow_module_level=True)

QUESTION = "What is 17 * 23?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A `redis-server` this test started, with no persistence, on `port`; `stop` kills it, `start` again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        assert REDIS is not None
        self.process = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port()).start()
    yield server
    server.stop()


def first_turn(server: LiveServer) -> list[Any]:
    """Ask the question; the conversation the client sends back, the tool's answer appended."""
    client = server.client()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "391"})
    return messages


def follow_up(server: LiveServer, messages: list[Any]) -> str | None:
    second = server.client().chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    return second.choices[0].message.content


def conversation(server: LiveServer, questions: int) -> None:
    """`questions` questions in one conversation, each a tool call, its result sent back, and an answer."""
    client = server.client()
    messages: list[Any] = []
    for i in range(questions):
        a, b = 100 + i, 7 + 3 * i
        messages.append({"role": "user", "content": f"What is {a} * {b}?"})
        while True:
            reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                assert message.content == f"The answer is {a * b}."
                break
            (call,) = message.tool_calls
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(a * b)})


def test_the_redis_store_gives_the_ids_of_the_memory_store(
    start_server: ServerFactory, tokenizer: HFTokenizer, redis_server: RedisServer
) -> None:
    engines = [ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25) for _ in range(2)]
    memory = start_server(engine=engines[0])
    shared = start_server(engine=engines[1], store=redis_server.url)
    for server in (memory, shared):
        conversation(server, questions=3)

    assert engines[1].calls == engines[0].calls and len(engines[0].calls) == 6
    counted = ("transcript_prefix_hits", "transcript_rerenders", "reused_prompt_tokens", "rendered_prompt_tokens")
    metrics = [server.metrics() for server in (memory, shared)]
    assert [metrics[1][name] for name in counted] == [metrics[0][name] for name in counted]
    assert metrics[1]["transcript_prefix_hits"] == 5 and metrics[1]["transcript_rerenders"] == 0
    store = metrics[1]["transcript_store"]
    assert store["kind"] == "redis" and store["state"] == "ok" and store["hits"] == 5 and store["puts"] == 6


def test_two_servers_continue_each_others_conversations_token_exactly(
    start_server: ServerFactory, tokenizer: HFTokenizer, redis_server: RedisServer
) -> None:
    # The model sampled a non-canonical tokenization of its call: only the stored ids give it back.
    text = tool_call_text("17 * 23")
    cut = text.index("lator")
    sampled = tokenizer.encode(text[:cut]) + tokenizer.encode(text[cut:])
    assert sampled != tokenizer.encode(text)
    a = ScriptedEngine(tokenizer, [sampled])
    b = ScriptedEngine(tokenizer, [answer_text("The answer is 391.")])
    one, two = start_server(engine=a, store=redis_server.url), start_server(engine=b, store=redis_server.url)

    messages = first_turn(one)
    assert follow_up(two, messages) == "The answer is 391."

    feedback = get_protocol("qwen3").render_feedback([{"role": "tool", "content": "391"}])
    assert b.calls[0] == a.calls[0] + sampled + tokenizer.encode(feedback)
    assert two.metrics()["transcript_prefix_hits"] == 1


def test_a_taken_entry_stays_for_retakes(
    start_server: ServerFactory, tokenizer: HFTokenizer, redis_server: RedisServer
) -> None:
    servers = [
        start_server(engine=ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer)), store=redis_server.url)
        for _ in range(2)
    ]
    messages = first_turn(servers[0])
    # Two follow-ups to the one stored turn, at once, on two servers (a client that retries, or branches): both
    # continue its ids; neither is rendered from scratch.
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda server: follow_up(server, messages), servers))
    assert answers == ["The answer is 391."] * 2
    metrics = [server.metrics() for server in servers]
    assert sum(m["transcript_prefix_hits"] for m in metrics) == 2
    assert sum(m["transcript_rerenders"] for m in metrics) == 0

    async def takes() -> tuple[list[bool], int, int]:
        store = RedisTranscriptStore(redis_server.url, ttl_s=3600, retake_s=30)
        conversation = Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=8, max_context_tokens=4096)
        await conversation.open_history([Message(role="user", content=QUESTION)])
        assert await store.aput("k", "c", conversation)
        with redis.Redis.from_url(redis_server.url) as client:
            before = client.pttl(store.prefix + "k")
            got = await asyncio.gather(*(store.atake("k") for _ in range(32)))
            after = client.pttl(store.prefix + "k")
        await store.aclose()
        return [entry is not None for entry in got], before, after

    got, before, after = asyncio.run(takes())
    assert all(got)  # 32 takes on 32 connections: each gets the entry
    assert before > 3_000_000 and 0 < after <= 30_000  # a take leaves it for retake_s, not the whole TTL
    with pytest.raises(ValueError, match="retake_s"):
        RedisTranscriptStore(redis_server.url, retake_s=0)


def test_an_entry_is_a_prefixed_key_with_a_ttl_and_garbage_under_it_is_no_transcript(
    tokenizer: HFTokenizer, redis_server: RedisServer
) -> None:
    async def run() -> None:
        store = RedisTranscriptStore(redis_server.url, ttl_s=60, prefix="test:")
        conversation = Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=8, max_context_tokens=4096)
        await conversation.open_history([Message(role="user", content=QUESTION)])
        assert await store.aput("k", "c", conversation)
        with redis.Redis.from_url(redis_server.url) as client:
            assert client.keys("*") == [b"test:k"] and 59_000 < client.pttl("test:k") <= 60_000
            client.set("test:bad", b"\x93not an entry")
        entry = await store.atake("k")
        assert (
            entry is not None
            and entry.restore(Conversation(get_protocol("qwen3"), tokenizer, max_new_tokens=8, max_context_tokens=4096))
            .segments[0]
            .ids
            == conversation.segments[0].ids
        )
        with pytest.raises(StoreUnavailable, match="reading the entry under bad"):
            await store.atake("bad")
        assert store.stats()["failures"] == 1
        await store.aclose()

    asyncio.run(run())


def test_an_entry_expires_after_the_ttl(
    start_server: ServerFactory, tokenizer: HFTokenizer, redis_server: RedisServer
) -> None:
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer))
    server = start_server(engine=engine, store=redis_server.url, store_ttl_s=0.3)
    messages = first_turn(server)
    time.sleep(0.6)
    assert follow_up(server, messages) == "The answer is 391."
    metrics = server.metrics()
    assert metrics["transcript_rerenders"] == 1 and metrics["transcript_rerenders_store_unavailable"] == 0


def test_an_entry_over_the_byte_bound_is_not_stored(
    start_server: ServerFactory, tokenizer: HFTokenizer, redis_server: RedisServer
) -> None:
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer))
    server = start_server(engine=engine, store=redis_server.url, transcript_store_bytes=200)
    messages = first_turn(server)
    assert follow_up(server, messages) == "The answer is 391."
    metrics = server.metrics()
    assert metrics["transcript_rerenders"] == 1 and metrics["transcript_store"]["refused"] == 2
    assert metrics["transcript_store"]["puts"] == 0 and metrics["transcript_store_put_failures"] == 0


def test_redis_killed_mid_conversation_re_renders_then_recovers(
    start_server: ServerFactory, tokenizer: HFTokenizer, redis_server: RedisServer
) -> None:
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer))
    server = start_server(engine=engine, store=redis_server.url)
    messages = first_turn(server)
    redis_server.stop()

    assert follow_up(server, messages) == "The answer is 391."  # answered all the same, from a fresh render
    rendered = get_protocol("qwen3").render_prompt(
        [{**m, "tool_calls": m.get("tool_calls")} if m["role"] == "assistant" else m for m in messages],
        tools=[CALCULATOR_TOOL],
    )
    assert engine.calls[1] == tokenizer.encode(rendered)
    metrics = server.metrics()
    assert metrics["transcript_rerenders"] == 1 and metrics["transcript_rerenders_store_unavailable"] == 1
    assert metrics["transcript_store_put_failures"] == 1 and metrics["server_errors"] == 0
    health = httpx.get(f"{server.url}/health", timeout=10).json()
    assert health["transcript_store"] == {"kind": "redis", "state": "unavailable"}
    assert "Connection" in metrics["transcript_store"]["last_error"]

    redis_server.start()  # the same port, empty: the server reconnects by itself
    conversation(server, questions=1)
    metrics = server.metrics()
    assert metrics["transcript_prefix_hits"] == 1 and metrics["transcript_rerenders_store_unavailable"] == 1
    assert httpx.get(f"{server.url}/health", timeout=10).json()["transcript_store"]["state"] == "ok"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:6379/0", "expected 'memory' or redis://"),
        ("redis://127.0.0.1:port/0", "bad port"),
        ("redis:///0", "no host"),
        ("redis://127.0.0.1:6379/zero", "must be a number"),
    ],
)
def test_a_malformed_store_url_is_refused(url: str, says: str) -> None:
    with pytest.raises(ServeConfigError, match=says) as raised:
        ServeConfig(model_name=MODEL, store=url)
    assert raised.value.fields == ("store",)


def test_the_store_flags_name_themselves_in_their_errors() -> None:
    parser = argparse.ArgumentParser()
    ServeConfig.add_arguments(parser)
    args = parser.parse_args(["--store", "redis://127.0.0.1:6379/0", "--store-ttl", "90"])
    config = ServeConfig.from_args(args, model_name=MODEL)
    assert (config.store, config.store_ttl_s) == ("redis://127.0.0.1:6379/0", 90.0)
    assert ServeConfig.from_args(parser.parse_args([]), model_name=MODEL).store == "memory"
    with pytest.raises(ServeConfigError, match=r"^--store 'redis://h:x/0': bad port"):
        ServeConfig.from_args(parser.parse_args(["--store", "redis://h:x/0"]), model_name=MODEL)
    with pytest.raises(ServeConfigError, match=r"^--store-ttl must be greater than 0"):
        ServeConfig.from_args(parser.parse_args(["--store-ttl", "0"]), model_name=MODEL)


def test_an_unreachable_store_fails_the_start_saying_why(tokenizer: HFTokenizer) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    app = create_app(ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer)), calculator_recipe(),
                     ServeConfig(model_name=MODEL, store=url))  # fmt: skip
    with (
        pytest.raises(StoreUnavailable, match=rf"redis store at {url}: ping failed: .*(refused|Connect)"),
        TestClient(app),
    ):
        pass
