"""The Responses API (``POST /v1/responses``) through the official `openai.AsyncOpenAI` client against the real
app on uvicorn, on a `ScriptedEngine` replaying real Qwen3 ids: the same conversation through Responses items and
through chat completions gives the same token ids, turn for turn (the follow-up continues the stored ids); a
stream is what the openai client's Responses stream parser assembles into the same response; malformed items,
server-side state and unsupported tools are 400s that name the field."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine, read_trajectories
from tests.serve.conftest import MODEL, LiveServer, ServerFactory
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy

QUESTION = "What is 17 * 23?"
FUNCTION = CALCULATOR_TOOL["function"]
RESPONSES_TOOL: Any = {"type": "function", **FUNCTION, "strict": False}
CHAT_TOOL: Any = {"type": "function", "function": {**FUNCTION, "strict": False}}


def async_client(server: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


async def create(client: openai.AsyncOpenAI, streamed: bool, **kwargs: Any) -> Any:
    if not streamed:
        return await client.responses.create(**kwargs)
    async with client.responses.stream(**kwargs) as stream:
        kinds = [event.type async for event in stream]
        response = await stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == len(response.output)
    return response


async def responses_conversation(server: LiveServer, streamed: bool) -> list[Any]:
    """The calculator conversation as the Agents SDK drives it: the input items, the output items echoed back
    (``model_dump``, as the SDK sends them), the function's output."""
    client = async_client(server)
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    first = await create(client, streamed, model=MODEL, input=items, tools=[RESPONSES_TOOL])
    assert first.status == "completed"
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    call = first.output[1]
    assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "17 * 23"}
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "391"})
    second = await create(client, streamed, model=MODEL, input=items, tools=[RESPONSES_TOOL])
    assert second.status == "completed" and second.output_text == "The answer is 391."
    assert [item.type for item in second.output] == ["reasoning", "message"]
    assert second.output[0].content[0].text == "The tool answered."
    assert second.usage is not None and second.usage.total_tokens == (
        second.usage.input_tokens + second.usage.output_tokens
    )
    return [first, second]


def chat_conversation(server: LiveServer) -> None:
    client = server.client()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    messages.append(first.choices[0].message)
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "391"})
    client.chat.completions.create(model=MODEL, messages=messages, tools=[CHAT_TOOL])


@pytest.mark.parametrize("streamed", [False, True], ids=["create", "stream"])
def test_a_tool_call_turn_and_its_follow_up_give_the_ids_of_chat_completions(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path, streamed: bool
) -> None:
    by_responses = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
    by_chat = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
    server = start_server(engine=by_responses, trajectory_log=str(tmp_path / "responses.jsonl"))
    chat_server = start_server(engine=by_chat, trajectory_log=str(tmp_path / "chat.jsonl"))

    _, second = asyncio.run(responses_conversation(server, streamed))
    chat_conversation(chat_server)

    assert by_responses.calls == by_chat.calls and len(by_chat.calls) == 2  # every prompt, id for id
    assert by_responses.calls[1][: len(by_responses.calls[0])] == by_responses.calls[0]
    assert second.usage.input_tokens == len(by_responses.calls[1])
    metrics = server.metrics()
    assert metrics["transcript_prefix_hits"] == 1 and metrics["transcript_rerenders"] == 0
    records = list(read_trajectories(tmp_path / "responses.jsonl"))
    chat_records = list(read_trajectories(tmp_path / "chat.jsonl"))
    assert [r.task["prepared"] for r in records] == ["new", "prefix_hit"]
    assert records[0].episode_id == records[1].episode_id  # one conversation across the two requests
    (segment,), (chat_segment,) = records[1].segments, chat_records[1].segments
    assert segment.ids == chat_segment.ids and segment.loss_mask == chat_segment.loss_mask
    assert segment.action_ranges == chat_segment.action_ranges and len(segment.action_ranges) == 2
    assert records[1].final_answer == "The answer is 391."


def test_a_length_stop_is_an_incomplete_response_and_no_tools_is_one_turn(start_server: ServerFactory) -> None:
    server = start_server()

    async def main() -> tuple[Any, Any]:
        client = async_client(server)
        cut = await client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=3, tools=[RESPONSES_TOOL])
        plain = await client.responses.create(model=MODEL, input="Hello there", instructions="Be brief.")
        return cut, plain

    cut, plain = asyncio.run(main())
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3
    assert plain.status == "completed" and plain.output_text == "I can only help with arithmetic."
    metrics = server.metrics()
    assert metrics["requests_tools"] == 2 and metrics["requests_agent"] == 0  # one turn each, never an episode


