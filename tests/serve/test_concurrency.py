"""50 conversations at once against one server and one engine: agent mode (plain and streamed) and tools mode
(two requests each). None is lost, none gets another's answer, and the trajectory log holds each exactly once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine, read_trajectories
from tests.serve.conftest import MODEL, ServerFactory, calculator_question
from tests.support.calculator_policy import CALCULATOR_TOOL, calculator_policy

CONVERSATIONS = 50


async def agent_plain(client: AsyncOpenAI, question: str) -> str:
    completion = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}])
    return completion.choices[0].message.content or ""


async def agent_streamed(client: AsyncOpenAI, question: str) -> str:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], stream=True
    )
    text, tool_results = "", []
    async for chunk in stream:
        event = (chunk.model_extra or {}).get("agent_event")
        if event is not None and event["type"] == "tool_result":
            tool_results.append(event["content"])
        text += "".join(c.delta.content or "" for c in chunk.choices)
    assert len(tool_results) == 1 and text.endswith(f"{tool_results[0]}.")  # its own tool result, not another's
    return text


async def tools_mode(client: AsyncOpenAI, question: str) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    a, op, b = json.loads(call.function.arguments)["expression"].split()
    assert op == "*"
    messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": str(int(a) * int(b))}]
    second = await client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL])
    return second.choices[0].message.content or ""


def test_fifty_concurrent_conversations(start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path) -> None:
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), delay_s=0.02)
    log = tmp_path / "log.jsonl"
    server = start_server(engine=engine, trajectory_log=str(log), max_concurrency=CONVERSATIONS)
    kinds = [agent_plain, agent_streamed, tools_mode]

    async def main() -> list[str]:
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
            jobs = [kinds[i % 3](client, calculator_question(i)[0]) for i in range(CONVERSATIONS)]
            return await asyncio.gather(*jobs)

    answers = asyncio.run(main())

    assert answers == [calculator_question(i)[1] for i in range(CONVERSATIONS)]
    metrics = server.metrics()
    assert metrics["peak_in_flight"] > 1  # they really overlapped
    assert metrics["in_flight"] == 0 and metrics["server_errors"] == 0 and metrics["client_errors"] == 0
    tools_conversations = sum(1 for i in range(CONVERSATIONS) if i % 3 == 2)
    assert metrics["transcript_prefix_hits"] == tools_conversations
    assert metrics["transcript_rerenders"] == 0

    records = list(read_trajectories(log))
    assert len(records) == CONVERSATIONS + tools_conversations  # one per request
    finals = [r for r in records if r.final_answer is not None]
    assert len(finals) == CONVERSATIONS
    for record in finals:  # each record holds its own question and the answer to it
        question = next(m.content for m in record.messages if m.role == "user")
        i = next(i for i in range(CONVERSATIONS) if calculator_question(i)[0] == question)
        assert record.final_answer == calculator_question(i)[1]
