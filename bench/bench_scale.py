"""Throughput and server CPU per request of `apps/serve` in one process against `--replicas N` on Ray Serve, side
by side in one run, both with the transcript store in a real `redis-server` and the openai engine over two upstream
completions servers (`tests/support/completions_server.py`, each serving the scripted calculator policy: real Qwen3
token ids, no model time, in this process).

The load is tools-mode conversations: a question (one model turn returning a calculator call) and its follow-up
with the tool's result (one turn extending the stored transcript), `--concurrency` clients closed-loop for
`--seconds`. Server CPU is the user + system CPU time (psutil `cpu_times`, i.e. /proc/PID/stat) of the `apps/serve`
process and every process under it (with replicas: Ray's GCS, raylet, Serve controller, HTTP proxy and replicas),
read before and after the timed window; the load generator and the upstreams (this process) are excluded.

    uv run python bench/bench_scale.py [--replicas 2] [--seconds 10] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_protocol import HFTokenizer  # noqa: E402
from agent_runtime import ScriptedEngine  # noqa: E402
from tests.serve.test_redis_store import RedisServer  # noqa: E402
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy  # noqa: E402
from tests.support.completions_server import CompletionsServer  # noqa: E402
from tests.support.qwen3_tokenizer import qwen3_tokenizer_path  # noqa: E402
from tests.support.serve_process import ServeProcess, free_port  # noqa: E402
from tests.support.tiny_qwen3 import tiny_qwen3_path  # noqa: E402

MODEL = "tiny-qwen3"


PARTS = {"ray::ServeReplica": "replicas", "ray::ProxyActor": "proxy"}


def server_cpu(pid: int) -> dict[str, float]:
    """User + system CPU seconds, now, of the process and every process under it: in all, and of the Serve
    replicas and the HTTP proxy apart."""
    root = psutil.Process(pid)
    cpu = {"all": 0.0, "replicas": 0.0, "proxy": 0.0}
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            command = " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        cpu["all"] += times.user + times.system
        for prefix, part in PARTS.items():
            if command.startswith(prefix):
                cpu[part] += times.user + times.system
    return cpu


async def conversation(client: httpx.AsyncClient, i: int) -> None:
    messages: list[Any] = [{"role": "user", "content": f"What is {i % 97} * {i % 89 + 2}?"}]
    body = {"model": MODEL, "messages": messages, "tools": [CALCULATOR_TOOL], "temperature": 0}
    first = await client.post("/v1/chat/completions", json=body)
    first.raise_for_status()
    message = first.json()["choices"][0]["message"]
    messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "42"}]
    second = await client.post("/v1/chat/completions", json=body)
    second.raise_for_status()


async def load(url: str, seconds: float, concurrency: int) -> int:
    """Closed loop: `concurrency` clients each running one conversation after another; requests answered."""
    done = 0
    deadline = time.monotonic() + seconds

    async def client_loop(k: int) -> None:
        nonlocal done
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            i = k
            while time.monotonic() < deadline:
                await conversation(client, i)
                done += 2
                i += concurrency

    await asyncio.gather(*(client_loop(k) for k in range(concurrency)))
    return done


def measure(args: list[str], seconds: float, concurrency: int) -> dict[str, float]:
    with ServeProcess([*args, "--port", str(free_port()), "--log-level", "warning"], start_timeout=300) as app:
        asyncio.run(load(app.url, 2, concurrency))  # warm-up: connections, caches, every replica
        cpu0, t0 = server_cpu(app.process.pid), time.monotonic()
        requests = asyncio.run(load(app.url, seconds, concurrency))
        cpu1, t1 = server_cpu(app.process.pid), time.monotonic()
    per_request = {f"cpu_ms_{part}": 1000 * (cpu1[part] - cpu0[part]) / requests for part in cpu0}
    return {"requests": requests, "rps": requests / (t1 - t0), **per_request}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    options = parser.parse_args()
    tokenizer_file = qwen3_tokenizer_path()
    tokenizer = HFTokenizer.from_file(tokenizer_file)
    upstreams = [
        CompletionsServer(ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25), model=MODEL)
        for _ in range(2)
    ]
    redis_server = RedisServer(free_port()).start()
    try:
        for server in upstreams:
            server.__enter__()
        base = [
            "--model", str(tiny_qwen3_path(tokenizer_file)), "--engine", "openai", "--engine-model", MODEL,
            "--engine-url", upstreams[0].base_url, "--engine-url", upstreams[1].base_url,
            "--store", redis_server.url, "--log-format", "json",
        ]  # fmt: skip
        one = measure(base, options.seconds, options.concurrency)
        many = measure([*base, "--replicas", str(options.replicas)], options.seconds, options.concurrency)
    finally:
        for server in upstreams:
            server.__exit__(None, None, None)
        redis_server.stop()
    n = options.replicas
    print(f"# {platform.node()}: {psutil.cpu_count()} CPUs, concurrency {options.concurrency}, {options.seconds} s")
    print("| server | requests/s | requests/s per replica | server CPU ms/request (replicas + proxy + rest) |")
    print("|---|---|---|---|")
    print(f"| one process | {one['rps']:.1f} | {one['rps']:.1f} | {one['cpu_ms_all']:.2f} |")
    rest = many["cpu_ms_all"] - many["cpu_ms_replicas"] - many["cpu_ms_proxy"]
    print(
        f"| {n} Ray Serve replicas | {many['rps']:.1f} ({many['rps'] / one['rps']:.2f}x) | {many['rps'] / n:.1f} | "
        f"{many['cpu_ms_all']:.2f} ({many['cpu_ms_all'] / one['cpu_ms_all']:.2f}x: {many['cpu_ms_replicas']:.2f} + "
        f"{many['cpu_ms_proxy']:.2f} + {rest:.2f}) |"
    )


if __name__ == "__main__":
    main()
