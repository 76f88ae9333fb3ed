"""The Agents SDK agent on its DEFAULT model, `OpenAIResponsesModel` (``POST /v1/responses``), trained through the
proxy: run by OpenRLHF's executor path (`run_program` behind it) on a `ScriptedEngine` replaying real Qwen3 ids, its
record trains the ids the chat completions variant's record trains, id for id, with the same masks, logprobs and
reward: the Responses items the SDK sends back continue the sampled ids as its chat messages do."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_runtime.agent_program import AgentProgram
from agent_runtime.recipe import Recipe
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.openrlhf.segments import SEGMENTS_KEY
from examples.any_agent.sdk_agent import sdk_calculator_agent, sdk_responses_calculator_agent
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_any_agent_sdk import SCRIPT
from tests.agent_train.test_executor import execute
from tests.support.local_rollout_engine import LocalRolloutEngine


def recipe_of(program: Any) -> Recipe:
    return dataclasses.replace(calculator_recipe(), agent=AgentProgram(program, timeout_s=60.0))


def test_the_sdk_on_the_responses_api_trains_the_ids_of_its_chat_variant(
    tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    served = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.5)
    out = execute(AgentExecutor(recipe_of(sdk_responses_calculator_agent)), LocalRolloutEngine(served), hf_tokenizer)
    chat_engine = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.5)
    chat = execute(AgentExecutor(recipe_of(sdk_calculator_agent)), LocalRolloutEngine(chat_engine), hf_tokenizer)

    assert served.calls == chat_engine.calls and len(served.calls) == 2  # the model saw the same prompts
    assert SEGMENTS_KEY not in out  # the SDK's items continued the sampled ids: one segment
    assert out["observation_tokens"] == chat["observation_tokens"]
    assert out["action_ranges"] == chat["action_ranges"] and len(out["action_ranges"]) == 2
    assert out["rollout_log_probs"] == chat["rollout_log_probs"]
    generated = [t for a, b in out["action_ranges"] for t in out["observation_tokens"][a:b]]
    assert generated == [t for ids in SCRIPT for t in tokenizer.encode(ids)]  # the sampled ids, trained as sampled
    assert out["reward"] == chat["reward"] == pytest.approx(1.1)
    logs = out["extra_logs"]
    assert logs["agent_program_requests"] == 2 and logs["agent_prefix_broken"] == 0
    assert logs["agent_tool_calls"] == 1 and logs["agent_final_answer"] == 1
