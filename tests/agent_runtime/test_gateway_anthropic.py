"""A command program written against Anthropic's Messages API trains through the gateway: the `anthropic` SDK's
synchronous client, given only ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` by `AgentProgram.command`, runs
the calculator agent of ``examples/any_agent`` over ``/sessions/<id>/v1/messages``, and its episode's record is the
OpenAI-client agent's, id for id: the same prompt ids at every turn, the same loss mask, logprobs and reward. A
session's key opens only its own session on this route too."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_runtime.agent_program import AgentProgram, ProgramTask
from agent_runtime.proxy import Gateway, run_program
from examples.any_agent import agent as in_process
from tests.agent_runtime.test_proxy_gateway import SAMPLING, SCRIPT, calculator_recipe, on_gateway
from tests.agent_runtime.test_session import QUESTION

ROOT = Path(__file__).resolve().parents[2]
ANTHROPIC_AGENT = f"""
import json, os, sys
sys.path.insert(0, {str(ROOT)!r})
import anthropic
from examples.any_agent.subprocess_agent import CALCULATOR_TOOL, MAX_TURNS, calculate

function = CALCULATOR_TOOL["function"]
tool = {{"name": function["name"], "description": function["description"], "input_schema": function["parameters"]}}
task = json.loads(sys.stdin.read())
messages = [{{"role": "user", "content": task["prompt"]}}]
client = anthropic.Anthropic(max_retries=0)  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
answer = ""
for _ in range(MAX_TURNS):
    reply = client.messages.create(model=task["model"], max_tokens=64, messages=messages, tools=[tool])
    if reply.stop_reason != "tool_use":
        answer = "".join(block.text for block in reply.content if block.type == "text")
        break
    messages.append({{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}})
    results = [
        {{"type": "tool_result", "tool_use_id": b.id, "content": calculate(json.dumps(b.input))}}
        for b in reply.content
        if b.type == "tool_use"
    ]
    messages.append({{"role": "user", "content": results}})
print(answer)
"""


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def episode(tokenizer: HFTokenizer, program: AgentProgram) -> tuple[Any, ScriptedEngine]:
    async def main() -> tuple[Any, ScriptedEngine]:
        engine = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.25)
        task = ProgramTask(prompt=QUESTION, row={"answer": "391"})
        return await run_program(calculator_recipe(program), engine, task, sampling=SAMPLING), engine

    return asyncio.run(main())


def test_an_anthropic_sdk_program_gives_the_openai_programs_record(tokenizer: HFTokenizer, tmp_path: Path) -> None:
    script = tmp_path / "anthropic_agent.py"
    script.write_text(ANTHROPIC_AGENT)
    direct, direct_engine = episode(tokenizer, AgentProgram(in_process.calculator_agent, timeout_s=60))
    served, served_engine = episode(tokenizer, AgentProgram.command([sys.executable, str(script)], timeout_s=120))
    assert direct.outcome.code is None and served.outcome.code is None, (direct.outcome, served.outcome)
    assert served.outcome.requests == direct.outcome.requests == 2
    assert served.outcome.edits["append"] == 1 and not served.outcome.breaks  # the echo continued the ids
    want, got = direct.trajectory, served.trajectory
    assert served_engine.calls == direct_engine.calls  # the same prompt ids at every turn
    assert [s.ids for s in got.segments] == [s.ids for s in want.segments] and len(got.segments) == 1
    assert [s.loss_mask for s in got.segments] == [s.loss_mask for s in want.segments]
    assert [s.logprobs for s in got.segments] == [s.logprobs for s in want.segments]
    assert got.reward == want.reward == pytest.approx(1.1)  # matching 1 + a good tool call
    assert got.final_answer == want.final_answer == "The answer is 391."


def test_a_session_key_opens_only_its_own_session_on_the_messages_route(tokenizer: HFTokenizer) -> None:
    body = {"model": "policy", "max_tokens": 16, "messages": [{"role": "user", "content": QUESTION}]}

    async def scenario(gateway: Gateway, sessions: list[Any], http: httpx.AsyncClient) -> list[int]:
        mine, other = sessions
        url = f"{mine.base_url}/messages"
        codes = []
        for headers in ({"x-api-key": other.key}, {}, {"x-api-key": mine.key}):
            codes.append((await http.post(url, json=body, headers=headers)).status_code)
        return codes

    assert on_gateway(tokenizer, scenario) == [401, 401, 200]
