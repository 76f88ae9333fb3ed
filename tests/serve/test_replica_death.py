"""A request in flight on a replica that dies: `apps/serve --replicas 2 --store redis://...` (a real subprocess, real
Ray Serve, a real `redis-server`) over one upstream completions server (the scripted calculator policy on real Qwen3
ids) that answers slowly. A tools-mode follow-up is sent; once it has reached the upstream, the replica process
holding that connection is killed (SIGKILL). What the client sees is Ray Serve's proxy's answer (checked: a 5xx, no
JSON error body of ours); the conversation stored in Redis is intact, and the same follow-up sent again is answered
by the other replica, continuing the stored ids token-exactly (the upstream receives the same prompt ids as from the
killed attempt, and the answering replica counts a prefix hit, no re-render).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
SLOW_S = 60.0  # the upstream's delay while the follow-up is in flight: far longer than the kill takes


@pytest.fixture
def upstream(qwen3_tokenizer_file: Path) -> Iterator[CompletionsServer]:
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
    with CompletionsServer(engine, model=MODEL) as server:
        yield server


def sender(replicas: list[psutil.Process], port: int | None) -> psutil.Process:
    """The replica process whose TCP connection has local port `port` (it sent the request in flight)."""
    (process,) = [p for p in replicas if any(c.laddr.port == port for c in p.net_connections(kind="tcp"))]
    return process


def test_a_follow_up_in_flight_on_a_killed_replica_fails_retryably_and_its_retry_continues_exactly(
    tiny_qwen3_dir: Path, upstream: CompletionsServer
) -> None:
    redis_server = RedisServer(free_port()).start()
    args = [
        "--model", str(tiny_qwen3_dir), "--engine", "openai", "--engine-model", MODEL, "--engine-url",
        upstream.base_url, "--port", str(free_port()), "--replicas", "2", "--store", redis_server.url,
        "--log-format", "json",
    ]  # fmt: skip
    try:
        with ServeProcess(args, start_timeout=300) as app, httpx.Client(base_url=app.url, timeout=120) as client:
            messages: list[Any] = [{"role": "user", "content": "What is 17 * 23?"}]
            body: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": [CALCULATOR_TOOL], "temperature": 0}
            first = client.post("/v1/chat/completions", json=body)
            assert first.status_code == 200, first.text
            call = first.json()["choices"][0]["message"]
            messages += [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "391"}]

            upstream.faults.delay_s = SLOW_S
            sent = len(upstream.requests)
            started = time.monotonic()
            with ThreadPoolExecutor(1) as pool:
                pending = pool.submit(client.post, "/v1/chat/completions", json=body)
                while len(upstream.requests) == sent:
                    assert time.monotonic() - started < 60, "the follow-up never reached the upstream"
                    time.sleep(0.02)
                replicas = replica_processes(psutil.Process(app.process.pid))
                dying = sender(replicas, upstream.request_ports[sent])
                dying.kill()
                failed = pending.result()
            seconds = time.monotonic() - started
            upstream.faults.delay_s = 0.0

            # what the client sees: Ray Serve's proxy answers for the dead replica, at once, with a 5xx
            assert failed.status_code == 500, (failed.status_code, failed.text)
            assert "x-agent-replica" not in failed.headers  # no replica wrote it
            assert seconds < SLOW_S / 2, seconds  # not after the upstream's delay: when the replica died

            # the same follow-up again: the other replica continues the stored ids
            retried = client.post("/v1/chat/completions", json=body)
            assert retried.status_code == 200, retried.text
            assert retried.json()["choices"][0]["message"]["content"].strip() == "The answer is 391."
            assert upstream.requests[-1]["prompt"] == upstream.requests[sent]["prompt"]  # token-exact, as before
            answered_by = retried.headers["x-agent-replica"]
            metrics = client.get("/metrics")
            while metrics.headers["x-agent-replica"] != answered_by:
                metrics = client.get("/metrics")
            assert metrics.json()["transcript_prefix_hits"] >= 1 and metrics.json()["transcript_rerenders"] == 0
        assert app.returncode == 0, app.stderr[-3000:]
    finally:
        redis_server.stop()
    print(f"\nthe client saw: {failed.status_code} {failed.headers.get('content-type')} {failed.text[:300]!r}")
