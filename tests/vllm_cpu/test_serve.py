"""The server (`agent_runtime.serving.create_app`, what `apps/serve` runs) on the real vLLM (CPU build), over HTTP
with the official openai client: agent mode, agent mode streamed, and tools mode each answer exactly what the same
server on `HFEngine` answers (greedy), and the trajectories it records hold the same token ids.

uvicorn runs on the session's event loop, the loop vLLM's `AsyncLLM` belongs to, as `apps/serve` runs it: one loop
for the server and the engine. What this does not cover is `apps/serve`'s command line building the engine (it
would start a second vLLM, minutes here); that wiring is one `make_engine("vllm", ...)` call.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import read_trajectories
from tests.support.calculator_policy import CALCULATOR_TOOL
from tests.vllm_cpu.conftest import LoopThread

MODEL = "calculator-agent"
QUESTION = "What is 17 * 23?"


class Server:
    """uvicorn serving `create_app(engine, ...)` as a task of the session's loop, on a socket bound up front."""

    def __init__(self, loop: LoopThread, engine: Any, log: Path) -> None:
        import uvicorn

        from agent_runtime.serving import ServeConfig, create_app
        from tests.support.calculator_recipe import calculator_recipe

        self.loop = loop
        self.log = log
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}/v1"
        app = create_app(engine, calculator_recipe(), ServeConfig(model_name=MODEL, trajectory_log=str(log)))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        self.task = asyncio.run_coroutine_threadsafe(self.server.serve(sockets=[self.socket]), loop.loop)

    def client(self) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=self.url, api_key="unused", max_retries=0, timeout=120)

    def stop(self) -> None:
        self.server.should_exit = True
        self.task.result(timeout=30)
        self.socket.close()


@pytest.fixture(scope="module")
def servers(loop: LoopThread, vllm_engine: Any, hf_engine: Any, tmp_path_factory: Any) -> Iterator[dict[str, Server]]:
    folder = tmp_path_factory.mktemp("serve")
    started = {
        name: Server(loop, engine, folder / f"{name}.jsonl")
        for name, engine in [("vllm", vllm_engine), ("hf", hf_engine)]
    }
    deadline = time.monotonic() + 60
    while not all(s.server.started for s in started.values()):
        assert time.monotonic() < deadline, "the servers did not start"
        time.sleep(0.05)
    yield started
    for server in started.values():
        server.stop()


def ask(server: Server, **request: Any) -> Any:
    return server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0.0, max_tokens=16, **request
    )


def test_agent_mode_on_vllm_answers_as_on_hf(servers: dict[str, Server]) -> None:
    vllm, hf = (ask(servers[name]) for name in ("vllm", "hf"))
    assert vllm.choices[0].message.content == hf.choices[0].message.content
    assert vllm.choices[0].finish_reason == hf.choices[0].finish_reason
    assert vllm.usage.completion_tokens == hf.usage.completion_tokens > 0
    (ours,), (theirs,) = (list(read_trajectories(servers[n].log))[-1:] for n in ("vllm", "hf"))
    assert [s.ids for s in ours.segments] == [s.ids for s in theirs.segments]
    assert [s.loss_mask for s in ours.segments] == [s.loss_mask for s in theirs.segments]


def test_agent_mode_streamed_on_vllm_is_the_same_answer(servers: dict[str, Server]) -> None:
    whole = ask(servers["hf"]).choices[0].message.content
    chunks = list(ask(servers["vllm"], stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole and streamed
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_tools_mode_on_vllm_answers_as_on_hf(servers: dict[str, Server]) -> None:
    vllm, hf = (ask(servers[name], tools=[CALCULATOR_TOOL]) for name in ("vllm", "hf"))
    ours, theirs = vllm.choices[0], hf.choices[0]
    assert (ours.message.content, ours.finish_reason) == (theirs.message.content, theirs.finish_reason)
    assert (ours.message.tool_calls or []) == (theirs.message.tool_calls or [])
    assert vllm.usage.prompt_tokens == hf.usage.prompt_tokens
