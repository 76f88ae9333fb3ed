"""The server on the real vLLM (CPU build): four plain completions whose clients hang up are aborted in vLLM (its
`AsyncLLM` holds no unfinished request for them) and their four slots of ``max_concurrency=4`` are free within a
second; a valid request is answered 200 right after. Before, vLLM generated each to its `max_tokens` for nobody,
the slots held meanwhile. See tests/serve/test_disconnects.py for the other engines. Run with ``-s`` for the figures.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.vllm_cpu.conftest import LoopThread

MODEL = "calculator-agent"
SLOTS = 4


def _until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_vllm_requests_of_clients_that_hang_up_are_aborted(loop: LoopThread, vllm_engine: Any, tmp_path: Path) -> None:
    import uvicorn

    from agent_runtime.serving import ServeConfig, create_app
    from tests.support.calculator_recipe import calculator_recipe

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = ServeConfig(model_name=MODEL, max_concurrency=SLOTS, trajectory_log=str(tmp_path / "t.jsonl"))
    server = uvicorn.Server(uvicorn.Config(create_app(vllm_engine, calculator_recipe(), config), log_level="warning"))
    task = asyncio.run_coroutine_threadsafe(server.serve(sockets=[listener]), loop.loop)
    assert _until(lambda: server.started, 60)
    engine = vllm_engine._engine  # vLLM's AsyncLLM

    def in_flight() -> int:
        return int(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).json()["in_flight"])

    request = {"model": MODEL, "messages": [{"role": "user", "content": "What is 12 * 7?"}], "temperature": 1.0}
    body = json.dumps(request | {"max_tokens": 300}).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    try:
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(SLOTS)]
        for client in clients:
            client.sendall(head.encode() + body)
        assert _until(lambda: engine.get_num_unfinished_requests() == SLOTS, 120), "vLLM never held the four"
        hung_up = time.monotonic()
        for client in clients:
            client.close()
        _until(lambda: in_flight() == 0 and engine.get_num_unfinished_requests() == 0, 10)
        freed_s = time.monotonic() - hung_up
        slots, unfinished = in_flight(), engine.get_num_unfinished_requests()
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=request | {"max_tokens": 4}, timeout=120
        )
        print(
            f"\nvllm, agent mode: slots free and vLLM's requests aborted {freed_s:.2f} s after {SLOTS} clients hung up "
            f"(in flight {slots}, unfinished in vLLM {unfinished}); the request that followed: {answer.status_code}"
        )
        assert (slots, unfinished) == (0, 0)
        assert freed_s < 1.0
        assert answer.status_code == 200, answer.text
    finally:
        server.should_exit = True
        task.result(timeout=30)
        listener.close()
