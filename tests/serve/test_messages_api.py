"""Anthropic's Messages API (``POST /v1/messages``) through the official `anthropic.AsyncAnthropic` client against
the real app on uvicorn, on a `ScriptedEngine` replaying real Qwen3 ids: the same conversation through content
blocks and through chat completions gives the same token ids, turn for turn (the follow-up continues the stored
ids); a stream is what the anthropic client's stream assembles into the same message; the key comes as
``x-api-key``; malformed blocks, server tools and stop sequences are 400s in Anthropic's error shape that name the
field; an engine failure is a 500 (an ``error`` event mid-stream), recorded, and the server goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine, read_trajectories
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy

QUESTION = "What is 17 * 23?"
FUNCTION = CALCULATOR_TOOL["function"]
TOOL: Any = {"name": FUNCTION["name"], "description": FUNCTION["description"], "input_schema": FUNCTION["parameters"]}


def client(server: LiveServer, api_key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=30)


async def create(api: anthropic.AsyncAnthropic, streamed: bool, **kwargs: Any) -> Any:
    kwargs.setdefault("max_tokens", 256)
    if not streamed:
        return await api.messages.create(model=MODEL, **kwargs)
    async with api.messages.stream(model=MODEL, **kwargs) as stream:
        kinds = [event.type async for event in stream]
        message = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == len(message.content)
    return message


async def messages_conversation(server: LiveServer, streamed: bool) -> list[Any]:
    """The calculator conversation as a Messages client drives it: the content blocks echoed back
    (``model_dump``, as the SDK's users do), the tool's result as a ``tool_result`` block."""
    api = client(server)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = await create(api, streamed, messages=messages, tools=[TOOL])
    assert first.stop_reason == "tool_use" and first.role == "assistant"
    assert [block.type for block in first.content] == ["thinking", "tool_use"]
    use = first.content[1]
    assert use.name == "calculator" and use.input == {"expression": "17 * 23"}
    messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "391"}]})
    second = await create(api, streamed, messages=messages, tools=[TOOL])
    assert second.stop_reason == "end_turn"
    assert [block.type for block in second.content] == ["thinking", "text"]
    assert second.content[0].thinking == "The tool answered." and second.content[1].text == "The answer is 391."
    assert second.usage.input_tokens > first.usage.input_tokens > 0 and second.usage.output_tokens > 0
    return [first, second]


def chat_conversation(server: LiveServer) -> None:
    api = server.client()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = api.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    messages.append(first.choices[0].message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "391"})
    api.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_a_tool_use_turn_and_its_follow_up_give_the_ids_of_chat_completions(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path, streamed: bool
) -> None:
    by_messages = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
    by_chat = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
    server = start_server(engine=by_messages, trajectory_log=str(tmp_path / "messages.jsonl"))
    chat_server = start_server(engine=by_chat, trajectory_log=str(tmp_path / "chat.jsonl"))

    _, second = asyncio.run(messages_conversation(server, streamed))
    chat_conversation(chat_server)

    assert by_messages.calls == by_chat.calls and len(by_chat.calls) == 2  # every prompt, id for id
    assert by_messages.calls[1][: len(by_messages.calls[0])] == by_messages.calls[0]
    assert second.usage.input_tokens == len(by_messages.calls[1])
    metrics = server.metrics()
    assert metrics["transcript_prefix_hits"] == 1 and metrics["transcript_rerenders"] == 0
    records = list(read_trajectories(tmp_path / "messages.jsonl"))
    chat_records = list(read_trajectories(tmp_path / "chat.jsonl"))
    assert [r.task["prepared"] for r in records] == ["new", "prefix_hit"]
    assert records[0].episode_id == records[1].episode_id  # one conversation across the two requests
    (segment,), (chat_segment,) = records[1].segments, chat_records[1].segments
    assert segment.ids == chat_segment.ids and segment.loss_mask == chat_segment.loss_mask
    assert segment.logprobs == chat_segment.logprobs and len(segment.action_ranges) == 2
    assert records[1].final_answer == "The answer is 391."


def test_the_system_prompt_a_length_stop_and_the_key_as_x_api_key(start_server: ServerFactory) -> None:
    server = start_server(api_key="sk-messages")

    async def main() -> tuple[Any, Any, anthropic.AuthenticationError]:
        api = client(server, api_key="sk-messages")  # the anthropic client sends x-api-key
        cut = await api.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": QUESTION}],
                                        tools=[TOOL])  # fmt: skip
        plain = await api.messages.create(
            model=MODEL, max_tokens=64, system=[{"type": "text", "text": "Be brief."}],
            messages=[{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
        )  # fmt: skip
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await client(server, api_key="wrong").messages.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        return cut, plain, refused.value

    cut, plain, refused = asyncio.run(main())
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert plain.stop_reason == "end_turn" and plain.content[-1].text == "I can only help with arithmetic."
    assert isinstance(refused.body, dict) and refused.body["error"]["type"] == "authentication_error"
    metrics = server.metrics(api_key="sk-messages")
    assert metrics["requests_tools"] == 2 and metrics["requests_agent"] == 0  # one turn each, never an episode


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
            "got 'document'",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": QUESTION},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "1"}]},
                ]
            },
            "messages[1].content[0].tool_use_id",
            "no earlier `tool_use` block has that id",
        ),
        (
            {"messages": [{"role": "system", "content": "You are terse."}]},
            "messages[0].role",
            "the system prompt is `system`",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": QUESTION},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "c", "input": "{}"}]},
                ]
            },
            "messages[1].content[0].input",
            "must be an object",
        ),
        (
            {"messages": [{"role": "user", "content": QUESTION}], "tools": [{"type": "bash_20250124", "name": "b"}]},
            "tools[0].type",
            "is a server tool",
        ),
        (
            {"messages": [{"role": "user", "content": QUESTION}], "stop_sequences": ["\n\nHuman:"]},
            "stop_sequences",
            "stop sequences are not supported",
        ),
        ({"messages": 3}, "messages", "Expected `array`"),
        ({"max_tokens": 0, "messages": []}, "max_tokens", "Expected `int` >= 1"),
    ],
    ids=["document", "result-without-use", "system-role", "input-string", "server-tool", "stop", "number", "zero"],
)
def test_malformed_requests_are_400s_in_anthropics_shape_naming_the_field(
    refusing: LiveServer, body: dict[str, Any], param: str, says: str
) -> None:
    server = refusing
    before = server.metrics()
    sent = {"model": MODEL, "max_tokens": 16, **body}
    response = httpx.post(f"{server.url}/v1/messages", json=sent, headers={"x-api-key": "unused"}, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    assert says in error["error"]["message"], error
    assert error["error"]["param"] == param, error
    after = server.metrics()
    assert after["client_errors"] == before["client_errors"] + 1
    assert after["requests_tools"] == after["completed"] == 0  # refused before a slot: no turn, no record


@pytest.fixture(scope="module")
def refusing(start_server: ServerFactory) -> LiveServer:
    return start_server()


def test_an_engine_failure_is_a_500_and_an_error_event_and_is_recorded(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    """The engine fails on the follow-up turn: a 500 ``engine_error`` (an ``error`` event mid-stream, which the
    anthropic client raises), recorded on the trajectory as the chat route records it; the server goes on."""
    server = start_server(trajectory_log=str(tmp_path / "log.jsonl"))
    messages: Any = [
        {"role": "user", "content": "What is 6 * 7? Then explode."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "calculator", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]},
    ]

    async def main() -> tuple[anthropic.InternalServerError, anthropic.APIError, Any]:
        api = client(server)
        with pytest.raises(anthropic.InternalServerError) as failed:
            await api.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[TOOL])
        with pytest.raises(anthropic.APIError) as streamed:
            async with api.messages.stream(model=MODEL, max_tokens=64, messages=messages, tools=[TOOL]) as stream:
                async for _ in stream:
                    pass
        answer = await api.messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": QUESTION}], tools=[TOOL]
        )
        return failed.value, streamed.value, answer

    failed, streamed, answer = asyncio.run(main())
    assert isinstance(failed.body, dict) and failed.body["error"]["code"] == "engine_error"
    assert failed.body["error"]["type"] == "api_error"
    assert "failed on purpose" in failed.body["error"]["message"] and "failed on purpose" in str(streamed)
    assert answer.content[-1].type == "tool_use"  # the server goes on serving
    metrics = server.metrics()
    assert metrics["server_errors"] == 2 and metrics["in_flight"] == 0
    records = list(read_trajectories(tmp_path / "log.jsonl"))
    assert [r.stop_reason for r in records] == ["engine_error", "engine_error", "tool_calls"]
