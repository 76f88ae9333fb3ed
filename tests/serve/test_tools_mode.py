"""Tools mode through the official openai client: the server is the model endpoint and returns `tool_calls`; the
client runs the tool and sends the conversation back. A follow-up that extends a served conversation continues its
token ids exactly (only the new messages are tokenized); anything else is re-rendered. Both are counted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_protocol import HFTokenizer, get_protocol
from agent_runtime import ScriptedEngine, read_trajectories
from tests.serve.conftest import MODEL, ServerFactory
from tests.support.calculator_policy import CALCULATOR_TOOL, answer_text, calculator_policy, tool_call_text

QUESTION = "What is 17 * 23?"


def run_tool(arguments: str) -> str:
    expression = json.loads(arguments)["expression"]
    a, op, b = expression.split()
    return str({"*": int(a) * int(b), "+": int(a) + int(b), "-": int(a) - int(b)}[op])


@pytest.fixture
def engine(tokenizer: HFTokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer))


def test_tool_calls_then_a_prefix_matched_follow_up(
    start_server: ServerFactory, engine: ScriptedEngine, tokenizer: HFTokenizer, tmp_path: Any
) -> None:
    server = start_server(engine=engine, trajectory_log=str(tmp_path / "log.jsonl"))
    client = server.client()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])

    (choice,) = first.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "17 * 23"}
    assert server.metrics()["transcript_new"] == 1

    messages.append(choice.message)  # the client echoes the assistant turn as the openai client gives it
    messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function.arguments)})
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])

    assert second.choices[0].message.content == "The answer is 391."
    assert second.choices[0].finish_reason == "stop"
    assert not second.choices[0].message.tool_calls
    metrics = server.metrics()
    assert metrics["transcript_prefix_hits"] == 1 and metrics["transcript_rerenders"] == 0
    assert metrics["reused_prompt_tokens"] == len(engine.calls[0]) + len(tokenizer.encode(tool_call_text("17 * 23")))

    # Token-in-token-out: the second prompt is the first prompt, the generated ids as sampled, then the tool
    # result rendered as feedback and tokenized alone.
    generated = tokenizer.encode(tool_call_text("17 * 23"))
    feedback = get_protocol("qwen3").render_feedback([{"role": "tool", "content": "391"}])
    assert engine.calls[1] == engine.calls[0] + generated + tokenizer.encode(feedback)
    assert second.usage is not None and second.usage.prompt_tokens == len(engine.calls[1])

    records = list(read_trajectories(tmp_path / "log.jsonl"))
    assert [r.task["prepared"] for r in records] == ["new", "prefix_hit"]
    assert records[0].episode_id == records[1].episode_id  # one conversation across requests
    (segment,) = records[1].segments
    assert segment.ids[: len(engine.calls[1])] == engine.calls[1]
    assert len(segment.action_ranges) == 2 and records[1].final_answer == "The answer is 391."


def test_the_stored_ids_survive_where_re_tokenizing_would_change_them(
    start_server: ServerFactory, tokenizer: HFTokenizer
) -> None:
    # The model sampled a non-canonical tokenization of its tool call: re-tokenizing the text would give other ids.
    text = tool_call_text("17 * 23")
    cut = text.index("lator")
    sampled = tokenizer.encode(text[:cut]) + tokenizer.encode(text[cut:])
    assert sampled != tokenizer.encode(text)
    engine = ScriptedEngine(tokenizer, [sampled, answer_text("The answer is 391.")])
    client = start_server(engine=engine).client()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": "391"}]
    client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])

    start = len(engine.calls[0])
    assert engine.calls[1][start : start + len(sampled)] == sampled


@pytest.mark.parametrize("question", [QUESTION, "What is 17 times 23?"])
def test_a_rewritten_last_turn_is_rolled_back_and_anything_else_re_rendered(
    start_server: ServerFactory, engine: ScriptedEngine, tokenizer: HFTokenizer, question: str
) -> None:
    server = start_server(engine=engine)
    client = server.client()
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=[CALCULATOR_TOOL]
    )
    (call,) = first.choices[0].message.tool_calls or []
    # The client rewrote the assistant turn (another call id): with the question as it was, its stored ids are
    # rolled back to the turn's start and go on with the rewrite; with another question nothing matches.
    edited = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "my_own_id", "type": "function", "function": call.function.model_dump()}],
    }
    messages: list[Any] = [
        {"role": "user", "content": question},
        edited,
        {"role": "tool", "tool_call_id": "my_own_id", "content": "391"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])

    assert second.choices[0].message.content == "The answer is 391."
    metrics = server.metrics()
    rolled_back = question == QUESTION
    assert metrics["transcript_rollbacks"] == rolled_back and metrics["transcript_rerenders"] == (not rolled_back)
    assert metrics["transcript_prefix_hits"] == 0
    rendered = get_protocol("qwen3").render_prompt(messages, tools=[CALCULATOR_TOOL])
    assert engine.calls[1] == tokenizer.encode(rendered)


def test_streaming_tool_calls_then_a_follow_up(start_server: ServerFactory, engine: ScriptedEngine) -> None:
    server = start_server(engine=engine)
    client = server.client()
    messages: list[Any] = [{"role": "user", "content": "What is 40 + 2?"}]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL], stream=True):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += delta.id or ""
                entry["name"] += (delta.function.name or "") if delta.function else ""
                entry["arguments"] += (delta.function.arguments or "") if delta.function else ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    call = calls[0]
    assert call["name"] == "calculator" and json.loads(call["arguments"]) == {"expression": "40 + 2"}

    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call["id"], "type": "function", "function": {"name": "calculator",
                                                                                "arguments": call["arguments"]}}],
        }
    )  # fmt: skip
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_tool(call["arguments"])})
    text = ""
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL], stream=True):
        text += "".join(c.delta.content or "" for c in chunk.choices)
    assert text == "The answer is 42."
    assert server.metrics()["transcript_prefix_hits"] == 1


def test_a_full_store_evicts_the_oldest_conversation(start_server: ServerFactory, engine: ScriptedEngine) -> None:
    server = start_server(engine=engine, transcript_store_conversations=1)
    client = server.client()
    firsts = [
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}], tools=[CALCULATOR_TOOL])
        for q in ("What is 1 + 1?", "What is 2 + 2?")
    ]
    for question, first in zip(("What is 1 + 1?", "What is 2 + 2?"), firsts, strict=True):
        (call,) = first.choices[0].message.tool_calls or []
        client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "user", "content": question},
                first.choices[0].message,
                {"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function.arguments)},
            ],
            tools=[CALCULATOR_TOOL],
        )
    metrics = server.metrics()
    # the first conversation was evicted by the second; the second was evicted by the first's re-rendered turn
    assert metrics["transcript_rerenders"] == 2 and metrics["transcript_prefix_hits"] == 0
    assert metrics["transcript_store"]["evictions"] >= 2 and metrics["transcript_store"]["conversations"] == 1
