"""An `AgentRuntime` episode on the real vLLM (CPU build) equals the same episode on `HFEngine`: the segments'
ids, loss masks and logprobs, the turns and the stop reason, alone and with episodes run concurrently.

The model is the tiny random-weight Qwen3, so its output is gibberish and it never calls a tool: what is compared
is the loop over real engines (rendering once, appending generated ids as sampled, closing the turn), not text.
The tool-call path on a real model is exercised by the executor test, whose calculator recipe scores the episode.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment
from agent_runtime import AgentRuntime, AgentSession, SamplingParams
from tests.vllm_cpu.conftest import CONTEXT, LoopThread
from tests.vllm_cpu.test_engine import LOGPROB_TOLERANCE

QUESTIONS = ["What is 2 + 2?", "Multiply 17 by 23, please.", "hi", "Use the calculator on 9 / 3."]


def runtime(engine: Any) -> AgentRuntime:
    session = AgentSession(
        protocol="qwen3", environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=3)
    )
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    return AgentRuntime(engine, session, sampling=greedy, max_context_tokens=CONTEXT)


def assert_same_episode(vllm: Any, hf: Any) -> None:
    assert vllm.trajectory.errors == hf.trajectory.errors == []
    assert (vllm.stop_reason, vllm.trajectory.turns) == (hf.stop_reason, hf.trajectory.turns)
    assert vllm.final_answer == hf.final_answer
    assert len(vllm.trajectory.segments) == len(hf.trajectory.segments) >= 1
    for ours, theirs in zip(vllm.trajectory.segments, hf.trajectory.segments, strict=True):
        assert ours.ids == theirs.ids
        assert ours.loss_mask == theirs.loss_mask
        assert ours.action_ranges == theirs.action_ranges
        assert [p is None for p in ours.logprobs] == [p is None for p in theirs.logprobs]
        pairs = [(a, b) for a, b in zip(ours.logprobs, theirs.logprobs, strict=True) if a is not None]
        assert [a for a, _ in pairs] == pytest.approx([b for _, b in pairs], abs=LOGPROB_TOLERANCE)
        assert sum(ours.loss_mask) > 0
    assert vllm.usage == hf.usage


def test_an_episode_on_vllm_equals_the_same_episode_on_hf(loop: LoopThread, vllm_engine: Any, hf_engine: Any) -> None:
    vllm = loop.run(runtime(vllm_engine).run(QUESTIONS[0]))
    hf = loop.run(runtime(hf_engine).run(QUESTIONS[0]))
    assert_same_episode(vllm, hf)


def test_concurrent_episodes_on_vllm_equal_hf_one_by_one(loop: LoopThread, vllm_engine: Any, hf_engine: Any) -> None:
    together = loop.run(runtime(vllm_engine).run_many(QUESTIONS))
    for question, vllm in zip(QUESTIONS, together, strict=True):
        assert_same_episode(vllm, loop.run(runtime(hf_engine).run(question)))
