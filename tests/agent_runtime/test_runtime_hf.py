"""AgentRuntime with a real model: the tiny random-weight Qwen3 on the hf engine, the real Qwen3 tokenizer.

The model's output is gibberish, so the assertions are about the loop, not the text: every generated id lands
in the transcript as sampled, with its logprob, and the engine is always asked with the transcript itself."""

from __future__ import annotations

import asyncio

from agent_env import CalculatorTool, FunctionCallEnvironment
from agent_runtime import AgentRuntime, AgentSession, SamplingParams
from agent_runtime.engines.hf import HFEngine


def test_episode_on_the_tiny_model_is_token_in_token_out(tiny_hf_engine: HFEngine) -> None:
    session = AgentSession(
        protocol="qwen3", environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=3)
    )
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    runtime = AgentRuntime(tiny_hf_engine, session, sampling=greedy, max_context_tokens=2048)
    result = asyncio.run(runtime.run("What is 2 + 2?"))
    (segment,) = result.trajectory.segments
    assert result.trajectory.turns >= 1
    for start, end in segment.action_ranges:
        # replaying the prompt the engine saw gives exactly the ids the transcript holds (greedy is deterministic)
        again = asyncio.run(tiny_hf_engine.generate(segment.ids[:start], greedy))
        assert again.ids == segment.ids[start:end]
        assert again.logprobs is not None
        assert segment.logprobs[start:end] == again.logprobs
        assert segment.loss_mask[start:end] == [1] * (end - start)
    assert result.usage.completion_tokens == sum(segment.loss_mask)
    assert result.stop_reason in {"final_answer", "max_steps"}
