"""An agent written against the OpenAI API, trained through the proxy: `AgentExecutor` runs the program of a
recipe (`Recipe.agent`) against a per-episode tools-mode endpoint on the rollout engine, and must give exactly
the ids, loss masks, logprobs and reward that the equivalent recipe gives through `AgentRuntime`.

The engines are honest: a `ScriptedEngine` replaying real Qwen3 ids (the official tokenizer) behind OpenRLHF's
rollout-engine stand-in with vLLM's own sampling params, and the `hf` engine on the tiny random Qwen3. The program
is the plain loop of ``examples/any_agent/agent.py`` with a real `openai.AsyncOpenAI`."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from agent_env import CalculatorTool
from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, SamplingParams, ScriptedEngine
from agent_runtime.agent_program import AgentProgram
from agent_runtime.recipe import Recipe
from agent_train import extra_log_keys
from agent_train.executor import AgentExecutor
from agent_train.local_rollout_engine import LocalRolloutEngine
from agent_train.openrlhf_segments import SEGMENTS_KEY
from agent_train.program_rollout import program_log_keys
from examples.any_agent.agent import CALCULATOR_TOOL, calculate, calculator_agent
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import TASK, execute, loss_mask

SCRIPT = [call("17 * 23"), answer("The answer is 391.")]


def program_recipe(agent: Any = calculator_agent, **program: Any) -> Recipe:
    """The test calculator recipe with `agent` as its program (the environment stays: the runtime side uses it)."""
    return dataclasses.replace(calculator_recipe(), agent=AgentProgram(agent, **program))


def rollout(recipe: Recipe, engine: Any, **kw: Any) -> Any:
    return asyncio.run(AgentExecutor(recipe).rollout(TASK, "391", engine, with_logprobs=True, **kw))


def test_the_example_tool_is_the_calculator_recipe_tool() -> None:
    assert CalculatorTool().spec.to_openai() == CALCULATOR_TOOL
    assert calculate('{"expression": "17 * 23"}') == "391"


def test_a_program_gives_the_ids_masks_logprobs_and_reward_of_the_recipe(
    tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    recipe = calculator_recipe()
    direct_engine = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.25)
    runtime = AgentRuntime(direct_engine, recipe.make_session(), sampling=SamplingParams(max_new_tokens=64))
    direct = asyncio.run(runtime.run(QUESTION, task={"answer": "391"}))

    served = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.25)
    out = execute(AgentExecutor(program_recipe()), LocalRolloutEngine(served), hf_tokenizer)

    (segment,) = direct.trajectory.segments
    assert SEGMENTS_KEY not in out  # one segment: OpenRLHF's own record
    assert out["observation_tokens"] == segment.ids
    assert out["action_ranges"] == segment.action_ranges and len(segment.action_ranges) == 2
    assert loss_mask(len(out["observation_tokens"]), out["action_ranges"]) == segment.loss_mask
    assert out["rollout_log_probs"] == [-0.25 if m else 0.0 for m in segment.loss_mask]
    assert out["reward"] == out["scores"] == direct.reward == pytest.approx(1.1)  # matching 1 + a good tool call
    assert served.calls == direct_engine.calls  # the engine saw the same prompt ids at every turn
    logs = out["extra_logs"]
    assert list(logs) == [*extra_log_keys(recipe.rewards), *program_log_keys()]
    assert logs["agent_program_requests"] == 2 and logs["agent_segments"] == 1 and logs["agent_prefix_broken"] == 0
    assert logs["agent_turns"] == 2 and logs["agent_tool_calls"] == 1 and logs["agent_final_answer"] == 1
    assert logs["agent_reward_matching"] == 1.0 and logs["agent_reward_tool_calls"] == pytest.approx(0.1)
