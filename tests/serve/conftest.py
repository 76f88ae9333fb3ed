"""Fixtures for the server tests: a real uvicorn server on a free port in a background thread, serving the
calculator recipe on a `ScriptedEngine` that answers from the prompt (real Qwen3 token ids, the real tool)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from openai import OpenAI

from agent_protocol import HFTokenizer
from agent_runtime import LLMEngine, ScriptedEngine
from agent_runtime.recipe import Recipe
from agent_runtime.serving import ServeConfig, create_app
from tests.support.calculator_policy import calculator_policy
from tests.support.calculator_recipe import calculator_recipe

MODEL = "calculator-agent"


class LiveServer:
    """A uvicorn server running `app` in a daemon thread, on a socket bound before it starts (no port race)."""

    def __init__(self, app: Any) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.trajectory_log: Path | None = None

    def start(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()

    def client(self, api_key: str = "unused", **kwargs: Any) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=30, **kwargs)

    def metrics(self, api_key: str | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        response = httpx.get(f"{self.url}/metrics", headers=headers, timeout=10)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data


ServerFactory = Callable[..., LiveServer]


@pytest.fixture(scope="session")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


@pytest.fixture(scope="session")
def scripted_engine(tokenizer: HFTokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)


@pytest.fixture(scope="module")
def start_server(tokenizer: HFTokenizer) -> Iterator[ServerFactory]:
    """Start servers for the module; each call: `start_server(engine=..., recipe=..., **ServeConfig fields)`."""
    servers: list[LiveServer] = []

    def start(engine: LLMEngine | None = None, recipe: Recipe | None = None, **config: Any) -> LiveServer:
        engine = engine or ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
        config.setdefault("model_name", MODEL)
        app = create_app(engine, recipe or calculator_recipe(), ServeConfig(**config))
        server = LiveServer(app)
        if config.get("trajectory_log"):
            server.trajectory_log = Path(config["trajectory_log"])
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def calculator_question(i: int) -> tuple[str, str]:
    """A question and its exact expected answer, distinct for each i."""
    a, b = 100 + i, 7 + 3 * i
    return f"What is {a} * {b}?", f"The answer is {a * b}."
