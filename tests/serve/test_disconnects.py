"""Clients that hang up: a plain (not streamed) chat completion whose client goes away is cancelled, its engine
request with it, and its concurrency slot is free again within a second, on every engine.

Each test sends four completions on raw sockets to a real server (uvicorn in a thread) with
``max_concurrency=4`` and a slow engine, waits until all four hold a slot, and closes the four sockets. It then
measures how long the slots stay taken (``in_flight`` in ``/metrics``), sends four valid completions (all must
be answered 200, none 429), and checks that the engine saw each abandoned call cancelled: the scripted engine's
call raised `CancelledError`, the hf engine dropped the rows from its batch (`abandoned_requests`), the openai
engine hung up on its upstream (which counts it). Before, the four slots stayed taken until each generation ran
to its end (30 s here, `max_new_tokens` in general) and every other client got 429 meanwhile. Run with ``-s``
to see the figures:

    uv run pytest tests/serve/test_disconnects.py -s -q
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import LLMEngine, ScriptedEngine
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.openai_http import OpenAIEngine
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy
from tests.support.completions_server import CompletionsServer

SLOTS = 4
FREED_WITHIN_S = 1.0
WAIT_S = 8.0  # how long a test waits for a slot to come back before it reports the failure


class WatchedEngine(ScriptedEngine):
    """The server tests' scripted engine, `slow_s` slower while a test wants it slow, counting the calls that
    were cancelled under it."""

    def __init__(self, tokenizer: HFTokenizer, slow_s: float) -> None:
        super().__init__(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
        self.slow_s = slow_s
        self.cancelled = 0

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        try:
            if self.slow_s:
                await asyncio.sleep(self.slow_s)
            return await super().generate(prompt_ids, sampling, images=images)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def _body(tools: bool, **extra: Any) -> bytes:
    request: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "What is 12 * 7?"}]}
    if tools:
        request["tools"] = [CALCULATOR_TOOL]
    return json.dumps(request | extra).encode()


def _send_and_hold(server: LiveServer, body: bytes) -> socket.socket:
    """A client that sends a whole completion request and then only waits (until the test closes it)."""
    client = socket.create_connection(("127.0.0.1", server.port))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    client.sendall(head.encode() + body)
    return client


def _in_flight(server: LiveServer) -> int:
    return int(server.metrics()["in_flight"])


def _until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _abandon(server: LiveServer, body: bytes) -> float:
    """Four clients send `body` and hang up once all four hold a slot; the seconds until the slots are free
    (`WAIT_S` and more when they never are)."""
    clients = [_send_and_hold(server, body) for _ in range(SLOTS)]
    assert _until(lambda: _in_flight(server) == SLOTS, 20), "the four requests never all took a slot"
    time.sleep(0.2)  # well inside the engine call
    hung_up = time.monotonic()
    for client in clients:
        client.close()
    _until(lambda: _in_flight(server) == 0, WAIT_S)
    return time.monotonic() - hung_up


def _valid_requests(server: LiveServer, body: bytes, timeout_s: float = 30) -> list[int]:
    """Four completions sent together right after; their status codes."""

    async def all_four() -> list[int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=timeout_s) as client:
            answers = await asyncio.gather(*(client.post("/v1/chat/completions", content=body) for _ in range(SLOTS)))
        return [a.status_code for a in answers]

    return asyncio.run(all_four())


def _report(engine: str, mode: str, freed_s: float, statuses: list[int], aborted: int) -> None:
    print(
        f"\n{engine}, {mode} mode: slots free {freed_s:.2f} s after {SLOTS} clients hung up "
        f"(max_concurrency={SLOTS}); the {SLOTS} requests that followed: {statuses.count(200)} answered 200, "
        f"{statuses.count(429)} refused 429; engine calls aborted: {aborted}/{SLOTS}"
    )


@pytest.mark.parametrize("tools", [False, True], ids=["agent", "tools"])
def test_scripted_engine_calls_are_cancelled(start_server: ServerFactory, tokenizer: HFTokenizer, tools: bool) -> None:
    engine = WatchedEngine(tokenizer, slow_s=30.0)
    server = start_server(engine=engine, max_concurrency=SLOTS)
    freed_s = _abandon(server, _body(tools))
    engine.slow_s = 0.0
    statuses = _valid_requests(server, _body(tools))
    _report("scripted", "tools" if tools else "agent", freed_s, statuses, engine.cancelled)
    assert freed_s < FREED_WITHIN_S
    assert engine.cancelled == SLOTS
    assert statuses == [200] * SLOTS
    assert server.metrics()["client_disconnects"] == SLOTS


@pytest.fixture
def trickling_upstream(tokenizer: HFTokenizer) -> Iterator[CompletionsServer]:
    with CompletionsServer(ScriptedEngine(tokenizer, policy=lambda _prompt: "The answer is 84.<|im_end|>")) as up:
        yield up


def test_openai_engine_hangs_up_on_its_upstream(
    start_server: ServerFactory, tokenizer: HFTokenizer, trickling_upstream: CompletionsServer
) -> None:
    """The upstream sends its answer a byte every 50 ms (about 40 s in all): the engine reads it until its
    caller is cancelled, then closes the connection, which the upstream counts."""
    upstream = trickling_upstream
    upstream.faults.trickle_s = 0.05
    engine = OpenAIEngine(
        upstream.base_url, model=upstream.model, tokenizer=tokenizer, context_length=4096, max_retries=0
    )
    server = start_server(engine=engine, max_concurrency=SLOTS)
    freed_s = _abandon(server, _body(False))
    _until(lambda: upstream.disconnects == SLOTS, 2.0)
    aborted = upstream.disconnects
    upstream.faults.reset()
    statuses = _valid_requests(server, _body(False))
    _report("openai", "agent", freed_s, statuses, aborted)
    assert freed_s < FREED_WITHIN_S
    assert aborted == SLOTS
    assert statuses == [200] * SLOTS
    asyncio.run(engine.close())


def test_hf_engine_drops_abandoned_rows(start_server: ServerFactory, tiny_hf_engine: LLMEngine) -> None:
    """The tiny model generating 400 tokens for each of four requests (tens of seconds on a CPU): the rows of
    the clients that hung up leave the batch at its next step."""
    engine = tiny_hf_engine
    dropped_before = engine.abandoned_requests  # type: ignore[attr-defined]
    server = start_server(engine=engine, max_concurrency=SLOTS)
    freed_s = _abandon(server, _body(False, max_tokens=400, temperature=1.0))
    _until(lambda: engine.abandoned_requests - dropped_before == SLOTS, 5.0)  # type: ignore[attr-defined]
    dropped = engine.abandoned_requests - dropped_before  # type: ignore[attr-defined]
    statuses = _valid_requests(server, _body(False, max_tokens=2), timeout_s=120)
    _report("hf", "agent", freed_s, statuses, dropped)
    assert freed_s < FREED_WITHIN_S
    assert dropped == SLOTS
    assert statuses == [200] * SLOTS


def test_a_finished_answer_is_unaffected(start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path) -> None:
    """The watcher of the client does not change an answer that is ready first, nor its record."""
    log = tmp_path / "trajectories.jsonl"
    server = start_server(engine=WatchedEngine(tokenizer, slow_s=0.0), trajectory_log=str(log))
    answer = httpx.post(f"{server.url}/v1/chat/completions", content=_body(False), timeout=30)
    assert answer.status_code == 200, answer.text
    assert "84" in answer.json()["choices"][0]["message"]["content"]
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["errors"] == []


def test_an_abandoned_episode_is_recorded_as_such(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    log = tmp_path / "trajectories.jsonl"
    engine = WatchedEngine(tokenizer, slow_s=30.0)
    server = start_server(engine=engine, trajectory_log=str(log))
    client = _send_and_hold(server, _body(False))
    assert _until(lambda: _in_flight(server) == 1, 20)
    client.close()
    assert _until(lambda: log.exists() and bool(log.read_text()), 5.0)
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["code"] for e in record["errors"]] == ["client_disconnected"]
