"""One listening gateway per rollout worker (`agent_runtime.proxy.WorkerGateway`): the command programs' episodes
of one worker, OpenRLHF's executor (on the stand-in rollout engine replaying real Qwen3 ids) or the local trainer's
`ProgramRollouts` (the `hf` engine on the tiny demo model), all reach their endpoints through one server on one
port, started by the first of them; closing the worker, or its exit while its loop still runs, stops it (the port
refuses connections). Its address comes from the environment for a cluster."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import sys
import textwrap
import threading
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_runtime.agent_program import AgentProgram
from agent_runtime.proxy import GatewayError, WorkerGateway
from agent_runtime.proxy.worker_gateway import _stop_at_exit
from agent_train.openrlhf.executor import AgentExecutor
from tests.agent_runtime.test_session import answer
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import TASK, openrlhf_params
from tests.support.local_rollout_engine import LocalRolloutEngine

# One model call with the synchronous client, then the base URL it was given, as its answer.
SAYS_ITS_URL = """
import json, os, sys, openai
task = json.load(sys.stdin)
client = openai.OpenAI(max_retries=0)
client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": task["prompt"]}])
print(os.environ["OPENAI_BASE_URL"], flush=True)
"""


def command_recipe() -> Any:
    program = AgentProgram.command([sys.executable, "-c", textwrap.dedent(SAYS_ITS_URL)], timeout_s=60.0)
    return dataclasses.replace(calculator_recipe(), agent=program)


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
    except ConnectionRefusedError:
        return True
    return False


def test_an_executors_command_episodes_share_one_gateway_until_it_closes(
    tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    executor = AgentExecutor(command_recipe())
    engine = LocalRolloutEngine(ScriptedEngine(tokenizer, [answer("The answer is 391.")] * 3))
    params = openrlhf_params(logprobs=True)

    async def worker() -> tuple[list[float], str]:
        episodes = [executor.execute(TASK, "391", params, 4096, hf_tokenizer, engine) for _ in range(2)]
        first = await asyncio.gather(*episodes)  # two at once: the first use starts one gateway between them
        later = await executor.execute(TASK, "391", params, 4096, hf_tokenizer, engine)
        url = executor.worker_gateway.gateway.url
        await executor.aclose()
        return [float(out["extra_logs"]["agent_program_requests"]) for out in [*first, later]], url

    requests, url = asyncio.run(worker())
    assert requests == [1.0] * 3
    assert executor.worker_gateway.started == 1 and executor.worker_gateway.gateway is None
    assert refuses(port_of(url))  # stopped: the port is closed


def test_local_program_rollouts_share_one_gateway_and_close_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tokenizers import Tokenizer

    from agent_runtime.engines.hf import HFEngine
    from agent_train.demo.model import load_demo_model
    from agent_train.local.program_rollouts import ProgramRollouts
    from examples.any_agent.recipe import make_recipe
    from tests.support.tiny_demo import save_tiny_demo_model

    model_dir = save_tiny_demo_model(tmp_path / "tiny", tokenizer_episodes=100)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    recipe = make_recipe("subprocess")  # the example's sync-client script, a process per episode
    rows = list(recipe.rows("test"))[:2]

    async def collect() -> tuple[list[Any], list[str], int]:
        from agent_protocol import HFTokenizer as Wrapped

        engine = HFEngine(load_demo_model(model_dir), Wrapped(raw, source="demo"), context_length=512)
        urls: list[str] = []
        try:
            async with ProgramRollouts(recipe, engine) as rollouts:
                records = await rollouts.collect(rows, group_size=2, temperature=1.0, seed=0)
                urls.append(rollouts.executor.worker_gateway.gateway.url)
                records += await rollouts.collect(rows, group_size=1, temperature=1.0, seed=1)
                urls.append(rollouts.executor.worker_gateway.gateway.url)
                started = rollouts.executor.worker_gateway.started
        finally:
            await engine.close()
        return records, urls, started

    records, urls, started = asyncio.run(collect())
    assert len({r.episode for r in records if r.group < 2}) >= 2  # every episode ran, as a process of its own
    assert all(r.extra_logs["agent_program_program_error"] == 0 for r in records), [r.extra_logs for r in records]
    assert started == 1 and urls[0] == urls[1]
    assert refuses(port_of(urls[0]))


def test_a_worker_never_closed_stops_its_gateway_at_exit() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)  # the vLLM actor's loop, on its own thread
    thread.start()
    try:
        holder = WorkerGateway()
        gateway = asyncio.run_coroutine_threadsafe(holder.get(), loop).result(timeout=15)
        port = port_of(gateway.url)
        assert not refuses(port)
        with pytest.raises(GatewayError, match="on the loop it runs on"):
            asyncio.run(holder.aclose())  # another loop cannot stop it, and it is not forgotten
        assert holder.gateway is gateway and not refuses(port)
        _stop_at_exit(weakref.ref(holder))  # what atexit runs
        assert refuses(port)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def test_the_address_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    monkeypatch.setenv("AGENT_GATEWAY_HOST", "127.0.0.1")
    monkeypatch.setenv("AGENT_GATEWAY_PORT", str(free))
    monkeypatch.setenv("AGENT_GATEWAY_ADVERTISED_HOST", "rollout-7.cluster.internal")

    async def start() -> str:
        holder = WorkerGateway()
        url = (await holder.get()).url
        await holder.aclose()
        return url

    assert asyncio.run(start()) == f"http://rollout-7.cluster.internal:{free}"
    assert WorkerGateway(host="127.0.0.1", port=0, advertised_host=None).advertised_host == "rollout-7.cluster.internal"
    monkeypatch.setenv("AGENT_GATEWAY_PORT", "http")
    with pytest.raises(GatewayError, match="AGENT_GATEWAY_PORT must be a port number, got 'http'"):
        WorkerGateway()
    with pytest.raises(GatewayError, match=r"0\.\.65535"):
        WorkerGateway(port=70000)


def test_command_episodes_through_the_gateway_go_to_the_lockstep_engine_as_their_own_episodes(tmp_path: Path) -> None:
    """The local trainer's engine tells episodes apart by a context variable. A gateway request used to run in the
    context of the episode whose first request started the gateway, so the lockstep engine held the whole round's
    requests as that one episode's and waited for the others until its stall timer went off (every program of the
    example's first evaluation then ran out of time). Each episode's requests must count as its own: no stall and
    nothing passed through outside the waves."""
    pytest.importorskip("torch")
    from tokenizers import Tokenizer

    from agent_protocol import HFTokenizer as Wrapped
    from agent_runtime.engines.hf import HFEngine
    from agent_train.demo.model import load_demo_model
    from agent_train.local.lockstep import LockstepEngine
    from agent_train.local.program_rollouts import ProgramRollouts
    from examples.any_agent.recipe import make_recipe
    from tests.support.tiny_demo import save_tiny_demo_model

    model_dir = save_tiny_demo_model(tmp_path / "tiny", tokenizer_episodes=100)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    recipe = make_recipe("subprocess")
    rows = list(recipe.rows("test"))[:2]

    async def collect() -> tuple[list[Any], LockstepEngine]:
        hf = HFEngine(load_demo_model(model_dir), Wrapped(raw, source="demo"), context_length=512)
        engine = LockstepEngine(hf, stall_s=20.0)
        try:
            async with ProgramRollouts(recipe, engine) as rollouts:
                records = await rollouts.collect(rows, group_size=2, temperature=1.0, seed=0)
        finally:
            await engine.close()
        return records, engine

    records, engine = asyncio.run(collect())
    assert engine.stalls == 0 and engine.passed_through == 0, (engine.stalls, engine.passed_through)
    assert engine.waves >= 1
    assert all(r.extra_logs["agent_program_program_timeout"] == 0 for r in records), [r.extra_logs for r in records]
