"""Serving past one process, at small size: `apps/serve --replicas 2` (Ray Serve) with `--store redis://...` (a real
`redis-server`) and the openai engine spread over two upstream completions servers (`--engine-url` twice; each a
`CompletionsServer` serving the scripted calculator policy on real Qwen3 token ids), against the same command in
one process with the in-memory store.

Multi-turn tools-mode conversations whose turns land on different replicas send the upstreams the same token ids
and get the same answers as the one-process run, every follow-up extends its stored transcript (no re-render), and
a replica killed mid-run loses no stored conversation: the follow-ups after the kill are still prefix hits.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from tests.serve.test_ray_replicas import replica_processes
from tests.serve.test_redis_store import RedisServer
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy
from tests.support.completions_server import CompletionsServer
from tests.support.serve_process import ServeProcess, free_port

pytest.importorskip("ray.serve")
if shutil.which("redis-server") is None:  # test_redis_store already skips (or fails on CI) with the reason
    pytest.skip("redis-server is missing", allow_module_level=True)

MODEL = "tiny-qwen3"
QUESTIONS = [f"What is {a} * {b}?" for a, b in ((17, 23), (12, 11), (31, 3), (7, 8), (45, 2), (9, 9))]


@pytest.fixture
def upstreams(qwen3_tokenizer_file: Path) -> Iterator[list[CompletionsServer]]:
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)
    servers = [
        CompletionsServer(ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25), model=MODEL)
        for _ in range(2)
    ]
    for server in servers:
        server.__enter__()
    yield servers
    for server in servers:
        server.__exit__(None, None, None)


def post(client: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    """A retryable failure (a 5xx while a replica dies) is retried as a client would; anything else is returned."""
    for _ in range(10):
        response = client.post("/v1/chat/completions", json=body)
        if response.status_code < 500:
            return response
        time.sleep(0.5)
    return response


def turn(client: httpx.Client, messages: list[Any]) -> tuple[dict[str, Any], str]:
    response = post(client, {"model": MODEL, "messages": messages, "tools": [CALCULATOR_TOOL], "temperature": 0})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    return message, response.headers.get("x-agent-replica", "one process")


def conversation(
    client: httpx.Client, question: str, replicas: list[str], after_second_turn: Callable[[], None] | None = None
) -> list[Any]:
    """Question -> tool call -> result -> answer -> a second question -> tool call -> result -> answer: four
    requests, three of them follow-ups. What the client saw (contents and calls, not the random call ids)."""
    messages: list[Any] = [{"role": "user", "content": question}]
    seen: list[Any] = []
    for step in range(4):
        message, replica = turn(client, messages)
        replicas.append(replica)
        calls = message.get("tool_calls") or []
        seen.append((message.get("content"), [c["function"] for c in calls]))
        messages.append(message)
        if calls:
            messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": f"result {step}"})
        elif step < 3:
            messages.append({"role": "user", "content": "What is 6 - 2?"})
        if step == 1 and after_second_turn is not None:
            after_second_turn()
    return seen


def upstream_prompts(upstreams: list[CompletionsServer]) -> Counter[tuple[int, ...]]:
    prompts = Counter(tuple(body["prompt"]) for server in upstreams for body in server.requests)
    for server in upstreams:
        server.requests.clear()
    return prompts


def replica_metrics(client: httpx.Client) -> dict[str, dict[str, Any]]:
    """/metrics of each replica, asked through the proxy until two answered (a replica that replaces a killed one
    answers once Ray Serve has started it: up to a minute on a busy machine)."""
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        response = client.get("/metrics")
        found[response.headers["x-agent-replica"]] = response.json()
        if len(found) == 2:
            return found
        time.sleep(0.2)
    raise AssertionError(f"only replicas {list(found)} answered /metrics")


def test_conversations_across_replicas_match_one_process_and_survive_a_killed_replica(
    tiny_qwen3_dir: Path, upstreams: list[CompletionsServer]
) -> None:
    base = [
        "--model", str(tiny_qwen3_dir), "--engine", "openai", "--engine-model", MODEL, "--log-format", "json",
        "--engine-url", upstreams[0].base_url, "--engine-url", upstreams[1].base_url,
    ]  # fmt: skip
    with ServeProcess([*base, "--port", str(free_port())]) as one, httpx.Client(base_url=one.url, timeout=60) as client:
        expected = [conversation(client, q, []) for q in QUESTIONS]
    assert one.returncode == 0, one.stderr[-3000:]
    expected_prompts = upstream_prompts(upstreams)
    assert sum(expected_prompts.values()) == 4 * len(QUESTIONS)

    redis_server = RedisServer(free_port()).start()
    try:
        args = [*base, "--port", str(free_port()), "--replicas", "2", "--store", redis_server.url]
        with ServeProcess(args, start_timeout=300) as app, httpx.Client(base_url=app.url, timeout=60) as client:
            half = len(QUESTIONS) // 2
            landed: list[list[str]] = []
            got = []
            for question in QUESTIONS[:half]:
                landed.append([])
                got.append(conversation(client, question, landed[-1]))
            assert any(len(set(replicas)) == 2 for replicas in landed), landed  # turns changed replica
            before = replica_metrics(client)
            assert sum(m["transcript_prefix_hits"] for m in before.values()) == 3 * half
            assert all(m["transcript_rerenders"] == 0 for m in before.values()), before

            # kill a replica in the middle of a conversation; it and the next go on (each follow-up finds its
            # transcript in Redis, whichever replica takes it)
            replicas = replica_processes(psutil.Process(app.process.pid))
            assert len(replicas) == 2
            for i, question in enumerate(QUESTIONS[half:]):
                landed.append([])
                kill = replicas[0].kill if i == 0 else None
                got.append(conversation(client, question, landed[-1], after_second_turn=kill))
            assert not replicas[0].is_running()
            after = replica_metrics(client)
            assert set(after) - set(before), (before.keys(), after.keys())  # the killed replica was replaced
            assert all(m["transcript_rerenders"] == 0 for m in after.values()), after
        assert got == expected
        assert upstream_prompts(upstreams) == expected_prompts  # the same token ids, sent to the upstreams
        assert app.returncode == 0, app.stderr[-3000:]
    finally:
        redis_server.stop()