@pytest.mark.parametrize(
    ("body", "param", "code", "says"),
    [
        (
            {"input": [{"role": "user", "content": QUESTION}, {"type": "web_search_call", "id": "ws_1"}]},
            "input[1].type",
            "invalid_value",
            "got 'web_search_call'",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": QUESTION},
                    {"type": "function_call_output", "call_id": "call_9", "output": "391"},
                ]
            },
            "input[1].call_id",
            "invalid_value",
            "no earlier `function_call` item has that call_id",
        ),
        (
            {"input": [{"role": "tool", "content": "391"}]},
            "input[0].role",
            "invalid_value",
            "got 'tool'",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "calculator", "arguments": {"x": 1}}]},
            "input[0].arguments",
            "invalid_value",
            "must be a string",
        ),
        (
            {"input": QUESTION, "previous_response_id": "resp_123"},
            "previous_response_id",
            "previous_response_unsupported",
            "keeps no responses",
        ),
        (
            {"input": QUESTION, "tools": [{"type": "web_search"}]},
            "tools[0].type",
            "unsupported_value",
            "function tools only",
        ),
        ({"input": 3}, "input", "invalid_value", "Expected `str | array`"),
    ],
    ids=[
        "unknown-item",
        "output-without-call",
        "tool-role",
        "arguments-object",
        "previous-response",
        "web-search",
        "input-number",
    ],
)
def test_malformed_requests_are_400s_naming_the_field(
    refusing: LiveServer, body: dict[str, Any], param: str, code: str, says: str
) -> None:
    server = refusing
    before = server.metrics()

    async def main() -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as refused:
            await async_client(server).responses.create(model=MODEL, **body)
        return refused.value

    error = asyncio.run(main())
    assert error.status_code == 400 and isinstance(error.body, dict)
    assert error.body["param"] == param and error.body["code"] == code, error.body
    assert says in error.body["message"]
    after = server.metrics()
    assert after["client_errors"] == before["client_errors"] + 1
    assert after["requests_tools"] == after["completed"] == 0  # refused before a slot: no turn, no record


@pytest.fixture(scope="module")
def refusing(start_server: ServerFactory) -> LiveServer:
    return start_server()


def test_an_engine_failure_is_the_chat_routes_error_and_is_recorded(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    """The engine fails on the follow-up turn: a 500 ``engine_error`` (an ``error`` event mid-stream, which the
    openai client raises), recorded on the trajectory as the chat route records it; the server goes on."""
    server = start_server(trajectory_log=str(tmp_path / "log.jsonl"))
    items: Any = [
        {"role": "user", "content": "What is 6 * 7? Then explode."},
        {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]

    async def main() -> tuple[openai.InternalServerError, openai.APIError, Any]:
        client = async_client(server)
        with pytest.raises(openai.InternalServerError) as failed:
            await client.responses.create(model=MODEL, input=items, tools=[RESPONSES_TOOL])
        with pytest.raises(openai.APIError) as streamed:
            async with client.responses.stream(model=MODEL, input=items, tools=[RESPONSES_TOOL]) as stream:
                async for _ in stream:
                    pass
        answer = await client.responses.create(model=MODEL, input=QUESTION, tools=[RESPONSES_TOOL])
        return failed.value, streamed.value, answer

    failed, streamed, answer = asyncio.run(main())
    assert isinstance(failed.body, dict) and failed.body["code"] == "engine_error"
    assert "failed on purpose" in failed.body["message"] and "failed on purpose" in streamed.message
    assert answer.output[-1].type == "function_call"  # the server goes on serving
    metrics = server.metrics()
    assert metrics["server_errors"] == 2 and metrics["in_flight"] == 0
    records = list(read_trajectories(tmp_path / "log.jsonl"))
    assert [r.stop_reason for r in records] == ["engine_error", "engine_error", "tool_calls"]
    assert records[0].errors[-1].code == "engine_error"


def test_a_conversation_longer_than_the_context_is_the_chat_routes_400(refusing: LiveServer) -> None:
    async def main() -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as refused:
            await async_client(refusing).responses.create(model=MODEL, input="seven times six " * 40_000)
        return refused.value

    error = asyncio.run(main())
    assert isinstance(error.body, dict) and error.body["code"] == "context_length_exceeded", error.body


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_the_agents_sdk_default_model_runs_an_episode(
    start_server: ServerFactory, tokenizer: HFTokenizer, streamed: bool
) -> None:
    """`Agent(model=...)` with `set_default_openai_client`: the SDK's own default (`OpenAIResponsesModel`), its
    stream consumed by the SDK's own event handling, gets the model's answer after running the tool."""
    from agents import Agent, FunctionTool, Runner, set_default_openai_client, set_tracing_disabled

    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer))
    server = start_server(engine=engine)
    ran: list[str] = []

    async def calculator(_context: Any, arguments: str) -> str:
        ran.append(arguments)
        return "391"

    async def main() -> Any:
        set_tracing_disabled(True)
        set_default_openai_client(async_client(server), use_for_tracing=False)
        tool = FunctionTool(name=FUNCTION["name"], description=FUNCTION["description"],
                            params_json_schema=FUNCTION["parameters"], on_invoke_tool=calculator,
                            strict_json_schema=False)  # fmt: skip
        agent = Agent(name="calculator", model=MODEL, tools=[tool])
        if not streamed:
            return (await Runner.run(agent, QUESTION, max_turns=4)).final_output
        result = Runner.run_streamed(agent, QUESTION, max_turns=4)
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(main()) == "The answer is 391."
    assert [json.loads(a) for a in ran] == [{"expression": "17 * 23"}]
    assert len(engine.calls) == 2 and engine.calls[1][: len(engine.calls[0])] == engine.calls[0]
    assert server.metrics()["transcript_prefix_hits"] == 1
