"""A finished episode is freed by reference counting, the moment nothing refers to it: no reference cycle leaves
its session (the transcript's id lists, the messages, the environment) to the cyclic garbage collector. A server
runs one episode per agent-mode request; a cycle per episode made the collector walk every finished episode's
objects, about 40 us of collection per request on the calculator agent (`bench/bench_serve.py`).

Real parts: the Qwen3 tokenizer, the scripted engine replaying real ids, the calculator tool, real rewards."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline, ToolCallReward
from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, AgentSession, SamplingParams, ScriptedEngine
from tests.support.calculator_policy import answer_text, tool_call_text


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    """Only reference counting frees anything while the test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def definition(tokenizer: HFTokenizer) -> AgentSession:
    return AgentSession(
        protocol="qwen3",
        environment=FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4),
        rewards=RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()]),
        tokenizer=tokenizer,
    )


async def episode(session: AgentSession, engine: ScriptedEngine) -> None:
    await session.reset("What is 17 * 23?", task={"answer": "391"})
    while (request := await session.next_request()) is not None:
        generation = await engine.generate(request.prompt_ids, request.sampling(SamplingParams()))
        await session.step(generation)


@pytest.mark.parametrize(
    ("script", "stop_reason"),
    [
        ([tool_call_text("17 * 23"), answer_text("The answer is 391.")], "final_answer"),
        # a malformed tool call first (a parse error recorded, the model told), then the answer
        (["<tool_call>\n{not json\n</tool_call><|im_end|>", answer_text("391")], "final_answer"),
    ],
)
def test_a_finished_episode_is_freed_without_the_cyclic_collector(
    tokenizer: HFTokenizer, no_cyclic_collector: None, script: list[str], stop_reason: str
) -> None:
    engine = ScriptedEngine(tokenizer, script, record=False)
    session = definition(tokenizer).spawn()  # as the server makes one per request
    asyncio.run(episode(session, engine))
    assert session.stop_reason == stop_reason
    assert session.record().segments[0].ids  # the episode was recorded whole
    freed = weakref.ref(session)
    del session
    assert freed() is None, "a reference cycle keeps the finished session alive until the cyclic collector runs"


def test_a_served_episode_through_the_runtime_is_freed_too(tokenizer: HFTokenizer, no_cyclic_collector: None) -> None:
    engine = ScriptedEngine(tokenizer, [tool_call_text("17 * 23"), answer_text("The answer is 391.")], record=False)
    runtime = AgentRuntime(engine, definition(tokenizer))
    session = runtime.new_session()

    async def run(session: AgentSession) -> None:
        async for _ in runtime.stream("What is 17 * 23?", session=session):
            pass

    asyncio.run(run(session))
    assert session.final_answer == "The answer is 391."
    freed = weakref.ref(session)
    del session
    assert freed() is None
