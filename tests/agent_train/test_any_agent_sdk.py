"""An agent built with the OpenAI Agents SDK (`openai-agents`), trained through the proxy: run by OpenRLHF's
executor path it gives the ids, loss masks, logprobs and reward that the equivalent recipe gives through
`AgentRuntime`, although the SDK rebuilds its chat messages from its own items between turns (dropping the
model's reasoning); a batch of its episodes runs concurrently and isolated, one of them failing alone.

The engine is a `ScriptedEngine` replaying real Qwen3 ids behind OpenRLHF's rollout-engine stand-in; the client
is a real `openai.AsyncOpenAI` handed to the SDK's own Chat Completions model."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer, get_protocol
from agent_runtime import AgentRuntime, SamplingParams, ScriptedEngine
from agent_runtime.agent_program import AgentProgram
from agent_runtime.recipe import Recipe
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.openrlhf.segments import SEGMENTS_KEY
from examples.any_agent.agent import CALCULATOR_TOOL
from examples.any_agent.sdk_agent import sdk_calculator_agent
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import execute, loss_mask
from tests.support.local_rollout_engine import LocalRolloutEngine

SCRIPT = [call("17 * 23"), answer("The answer is 391.")]


def sdk_recipe() -> Recipe:
    return dataclasses.replace(calculator_recipe(), agent=AgentProgram(sdk_calculator_agent, timeout_s=60.0))


def test_an_agents_sdk_program_gives_the_ids_masks_logprobs_and_reward_of_the_recipe(
    tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    """Everything after the prompt is the recipe's, id for id; the prompt differs only where the SDK's request
    does: its tool carries ``"strict": false``, which the template prints as it prints any key of a tool."""
    recipe = calculator_recipe()
    direct_engine = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.5)
    runtime = AgentRuntime(direct_engine, recipe.make_session(), sampling=SamplingParams(max_new_tokens=64))
    direct = asyncio.run(runtime.run(QUESTION, task={"answer": "391"}))

    served = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.5)
    out = execute(AgentExecutor(sdk_recipe()), LocalRolloutEngine(served), hf_tokenizer)

    (segment,) = direct.trajectory.segments
    assert SEGMENTS_KEY not in out  # the SDK's rebuilt history still continued the sampled ids: one segment
    ids, ranges = out["observation_tokens"], out["action_ranges"]
    prompt, direct_prompt = ranges[0][0], segment.action_ranges[0][0]
    sdk_tool = {**CALCULATOR_TOOL, "function": {**CALCULATOR_TOOL["function"], "strict": False}}
    rendered = get_protocol("qwen3").render_prompt([{"role": "user", "content": QUESTION}], tools=[sdk_tool])
    assert ids[:prompt] == tokenizer.encode(rendered)
    assert ids[prompt:] == segment.ids[direct_prompt:]
    assert [(a - prompt, b - prompt) for a, b in ranges] == [
        (a - direct_prompt, b - direct_prompt) for a, b in segment.action_ranges
    ]
    assert loss_mask(len(ids), ranges)[prompt:] == segment.loss_mask[direct_prompt:]
    assert out["rollout_log_probs"][prompt:] == [-0.5 if m else 0.0 for m in segment.loss_mask[direct_prompt:]]
    assert out["reward"] == direct.reward == pytest.approx(1.1)
    logs = out["extra_logs"]
    assert logs["agent_program_requests"] == 2 and logs["agent_prefix_broken"] == 0
    assert logs["agent_tool_calls"] == 1 and logs["agent_final_answer"] == 1


def test_a_batch_of_sdk_episodes_is_isolated(tokenizer: HFTokenizer) -> None:
    """Eight concurrent SDK episodes on one engine, one of which the model never answers within its turns:
    each gets its own answer and reward; the one that ran out of turns gets none, and costs nothing else."""
    questions = {f"What is {k} * 17?": k * 17 for k in range(8)}

    def policy(prompt: Any) -> str:
        text = tokenizer.decode(list(prompt))
        question = next(q for q in questions if q in text)
        value = questions[question]
        if value == 0:  # this episode keeps calling the tool and never answers
            return call("0 * 17")
        return answer(f"The answer is {value}.") if "<tool_response>" in text else call(question[8:-1])

    engine = ScriptedEngine(tokenizer, policy=policy, logprob=-0.5)
    executor = AgentExecutor(sdk_recipe())

    async def main() -> list[Any]:
        from agent_train.task import encode_task

        return await asyncio.gather(*(
            executor.rollout(encode_task({"prompt": q, "answer": str(v)}), str(v), engine, with_logprobs=True)
            for q, v in questions.items()
        ))  # fmt: skip

    results = asyncio.run(main())
    for (question, value), result in zip(questions.items(), results, strict=True):
        trajectory = result.trajectory
        if value == 0:
            assert trajectory.final_answer is None and trajectory.reward < 1
        else:
            assert trajectory.final_answer == f"The answer is {value}.", question
            assert trajectory.reward == pytest.approx(1.1)
            assert len(trajectory.segments) == 1


def test_the_sdk_agent_trains_in_the_cpu_smoke_mode(tmp_path: Path) -> None:
    """The SDK agent's rollouts on the tiny demo model feed an RL step of the local trainer's pieces: every
    episode through the proxy, one segment each (the SDK's history continues the sampled ids), finite rewards."""
    import msgspec

    from examples.any_agent.recipe import make_recipe
    from examples.any_agent.train import SMOKE, train_from_model
    from tests.support.tiny_demo import save_tiny_demo_model

    config = msgspec.structs.replace(SMOKE, rl_steps=1, rl_prompts=4, rl_group_size=2, eval_problems=4, eval_samples=1)
    model_dir = save_tiny_demo_model(tmp_path / "tiny")
    result = asyncio.run(train_from_model(config, make_recipe("sdk"), model_dir, seed=0))
    assert len(result.step_rewards) == 1
    assert result.segments_per_episode == 1.0
    assert 0.0 <= result.before <= 1.1 and 0.0 <= result.after <= 1.1


@pytest.mark.parametrize("agent", ["sdk", "sdk-responses"])
def test_the_sdk_recipes_list_the_calculator_as_the_sdk_sends_it(agent: Any) -> None:
    """The warm start (the recipe's own session) must show the model the SDK's tool listing, key order and
    ``"strict": false`` included, or the model it trains never sees its rollouts' prompt."""
    from agents import FunctionTool
    from agents.models.chatcmpl_converter import Converter

    from examples.any_agent.recipe import make_recipe
    from examples.any_agent.subprocess_agent import CALCULATOR_TOOL as PROGRAM_TOOL

    spec = PROGRAM_TOOL["function"]

    async def unused(_context: Any, _arguments: str) -> str:
        return ""

    tool = FunctionTool(name=spec["name"], description=spec["description"], params_json_schema=spec["parameters"],
                        on_invoke_tool=unused, strict_json_schema=False)  # fmt: skip
    sent = Converter.tool_to_openai(tool)
    (listed,) = [t.to_openai() for t in make_recipe(agent).environment().tools]
    assert listed == sent and list(listed["function"]) == list(sent["function"])
    (plain,) = [t.to_openai() for t in make_recipe("loop").environment().tools]
    assert plain == PROGRAM_TOOL  # the plain loop's recipe keeps the program's own listing
