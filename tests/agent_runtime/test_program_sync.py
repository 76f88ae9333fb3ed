"""Synchronous function programs (`AgentProgram.sync`): a plain ``def`` taking an `openai.OpenAI`, run on the
episode's own thread with a synchronous client bound to its endpoint. The loop of
``examples/any_agent/subprocess_agent.py`` (sync client) run this way gives the async in-process program's record,
id for id; a sync program that blocks past its budget is ``program_timeout`` without stalling its neighbour; one
that raises is ``program_error``; a non-callable is refused when the program is defined."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ProgramSync, ScriptedEngine
from agent_runtime.agent_program import AgentProgram, ProgramTask
from agent_runtime.proxy import run_program
from examples.any_agent import agent as in_process
from examples.any_agent import subprocess_agent
from tests.agent_runtime.test_proxy_gateway import SAMPLING, SCRIPT, calculator_recipe
from tests.agent_runtime.test_session import QUESTION


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def sync_loop(client: Any, task: ProgramTask) -> str | None:
    return subprocess_agent.calculator_agent(client, task.model, task.messages)


def episodes(tokenizer: HFTokenizer, *programs: AgentProgram) -> list[tuple[Any, ScriptedEngine]]:
    async def one(program: AgentProgram) -> tuple[Any, ScriptedEngine]:
        engine = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.25)
        task = ProgramTask(prompt=QUESTION, row={"answer": "391"})
        return await run_program(calculator_recipe(program), engine, task, sampling=SAMPLING), engine

    async def main() -> list[tuple[Any, ScriptedEngine]]:
        return list(await asyncio.gather(*(one(p) for p in programs)))

    return asyncio.run(main())


def test_a_sync_program_gives_the_async_programs_record(tokenizer: HFTokenizer) -> None:
    [(direct, direct_engine)] = episodes(tokenizer, AgentProgram(in_process.calculator_agent, timeout_s=60))
    [(served, served_engine)] = episodes(tokenizer, AgentProgram.sync(sync_loop, timeout_s=60))
    assert direct.outcome.code is None and served.outcome.code is None, (direct.outcome, served.outcome)
    assert served.outcome.requests == direct.outcome.requests == 2
    want, got = direct.trajectory, served.trajectory
    assert served_engine.calls == direct_engine.calls  # the same prompt ids at every turn
    assert [s.ids for s in got.segments] == [s.ids for s in want.segments] and len(got.segments) == 1
    assert [s.loss_mask for s in got.segments] == [s.loss_mask for s in want.segments]
    assert [s.logprobs for s in got.segments] == [s.logprobs for s in want.segments]
    assert got.reward == want.reward == pytest.approx(1.1)
    assert got.final_answer == want.final_answer == "The answer is 391."


def test_a_blocking_sync_program_times_out_alone_and_a_raising_one_is_a_program_error(
    tokenizer: HFTokenizer,
) -> None:
    def blocks(client: Any, task: ProgramTask) -> str:
        client.chat.completions.create(
            model=task.model, messages=task.messages, tools=[subprocess_agent.CALCULATOR_TOOL]
        )
        time.sleep(8)  # a blocking call: only this episode's thread waits
        return "late"

    def raises(client: Any, task: ProgramTask) -> str:
        raise ValueError("the sync program failed")

    started = time.perf_counter()
    results = episodes(
        tokenizer,
        AgentProgram.sync(blocks, timeout_s=2),
        AgentProgram.sync(raises, timeout_s=30),
        AgentProgram.sync(sync_loop, timeout_s=30),
    )
    took = time.perf_counter() - started
    (slow, _), (bad, _), (good, _) = results
    assert slow.outcome.code == "program_timeout" and slow.outcome.requests == 1
    assert bad.outcome.code == "program_error" and "the sync program failed" in bad.outcome.message
    assert good.outcome.code is None and good.trajectory.final_answer == "The answer is 391."
    assert took < 7, took  # nobody waited for the blocked thread's 8 s


def test_a_sync_program_must_be_callable() -> None:
    with pytest.raises(TypeError, match="must be callable"):
        ProgramSync(function="not a function")  # type: ignore[arg-type]
