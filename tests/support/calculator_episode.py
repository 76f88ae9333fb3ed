"""One calculator episode through AgentSession and AgentRuntime with a ScriptedEngine, for the family tests'
token-in-token-out checks: the engine replays the given completions (stopping on the protocol's stop tokens)
and the real calculator tool (or the given tools) answers "What is 17 * 23?".

agent-env and agent-runtime are imported inside the call with `pytest.importorskip`, so a family test module
that uses this still collects in agent-protocol's isolation run, where its session tests are skipped.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal, NamedTuple

import pytest

from agent_protocol import ChatProtocol, HFTokenizer

__all__ = ["QUESTION", "CalculatorEpisode", "qwen3_answer", "qwen3_call", "run_calculator_episode"]

QUESTION = "What is 17 * 23?"


def qwen3_call(expression: str) -> str:
    """A Qwen3 completion that thinks, then calls the calculator on `expression`."""
    payload = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<think>\nUse the tool.\n</think>\n\n<tool_call>\n{payload}\n</tool_call><|im_end|>"


def qwen3_answer(text: str) -> str:
    """A Qwen3 completion that thinks, then answers `text`."""
    return f"<think>\nDone.\n</think>\n\n{text}<|im_end|>"


class CalculatorEpisode(NamedTuple):
    """What an episode left: the engine (its `calls` are the prompts it was given), the runtime's result and
    the specs of the tools the episode had."""

    engine: Any
    result: Any
    specs: list[Any]


def run_calculator_episode(
    protocol: ChatProtocol | str,
    tokenizer: HFTokenizer,
    completions: list[str],
    *,
    tools: list[Any] | None = None,
    rewards: Literal["result_and_process", "result", "none"] = "result_and_process",
    task: dict[str, Any] | None = None,
    max_steps: int = 6,
    logprob: float | None = None,
    sampling_max_new_tokens: int | None = None,
    **session_options: Any,
) -> CalculatorEpisode:
    """Run one episode. `protocol` may be a name, as a recipe gives it (the session builds the protocol);
    `rewards` picks the reward pipeline (a matching reward on the result, plus the tool-call process reward);
    `task` defaults to the answer 391 when there are rewards; `sampling_max_new_tokens` sets the runtime's
    sampling; `session_options` go to AgentSession (a system prompt, `max_new_tokens`)."""
    runtime = pytest.importorskip("agent_runtime")
    env = pytest.importorskip("agent_env")
    tools = tools if tools is not None else [env.CalculatorTool()]
    if rewards != "none":
        process = [env.ToolCallReward()] if rewards == "result_and_process" else []
        session_options["rewards"] = env.RewardPipeline(result=[env.MatchingReward()], process=process)
        task = {"answer": "391"} if task is None else task
    session = runtime.AgentSession(
        protocol=protocol,
        environment=lambda: env.FunctionCallEnvironment(tools=tools, max_steps=max_steps),
        tokenizer=tokenizer,
        **session_options,
    )
    stops = [tokenizer.token_to_id(t) for t in session.protocol.stop_texts]
    engine = runtime.ScriptedEngine(
        tokenizer, completions, stop_token_ids=[i for i in stops if i is not None], logprob=logprob
    )
    sampling = (
        None if sampling_max_new_tokens is None else runtime.SamplingParams(max_new_tokens=sampling_max_new_tokens)
    )
    agent = runtime.AgentRuntime(engine, session, sampling=sampling)
    result = asyncio.run(agent.run(QUESTION, task=task))
    return CalculatorEpisode(engine=engine, result=result, specs=[tool.spec for tool in tools])
