"""`apps/serve --replicas 2`: the same app in two Ray Serve replicas behind Ray's HTTP proxy, run as a user runs it (a
real subprocess starting a local Ray, the tiny random-weight Qwen3 model on the hf engine in each replica). Both
replicas answer (each response names its replica in `x-agent-replica`), the hostile-request limits hold through the
proxy, a killed replica is replaced while requests keep succeeding, and Ctrl-C stops the server and every Ray process
it started. One server serves the whole scenario: Ray's start costs most of its time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.serve_process import ServeProcess, free_port

pytest.importorskip("ray.serve")

ROOT = Path(__file__).resolve().parents[2]
REPLICA_PROCESS = "ray::ServeReplica:agent:AgentServer"
MAX_REQUEST_BYTES = 16 * 1024
CHAT = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 2}


def replica_processes(server: psutil.Process) -> list[psutil.Process]:
    """The replica actors among the server's descendants (Ray names its actor processes `ray::Class...`)."""
    found = []
    for process in server.children(recursive=True):
        try:
            if " ".join(process.cmdline()).startswith(REPLICA_PROCESS):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def chat(client: httpx.Client) -> str:
    """One chat completion; the replica that answered it. A request the proxy could not place (a 5xx while a
    replica dies) is retried, as a client retries a retryable error; any other answer fails the test."""
    for _ in range(5):
        response = client.post("/v1/chat/completions", json=CHAT)
        if response.status_code < 500:
            break
        time.sleep(0.5)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    return response.headers["x-agent-replica"]


def test_two_replicas_answer_hold_the_limits_survive_a_kill_and_stop_cleanly(tiny_qwen3_dir: Path) -> None:
    args = [
        "--model", str(tiny_qwen3_dir), "--recipe", str(ROOT / "recipes" / "calculator.py"),
        "--port", str(free_port()), "--replicas", "2", "--max-request-bytes", str(MAX_REQUEST_BYTES),
        "--log-format", "json",
    ]  # fmt: skip
    with ServeProcess(args, start_timeout=300) as app:
        server = psutil.Process(app.process.pid)
        client = httpx.Client(base_url=app.url, timeout=60)

        # /health goes through the proxy to either replica; both answer within a few tries
        seen: set[str] = set()
        for _ in range(40):
            response = client.get("/health")
            assert response.status_code == 200
            seen.add(response.headers["x-agent-replica"])
            if len(seen) == 2:
                break
        assert len(seen) == 2, seen
        assert chat(client) in seen

        # each replica is the same app: its limits hold through the proxy, with the app's own error body
        too_big = client.post(
            "/v1/chat/completions", content=b"{" + b" " * MAX_REQUEST_BYTES + b"}",
            headers={"content-type": "application/json"},
        )  # fmt: skip
        assert too_big.status_code == 413, too_big.text
        assert too_big.headers["x-agent-replica"] in seen
        deep = client.post(
            "/v1/chat/completions", content=b'{"model": ' + b"[" * 200 + b"]" * 200 + b"}",
            headers={"content-type": "application/json"},
        )  # fmt: skip
        assert deep.status_code == 400 and "nested" in deep.json()["error"]["message"], deep.text

        # kill one replica's process: Ray Serve starts another; requests keep being answered meanwhile
        replicas = replica_processes(server)
        assert len(replicas) == 2, replicas
        replicas[0].kill()
        answered_by: set[str] = set()
        deadline = time.monotonic() + 120
        while not (answered_by - seen) and time.monotonic() < deadline:
            answered_by.add(chat(client))
            time.sleep(0.5)
        assert answered_by - seen, f"no new replica answered within 120 s: {answered_by}"
        assert len(replica_processes(server)) == 2
        ray_processes = server.children(recursive=True)
        client.close()
    assert app.returncode == 0, app.stderr[-3000:]
    events = [json.loads(line) for line in app.stderr.splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("level") == "error"], events
    # Ctrl-C stopped Ray too: none of the processes it started is left
    left = [p for p in ray_processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [" ".join(p.cmdline()) for p in left]
