"""Every error case against a real server, through the openai client where it can send the request and through
httpx where it cannot (malformed bodies): OpenAI-shaped bodies, the right status, the field named, and a server
that goes on serving after an engine or environment failure."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from agent_env import (
    Environment,
    EpisodeRecord,
    MatchingReward,
    RewardPipeline,
    StepRecord,
    StepResult,
    StepReward,
    ToolCallReward,
)
from agent_protocol import Action, HFTokenizer
from agent_runtime import EngineError, ScriptedEngine, read_trajectories
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy
from tests.support.calculator_recipe import calculator_recipe

USER = [{"role": "user", "content": "What is 2 * 21?"}]


@pytest.fixture(scope="module")
def server(start_server: ServerFactory) -> LiveServer:
    return start_server()


def post(server: LiveServer, body: bytes | dict[str, Any], **headers: str) -> httpx.Response:
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(f"{server.url}/v1/chat/completions", headers=headers, timeout=30, **kwargs)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


def test_malformed_json_is_a_400(server: LiveServer) -> None:
    response = post(server, b'{"model": "calculator-agent", "messages": [')
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json"
    assert "not valid JSON" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": "hello"}, "messages"),
        ({"model": MODEL, "messages": USER, "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "messages": USER, "temperature": 7}, "temperature"),
        ({"model": MODEL, "messages": USER, "max_tokens": 0}, "max_tokens"),
        (
            {"model": MODEL, "messages": USER, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
        ({"messages": USER}, "model"),
        ({"model": MODEL, "messages": [*USER, {"role": "user", "content": 5}]}, "messages[1].content"),
        ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": USER, "tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": USER, "n": 2}, "n"),
    ],
)
def test_a_wrong_field_is_a_400_naming_it(server: LiveServer, body: dict[str, Any], param: str) -> None:
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert param in error["message"]


def test_the_openai_client_sees_a_bad_request(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": 3}],  # type: ignore[list-item]
        )
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "messages[1].content"


def test_an_unknown_model_is_a_404(server: LiveServer) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        server.client().chat.completions.create(model="gpt-7", messages=USER)  # type: ignore[arg-type]
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        server.client().models.retrieve("gpt-7")


def test_an_unknown_route_is_an_openai_shaped_404(server: LiveServer) -> None:
    response = httpx.get(f"{server.url}/v1/nothing-here")
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"
    assert httpx.get(f"{server.url}/v1/chat/completions").status_code == 405


def test_a_missing_or_wrong_key_is_a_401(start_server: ServerFactory) -> None:
    server = start_server(api_key="sesame")
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").chat.completions.create(model=MODEL, messages=USER)
    response = post(server, {"model": MODEL, "messages": USER})
    assert response.status_code == 401 and error_of(response)["code"] == "invalid_api_key"
    assert "missing" in error_of(response)["message"]
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # liveness stays open
    answer = server.client(api_key="sesame").chat.completions.create(model=MODEL, messages=USER)
    assert answer.choices[0].message.content == "The answer is 42."
    assert server.metrics(api_key="sesame")["client_errors"] >= 2


def test_overload_is_a_429_at_once_never_a_hang(start_server: ServerFactory, tokenizer: HFTokenizer) -> None:
    slow = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), delay_s=0.4)
    server = start_server(engine=slow, max_concurrency=1)
    results: list[str] = []

    def occupy() -> None:
        completion = server.client().chat.completions.create(model=MODEL, messages=USER)
        results.append(completion.choices[0].message.content or "")

    worker = threading.Thread(target=occupy)
    worker.start()
    deadline = time.monotonic() + 10
    while server.metrics()["in_flight"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)

    with pytest.raises(openai.RateLimitError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=USER)
    assert caught.value.response.headers["retry-after"] == "1"
    assert results == []  # refused while the first request was still running: nothing waited for it
    response = post(server, {"model": MODEL, "messages": USER, "stream": True})
    assert response.status_code == 429 and error_of(response)["code"] == "server_overloaded"
    worker.join(timeout=30)
    assert results == ["The answer is 42."]
    metrics = server.metrics()
    assert metrics["rejected_overloaded"] == 2 and metrics["in_flight"] == 0
    # the slot is free again
    assert server.client().chat.completions.create(model=MODEL, messages=USER).choices[0].message.content


def test_an_engine_failure_mid_episode_fails_that_request_only(start_server: ServerFactory, tmp_path: Any) -> None:
    server = start_server(trajectory_log=str(tmp_path / "log.jsonl"))
    client = server.client()
    boom = [{"role": "user", "content": "What is 6 * 7? Then explode."}]
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model=MODEL, messages=boom)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "engine_error"
    assert "failed on purpose" in caught.value.body["message"]

    with pytest.raises(openai.APIError) as streamed:
        for _ in client.chat.completions.create(model=MODEL, messages=boom, stream=True):
            pass
    assert "failed on purpose" in streamed.value.message

    with pytest.raises(openai.InternalServerError):  # tools mode: the engine fails on the follow-up turn
        client.chat.completions.create(
            model=MODEL,
            tools=[CALCULATOR_TOOL],
            messages=[
                *boom,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
        )  # fmt: skip

    answer = client.chat.completions.create(model=MODEL, messages=USER)
    assert answer.choices[0].message.content == "The answer is 42."
    metrics = server.metrics()
    assert metrics["server_errors"] == 3 and metrics["in_flight"] == 0
    records = list(read_trajectories(tmp_path / "log.jsonl"))
    assert len(records) == 4  # the failed episodes are recorded, with what they did before failing
    assert [r.stop_reason for r in records[:2]] == ["engine_error", "engine_error"]
    assert records[0].tool_calls == 1 and records[0].errors[-1].code == "engine_error"


def test_a_client_leaving_mid_stream_frees_its_slot_and_is_recorded(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Any
) -> None:
    slow = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), delay_s=0.3)
    server = start_server(engine=slow, max_concurrency=1, trajectory_log=str(tmp_path / "log.jsonl"))
    body = {"model": MODEL, "messages": USER, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk; then hang up mid-episode
    deadline = time.monotonic() + 10
    while server.metrics()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.metrics()["in_flight"] == 0
    (record,) = read_trajectories(tmp_path / "log.jsonl")
    assert record.errors[-1].code == "client_disconnected"
    answer = server.client().chat.completions.create(model=MODEL, messages=USER)  # the slot is free again
    assert answer.choices[0].message.content == "The answer is 42."


class BrokenEnvironment(Environment):
    """An environment whose step crashes (a bug in a tool environment)."""

    async def transition(self, action: Action) -> StepResult:
        raise RuntimeError("the environment broke")


def test_an_environment_failure_is_a_500_and_the_server_goes_on(
    start_server: ServerFactory, tokenizer: HFTokenizer
) -> None:
    recipe = dataclasses.replace(calculator_recipe(), environment=lambda: BrokenEnvironment())
    server = start_server(recipe=recipe)
    with pytest.raises(openai.InternalServerError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=USER)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "environment_error"
    assert "the environment broke" in caught.value.body["message"]
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 200


class RaisingProcessRewards(RewardPipeline):
    """A reward pipeline that raises itself mid-episode (its strategies' failures it contains, as codes)."""

    async def score_step(self, step: StepRecord, episode: EpisodeRecord) -> StepReward:
        raise ZeroDivisionError("process reward divided by zero")


def test_a_process_reward_failure_is_a_500_not_an_answer_cut_short(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Any
) -> None:
    """The episode ends `reward_error` after its first tool call, with no answer: the client is told (a 500 naming
    the code and the error), not answered 200 with an empty `length`-cut message; the record keeps the turn."""
    rewards = RaisingProcessRewards(result=[MatchingReward()], process=[ToolCallReward()])
    server = start_server(recipe=calculator_recipe(rewards=rewards), trajectory_log=str(tmp_path / "log.jsonl"))
    with pytest.raises(openai.InternalServerError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=USER)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "reward_error"
    assert "process reward divided by zero" in caught.value.body["message"]
    (record,) = read_trajectories(tmp_path / "log.jsonl")
    assert record.stop_reason == "reward_error" and record.tool_calls == 1
    answer = server.client().chat.completions.create(model=MODEL, messages=USER, tools=[CALCULATOR_TOOL])
    assert answer.choices[0].message.tool_calls, "tools mode runs no reward: it goes on"


def test_a_conversation_too_long_for_the_context_is_a_400(start_server: ServerFactory, tokenizer: HFTokenizer) -> None:
    small = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), context_length=300)
    server = start_server(engine=small)
    long = [{"role": "user", "content": "What is 1 + 1? " + "please " * 400}]
    for tools in (None, [CALCULATOR_TOOL]):
        with pytest.raises(openai.BadRequestError) as caught:
            if tools is None:
                server.client().chat.completions.create(model=MODEL, messages=long)
            else:
                server.client().chat.completions.create(model=MODEL, messages=long, tools=tools)
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "context_length_exceeded"


def test_engine_errors_raised_directly_are_reported(start_server: ServerFactory, tokenizer: HFTokenizer) -> None:
    dead = ScriptedEngine(tokenizer, [EngineError("connection refused")])
    server = start_server(engine=dead)
    with pytest.raises(openai.InternalServerError) as caught:
        server.client().chat.completions.create(model=MODEL, messages=USER, tools=[CALCULATOR_TOOL])
    assert isinstance(caught.value.body, dict) and "connection refused" in caught.value.body["message"]
