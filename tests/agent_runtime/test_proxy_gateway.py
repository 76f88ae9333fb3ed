"""The listening gateway (`agent_runtime.proxy.Gateway`): real uvicorn on loopback, real `openai` clients (async,
sync, streaming) and raw httpx requests against per-episode `EpisodeEndpoint`s on a `ScriptedEngine` that replays
real Qwen3 ids. A session's key opens only its own session; the hostile requests of apps/serve get the same coded
answers; ``/end`` and ``/reward`` take only what they should. And the Done-when of issue 40: the agent of
``examples/any_agent/agent.py`` run as a separate process (``subprocess_agent.py``: sync `openai`, environment
variables only) gives the in-process program's record, id for id."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline, ToolCallReward
from agent_protocol import HFTokenizer
from agent_runtime import Recipe, SamplingParams, ScriptedEngine
from agent_runtime.agent_program import AgentProgram, ProgramCommand, ProgramTask
from agent_runtime.proxy import EpisodeEndpoint, EpisodeEngine, Gateway, GatewayError, GatewaySession, run_program
from examples.any_agent import agent as in_process
from examples.any_agent import subprocess_agent
from examples.any_agent.recipe import SUBPROCESS_AGENT
from tests.agent_runtime.test_session import QUESTION, answer, call

SCRIPT = [call("17 * 23"), answer("The answer is 391.")]
SAMPLING = SamplingParams(max_new_tokens=64)


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def calculator_recipe(program: AgentProgram | None = None) -> Recipe:
    return Recipe(
        name="calc",
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4),
        rewards=RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()]),
        max_new_tokens=64,
        agent=program,
    )


Scenario = Callable[[Gateway, list[GatewaySession], httpx.AsyncClient], Awaitable[Any]]


def on_gateway(tokenizer: HFTokenizer, scenario: Scenario, *, sessions: int = 2, delay_s: float = 0.0) -> Any:
    """Run `scenario` against a started gateway with `sessions` open sessions (one endpoint and engine each; the
    engine sleeps `delay_s` before each generation)."""

    async def main() -> Any:
        async with Gateway() as gateway, httpx.AsyncClient(timeout=30) as http:
            endpoints = [
                EpisodeEndpoint(
                    calculator_recipe(),
                    EpisodeEngine(ScriptedEngine(tokenizer, SCRIPT, delay_s=delay_s), SAMPLING),
                    model_name="policy",
                )
                for _ in range(sessions)
            ]
            opened = [gateway.open(endpoint) for endpoint in endpoints]
            try:
                return await scenario(gateway, opened, http)
            finally:
                for session in opened:
                    gateway.close(session)
                    await session.endpoint.close()

    return asyncio.run(main())


def chat_body(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": QUESTION}]
    return {"model": "policy", "messages": messages, "tools": [in_process.CALCULATOR_TOOL], **extra}


def bearer(session: GatewaySession) -> dict[str, str]:
    return {"Authorization": f"Bearer {session.key}"}


def session_url(session: GatewaySession, route: str) -> str:
    return session.base_url.removesuffix("/v1") + route


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


# -- sessions and keys -----------------------------------------------------------------------------------------


def test_a_key_opens_only_its_own_session(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> None:
        a, b = sessions
        assert a.base_url.startswith(gateway.url) and a.base_url.endswith(f"/sessions/{a.id}/v1") and a.id != b.id
        url = f"{b.base_url}/chat/completions"
        wrong = await http.post(url, json=chat_body(), headers=bearer(a))
        missing = await http.post(url, json=chat_body())
        assert (wrong.status_code, error_code(wrong)) == (401, "invalid_api_key")
        assert (missing.status_code, error_code(missing)) == (401, "invalid_api_key")
        assert wrong.headers["www-authenticate"] == "Bearer"
        for route in ("/end", "/reward"):  # the session's own routes are keyed the same way
            refused = await http.post(session_url(b, route), json={"reward": 1.0}, headers=bearer(a))
            assert refused.status_code == 401
        assert b.endpoint.requests == 0 and b.endpoint.log.records == [] and b.endpoint.engine.calls == 0
        assert not b.finished.done() and b.reward is None
        own = await http.post(f"{a.base_url}/chat/completions", json=chat_body(), headers=bearer(a))
        assert own.status_code == 200 and own.json()["choices"][0]["message"]["tool_calls"]
        assert a.endpoint.requests == 1 and len(a.endpoint.log.records) == 1 and b.endpoint.requests == 0

    on_gateway(tokenizer, scenario)


def test_an_unknown_session_and_an_unknown_route_are_404(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> None:
        (a,) = sessions
        unknown = await http.post(
            f"{gateway.url}/sessions/nope/v1/chat/completions", json=chat_body(), headers=bearer(a)
        )
        assert (unknown.status_code, error_code(unknown)) == (404, "session_not_found")
        nowhere = await http.get(f"{gateway.url}/v1/models", headers=bearer(a))
        assert (nowhere.status_code, error_code(nowhere)) == (404, "not_found")
        assert a.endpoint.requests == 0
        models = await http.get(f"{a.base_url}/models", headers=bearer(a))  # any route of the app, forwarded
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "policy"

    on_gateway(tokenizer, scenario, sessions=1)


def test_a_closed_session_gets_its_endpoints_last_answer(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> None:
        a, b = sessions
        gateway.close(a)
        await a.endpoint.close()
        over = await http.post(f"{a.base_url}/chat/completions", json=chat_body(), headers=bearer(a))
        assert (over.status_code, error_code(over)) == (503, "episode_over")
        ended = await http.post(session_url(a, "/end"), headers=bearer(a))
        assert ended.status_code == 503
        assert (
            await http.post(f"{a.base_url}/chat/completions", json=chat_body(), headers=bearer(b))
        ).status_code == 401
        assert a.endpoint.requests == 0 and gateway.sessions == 1

    on_gateway(tokenizer, scenario)


# -- hostile requests: the serving app's answers ---------------------------------------------------------------


def test_malformed_oversized_and_misrouted_requests_get_the_apps_coded_errors(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> None:
        (a,) = sessions
        url = f"{a.base_url}/chat/completions"
        headers = {**bearer(a), "content-type": "application/json"}
        broken = await http.post(url, content=b'{"model": "policy", "messages": [', headers=headers)
        assert (broken.status_code, error_code(broken)) == (400, "invalid_json")
        deep = await http.post(url, content=b"[" * 200 + b"]" * 200, headers=headers)
        assert deep.status_code == 400  # json_guard's nesting limit, by the app behind the gateway
        head, body = await huge_head(gateway, a, "/v1/chat/completions")  # refused on the head, body never read
        assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower(), head
        assert json.loads(body)["error"]["code"] == "request_too_large"
        head, _ = await huge_head(gateway, a, "/reward")
        assert head.startswith(b"HTTP/1.1 413"), head
        wrong_method = await http.get(url, headers=bearer(a))
        assert (wrong_method.status_code, error_code(wrong_method)) == (405, "invalid_request")
        end_by_get = await http.get(session_url(a, "/end"), headers=bearer(a))
        assert end_by_get.status_code == 405
        assert a.endpoint.engine.calls == 0 and a.endpoint.log.records == []  # none of them reached the engine
        fine = await http.post(url, json=chat_body(), headers=bearer(a))
        assert fine.status_code == 200 and a.endpoint.engine.calls == 1 and len(a.endpoint.log.records) == 1

    on_gateway(tokenizer, scenario, sessions=1)


async def huge_head(gateway: Gateway, session: GatewaySession, route: str) -> tuple[bytes, bytes]:
    """The head of a POST declaring a 50 MB body, and the answer (head, body) the gateway sends without it."""
    host, port = gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    path = session_url(session, route).removeprefix(gateway.url)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {session.key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n".encode()
    )
    await writer.drain()
    try:
        reply = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


# -- /end and /reward ------------------------------------------------------------------------------------------


def test_end_with_and_without_an_answer(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> None:
        a, b = sessions
        wrong = await http.post(session_url(a, "/end"), json={"answer": 391}, headers=bearer(a))
        assert (wrong.status_code, error_code(wrong)) == (400, "invalid_value") and not a.finished.done()
        extra = await http.post(session_url(a, "/end"), json={"answer": "x", "why": "?"}, headers=bearer(a))
        assert extra.status_code == 400 and not a.finished.done()
        ended = await http.post(session_url(a, "/end"), json={"answer": "The answer is 391."}, headers=bearer(a))
        assert ended.status_code == 200 and a.finished.result() == "The answer is 391."
        again = await http.post(session_url(a, "/end"), json={"answer": "other"}, headers=bearer(a))
        assert (again.status_code, error_code(again)) == (409, "session_already_ended")
        assert a.finished.result() == "The answer is 391."
        bare = await http.post(session_url(b, "/end"), headers=bearer(b))
        assert bare.status_code == 200 and b.finished.result() is None

    on_gateway(tokenizer, scenario)


def test_reward_takes_one_finite_number(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> None:
        (a,) = sessions
        url = session_url(a, "/reward")
        headers = {**bearer(a), "content-type": "application/json"}
        for body, code in [
            (b'{"reward": NaN}', "invalid_json"),  # not JSON
            (b'{"reward": 1e999}', "invalid_value"),  # JSON, but infinite
            (b'{"reward": "1.0"}', "invalid_value"),
            (b'{"reward": true}', "invalid_value"),
            (b"{}", "invalid_value"),
            (b"", "invalid_json"),
        ]:
            refused = await http.post(url, content=body, headers=headers)
            assert (refused.status_code, error_code(refused)) == (400, code), body
        assert a.reward is None
        posted = await http.post(url, json={"reward": 0.75}, headers=bearer(a))
        assert posted.status_code == 200 and a.reward == 0.75
        twice = await http.post(url, json={"reward": 1.0}, headers=bearer(a))
        assert (twice.status_code, error_code(twice)) == (409, "reward_already_posted") and a.reward == 0.75
        integer = await http.post(url, json={"reward": 1}, headers=bearer(a))
        assert integer.status_code == 409  # a number of either kind is taken, once

    on_gateway(tokenizer, scenario, sessions=1)


# -- the openai clients ----------------------------------------------------------------------------------------


def test_a_streamed_completion_and_a_sync_client_through_the_gateway(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> None:
        a, b = sessions
        client = openai.AsyncOpenAI(base_url=a.base_url, api_key=a.key, max_retries=0)
        started = time.monotonic()
        arrived: list[float] = []
        try:
            stream = await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": QUESTION}], tools=[in_process.CALCULATOR_TOOL],
                stream=True,
            )  # fmt: skip
            chunks = []
            async for chunk in stream:
                arrived.append(time.monotonic() - started)
                chunks.append(chunk)
        finally:
            await client.close()
        # streamed through: the role chunk comes before the engine's 1.5 s generation, the rest after it
        assert arrived[0] < arrived[-1] - 1.0 and arrived[-1] >= 1.5, arrived
        calls = [c for chunk in chunks for d in chunk.choices for c in (d.delta.tool_calls or [])]
        assert calls and calls[0].function.name == "calculator" and "17 * 23" in calls[0].function.arguments
        assert chunks[-1].choices[-1].finish_reason == "tool_calls" or any(
            d.finish_reason == "tool_calls" for chunk in chunks for d in chunk.choices
        )
        assert a.endpoint.requests == 1 and len(a.endpoint.log.records) == 1

        def sync_turn() -> Any:  # the synchronous client, on a thread: the gateway's loop keeps serving
            with openai.OpenAI(base_url=b.base_url, api_key=b.key, max_retries=0) as sync:
                return sync.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": QUESTION}], tools=[in_process.CALCULATOR_TOOL]
                )

        reply = await asyncio.to_thread(sync_turn)
        assert reply.choices[0].message.tool_calls and b.endpoint.requests == 1

    on_gateway(tokenizer, scenario, delay_s=1.5)


# -- the subprocess agent: the in-process program's record -----------------------------------------------------


def test_the_subprocess_agent_imports_only_openai_and_the_standard_library() -> None:
    assert in_process.calculate is subprocess_agent.calculate  # the in-process agent's tool is the script's
    imported = {
        line.split()[1].partition(".")[0]
        for line in SUBPROCESS_AGENT.read_text().splitlines()
        if line.startswith(("import ", "from "))
    }
    assert imported - {"__future__", "openai"} <= set(sys.stdlib_module_names)


def episode(tokenizer: HFTokenizer, program: AgentProgram, gateway: Gateway | None = None) -> tuple[Any, Any]:
    async def main() -> Any:
        engine = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.25)
        task = ProgramTask(prompt=QUESTION, row={"answer": "391"})
        ran = await run_program(calculator_recipe(program), engine, task, sampling=SAMPLING, gateway=gateway)
        return ran, engine

    return asyncio.run(main())


def test_the_subprocess_agent_gives_the_in_process_programs_record(tokenizer: HFTokenizer) -> None:
    direct, direct_engine = episode(tokenizer, AgentProgram(in_process.calculator_agent, timeout_s=60))
    command = AgentProgram.command([sys.executable, str(SUBPROCESS_AGENT)], timeout_s=60)
    served, served_engine = episode(tokenizer, command)
    assert direct.outcome.code is None and served.outcome.code is None, (direct.outcome, served.outcome)
    assert served.outcome.requests == direct.outcome.requests == 2
    want, got = direct.trajectory, served.trajectory
    assert [s.ids for s in got.segments] == [s.ids for s in want.segments] and len(got.segments) == 1
    assert [s.loss_mask for s in got.segments] == [s.loss_mask for s in want.segments]
    assert [s.logprobs for s in got.segments] == [s.logprobs for s in want.segments]
    assert [s.action_ranges for s in got.segments] == [s.action_ranges for s in want.segments]
    assert got.segments[0].action_ranges and {p for p in got.segments[0].logprobs if p is not None} == {-0.25}
    assert got.reward == want.reward == pytest.approx(1.1)  # matching 1 + a good tool call
    assert got.final_answer == want.final_answer == "The answer is 391."
    assert served_engine.calls == direct_engine.calls  # the same prompt ids at every turn


def test_concurrent_subprocess_episodes_share_one_gateway(tokenizer: HFTokenizer) -> None:
    command = AgentProgram.command([sys.executable, str(SUBPROCESS_AGENT)], timeout_s=60)

    async def main() -> list[Any]:
        async with Gateway() as gateway:
            engines = [ScriptedEngine(tokenizer, SCRIPT, logprob=-0.25) for _ in range(3)]
            recipe = calculator_recipe(command)
            task = ProgramTask(prompt=QUESTION, row={"answer": "391"})
            ran = await asyncio.gather(
                *(run_program(recipe, engine, task, sampling=SAMPLING, gateway=gateway) for engine in engines)
            )
            assert gateway.sessions == 0  # each episode took its session off
            return list(ran)

    episodes = asyncio.run(main())
    first = episodes[0].trajectory.segments[0].ids
    assert all(e.outcome.code is None and e.trajectory.segments[0].ids == first for e in episodes)
    assert len({e.trajectory.episode_id for e in episodes}) == 3


def test_the_recipe_variant_runs_the_script() -> None:
    from examples.any_agent.recipe import make_recipe

    recipe = make_recipe("subprocess")
    assert recipe.agent is not None and recipe.name == "any-agent-subprocess"
    assert isinstance(recipe.agent.agent, ProgramCommand)
    assert recipe.agent.agent.argv == (sys.executable, str(SUBPROCESS_AGENT))


def test_a_gateway_that_cannot_listen_or_is_not_started_says_so(tokenizer: HFTokenizer) -> None:
    async def main() -> None:
        endpoint = EpisodeEndpoint(calculator_recipe(), EpisodeEngine(ScriptedEngine(tokenizer, SCRIPT), SAMPLING),
                                   model_name="policy")  # fmt: skip
        idle = Gateway()
        with pytest.raises(GatewayError, match="not started"):
            idle.open(endpoint)
        async with Gateway() as first:
            port = int(first.url.rsplit(":", 1)[1])
            with pytest.raises(GatewayError, match=f"cannot listen on 127.0.0.1:{port}"):
                await Gateway(port=port).start()
        await endpoint.close()

    asyncio.run(main())


def test_a_gateway_takes_only_endpoints_of_its_own_loop(tokenizer: HFTokenizer) -> None:
    async def make_endpoint() -> EpisodeEndpoint:
        return EpisodeEndpoint(calculator_recipe(), EpisodeEngine(ScriptedEngine(tokenizer, SCRIPT), SAMPLING),
                               model_name="policy")  # fmt: skip

    elsewhere = asyncio.run(make_endpoint())

    async def main() -> None:
        async with Gateway() as gateway:
            with pytest.raises(GatewayError, match="another event loop"):
                gateway.open(elsewhere)

    asyncio.run(main())


def test_a_request_in_flight_when_the_episode_closes_is_answered_episode_over(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> None:
        (a,) = sessions
        asked = asyncio.ensure_future(http.post(f"{a.base_url}/chat/completions", json=chat_body(), headers=bearer(a)))
        while a.endpoint.engine.calls == 0:  # the request is in the engine (sleeping)
            await asyncio.sleep(0.01)
        gateway.close(a)
        await a.endpoint.close()
        answered = await asyncio.wait_for(asked, timeout=2)
        assert (answered.status_code, error_code(answered)) == (503, "episode_over")

    on_gateway(tokenizer, scenario, sessions=1, delay_s=5.0)
