"""Agent mode through the official openai client against a real server: the whole episode runs server-side with
the recipe's real calculator tool; the answer, usage, live agent events and the trajectory log are checked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import pytest

from agent_env import CalculatorTool
from agent_protocol import HFTokenizer, get_protocol
from agent_runtime import CompactionPolicy, read_trajectories
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.support.calculator_recipe import calculator_recipe


@pytest.fixture(scope="module")
def server(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    log = tmp_path_factory.mktemp("agent") / "trajectories.jsonl"
    return start_server(trajectory_log=str(log))


def trajectory_log(server: LiveServer) -> Path:
    assert server.trajectory_log is not None
    return server.trajectory_log


def test_non_streaming_answer_with_usage(server: LiveServer, tokenizer: HFTokenizer) -> None:
    before = len(list(read_trajectories(trajectory_log(server)))) if trajectory_log(server).exists() else 0
    completion = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 17 * 23?"}]
    )

    (choice,) = completion.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == "The answer is 391."
    assert choice.finish_reason == "stop"
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    extra = completion.model_extra or {}
    assert extra["agent"]["tool_calls"] == 1 and extra["agent"]["turns"] == 2
    assert extra["agent"]["stop_reason"] == "final_answer"

    records = list(read_trajectories(trajectory_log(server)))
    assert len(records) == before + 1
    record = records[-1]
    assert record.episode_id == extra["agent"]["episode_id"]
    # usage counts the episode's tokens exactly: generated ids (loss mask 1) and rendered ones
    (segment,) = record.segments
    assert completion.usage is not None
    assert completion.usage.completion_tokens == sum(segment.loss_mask)
    assert completion.usage.prompt_tokens == len(segment.ids) - sum(segment.loss_mask)
    assert completion.usage.total_tokens == len(segment.ids)
    # the real tool ran and the token stream is the official render of the conversation (token-in-token-out)
    assert [m.content for m in record.messages if m.role == "tool"] == ["391"]
    rendered = get_protocol("qwen3").render_messages(record.messages, tools=[CalculatorTool().spec])
    assert tokenizer.decode(segment.ids) == rendered.removesuffix("\n")


def test_streaming_delivers_agent_events_then_the_answer(server: LiveServer) -> None:
    stream = server.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 12 + 30?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    events: list[dict[str, object]] = []
    content = ""
    finish = None
    usage = None
    order: list[str] = []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        event = (chunk.model_extra or {}).get("agent_event")
        if event is not None:
            events.append(event)
            order.append(f"event:{event['type']}")
        for choice in chunk.choices:
            if choice.delta.content:
                content += choice.delta.content
                order.append("content")
            if choice.finish_reason:
                finish = choice.finish_reason
        if chunk.usage is not None:
            usage = chunk.usage

    assert content == "The answer is 42."
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0
    kinds = [e["type"] for e in events]
    assert kinds == ["assistant", "tool_call", "tool_result", "assistant", "final"]
    call = events[1]["call"]
    assert isinstance(call, dict)
    assert call["name"] == "calculator" and call["arguments"] == {"expression": "12 + 30"}
    assert events[2]["content"] == "42" and events[2]["ok"] is True
    assert events[2]["tool_call_id"] == call["id"]
    # the tool call and its result arrive before any answer text
    assert order.index("event:tool_result") < order.index("content")


def test_sse_framing_is_openai_s(server: LiveServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 * 3?"}], "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    frames = text.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    payloads = [json.loads(f.removeprefix("data: ")) for f in frames[:-2]]
    assert all(f.startswith("data: ") for f in frames[:-1])
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len({p["id"] for p in payloads}) == 1


def test_streaming_shows_a_compaction_as_it_happens(start_server: ServerFactory) -> None:
    compaction = CompactionPolicy(compact_at_tokens=250, max_compactions=1)
    recipe = dataclasses.replace(calculator_recipe(max_new_tokens=64), context=compaction)
    server = start_server(recipe=recipe)
    stream = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 9 * 9?"}], stream=True
    )
    events = []
    content = ""
    for chunk in stream:
        if (event := (chunk.model_extra or {}).get("agent_event")) is not None:
            events.append(event)
        content += "".join(c.delta.content or "" for c in chunk.choices)
    kinds = [e["type"] for e in events]
    assert kinds == ["assistant", "tool_call", "tool_result", "compaction", "assistant", "final"]
    assert "the calculator gave 81" in events[3]["summary"]
    assert content == "The answer is 81."
    assert server.metrics()["compactions"] == 1


def test_a_plain_question_needs_no_tool(server: LiveServer) -> None:
    completion = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}]
    )
    assert completion.choices[0].message.content == "I can only help with arithmetic."
    assert (completion.model_extra or {})["agent"]["tool_calls"] == 0


def test_models_health_and_metrics(server: LiveServer) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert server.client().models.retrieve(MODEL).id == MODEL
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL
    assert health["tools"] == ["calculator"] and health["engine"] == "scripted"
    metrics = server.metrics()
    assert metrics["requests_agent"] >= 1 and metrics["in_flight"] == 0


def test_the_web_page_and_its_script_are_served(server: LiveServer) -> None:
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/static/chat.js">' in page.text
    script = httpx.get(f"{server.url}/static/chat.js")
    assert script.status_code == 200 and "agent_event" in script.text


def _streamed(server: LiveServer, question: str) -> tuple[str, str | None, object, dict[str, int]]:
    """The streamed answer: its content, finish reason and usage, and the agent events' kinds counted."""
    stream = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    content, finish, usage, kinds = "", None, None, {}
    for chunk in stream:
        if (event := (chunk.model_extra or {}).get("agent_event")) is not None:
            kinds[event["type"]] = kinds.get(event["type"], 0) + 1
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    return content, finish, usage, kinds


@pytest.mark.parametrize(
    ("max_new_tokens", "compaction", "question"),
    [
        (256, None, "What is 17 * 23?"),  # a tool call, then the answer
        (256, None, "Hello there"),  # no tool
        (64, CompactionPolicy(compact_at_tokens=250, max_compactions=1), "What is 9 * 9?"),  # a compaction between
        (12, None, "What is 17 * 23?"),  # the turn runs out of tokens: finish_reason "length"
    ],
)
def test_a_plain_answer_is_the_streamed_one(
    start_server: ServerFactory, max_new_tokens: int, compaction: CompactionPolicy | None, question: str
) -> None:
    """A plain (not streamed) answer builds no step events (`events(steps=False)`): it reads the last turn from
    the session's record. It must say what the streamed answer says, and count the same tool calls and
    compactions."""
    recipe = calculator_recipe(max_new_tokens=max_new_tokens)
    if compaction is not None:
        recipe = dataclasses.replace(recipe, context=compaction)
    server = start_server(recipe=recipe)
    before = server.metrics()
    completion = server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}])
    plain = server.metrics()
    content, finish, usage, kinds = _streamed(server, question)
    streamed = server.metrics()

    (choice,) = completion.choices
    assert choice.message.content == content
    assert choice.finish_reason == finish
    assert completion.usage == usage
    agent = (completion.model_extra or {})["agent"]
    assert agent["tool_calls"] == kinds.get("tool_call", 0)
    assert agent["compactions"] == kinds.get("compaction", 0)
    for counter in ("tool_calls", "compactions"):
        assert plain[counter] - before[counter] == streamed[counter] - plain[counter], counter
    if max_new_tokens == 12:
        assert finish == "length"  # the case this parameter is here for
    if compaction is not None:
        assert agent["compactions"] == 1
