"""A context policy a user writes (`tests/support/drop_tool_results.py`: past a threshold, drop the oldest tool
results and go on in a new segment), given as `Recipe.context`, runs the same four ways as the calculator in
`test_one_turn_core.py`: the same token ids, loss masks, segments and messages.

1. `AgentRuntime` in process;
2. OpenRLHF's executor (`AgentExecutor.rollout`, and the dict `execute` hands OpenRLHF: the last segment);
3. agent mode over HTTP, read back from the trajectory log;
4. tools mode over HTTP. The client owns the conversation there: it sends its whole history every time, dropped
   results included. The server applies the recipe's policy to what it renders: where a follow-up grows the
   context past the threshold, it renders a new segment from the messages the policy returned, and the client's
   next follow-up continues that segment (a prefix hit). So the server's record is the agent's.

The scripted agent adds four numbers with one calculator call per number, reading each prompt (the latest result
is always kept), so each path's prompts come from its own rendering: any drift changes the ids.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams as VLLMSamplingParams

from agent_env import CalculatorTool
from agent_env.tools.calculator import evaluate, format_number
from agent_protocol import HFTokenizer
from agent_runtime import (
    AgentRuntime,
    BudgetPolicy,
    ContextPolicy,
    Recipe,
    ScriptedEngine,
    Trajectory,
    read_trajectories,
)
from agent_train.task import encode_task, label_of
from tests.serve.conftest import MODEL, ServerFactory
from tests.serve.test_one_turn_core import AgentExecutor, LocalRolloutEngine, OpenRLHFEngine, said, tokens
from tests.support.adding_policy import adding_policy
from tests.support.calculator_recipe import calculator_recipe
from tests.support.drop_tool_results import DropOldestToolResults
from tests.support.loss_masks import loss_mask_from_ranges

QUESTION = "Add 111, 222, 333 and 444 with the calculator."
ROW = {"prompt": QUESTION, "answer": "1110"}
DROPPING = DropOldestToolResults(at_tokens=420)  # the second and the third results' feedback pass it


def recipe_with(context: ContextPolicy) -> Recipe:
    return calculator_recipe(max_new_tokens=64, context=context)


def engine_for(tokenizer: HFTokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, policy=adding_policy(tokenizer), logprob=-0.25)


def in_process(recipe: Recipe, tokenizer: HFTokenizer) -> Trajectory:
    runtime = AgentRuntime(engine_for(tokenizer), recipe.make_session(tokenizer))
    return asyncio.run(runtime.run(QUESTION, task={"answer": ROW["answer"]})).trajectory


def through_openrlhf(recipe: Recipe, tokenizer: HFTokenizer) -> tuple[Trajectory, dict[str, Any]]:
    executor = AgentExecutor(recipe)
    params = VLLMSamplingParams(temperature=0.0, max_tokens=recipe.max_new_tokens, logprobs=0)
    context = recipe.max_context_tokens or 8192
    end = tokenizer.token_to_id(recipe.chat_protocol().end_of_turn)
    engine = OpenRLHFEngine(LocalRolloutEngine(engine_for(tokenizer)), tokenizer, params, context_length=context,
                            stop_token_ids=(end,) if end is not None else ())  # fmt: skip
    rollout = asyncio.run(
        executor.rollout(encode_task(ROW), label_of(ROW), engine, max_length=context, with_logprobs=True)
    )
    wire = asyncio.run(
        executor.execute(
            encode_task(ROW), label_of(ROW), params, context, tokenizer, LocalRolloutEngine(engine_for(tokenizer))
        )
    )
    return rollout.trajectory, wire


def over_http_agent_mode(start_server: ServerFactory, recipe: Recipe, tokenizer: HFTokenizer, log: Path) -> Trajectory:
    server = start_server(engine=engine_for(tokenizer), recipe=recipe, trajectory_log=str(log))
    server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}])
    [record] = list(read_trajectories(log))
    return record


def over_http_tools_mode(start_server: ServerFactory, recipe: Recipe, tokenizer: HFTokenizer, log: Path) -> Trajectory:
    """The client runs each call and sends its whole conversation back, none of it dropped."""
    server = start_server(engine=engine_for(tokenizer), recipe=recipe, trajectory_log=str(log))
    tool = CalculatorTool()
    spec = {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}  # fmt: skip
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": recipe.system_prompt},
        {"role": "user", "content": QUESTION},
    ]
    client = server.client()
    for _ in range(6):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[spec])  # type: ignore[arg-type]
        message = reply.choices[0].message
        if not message.tool_calls:
            break
        calls = [c.model_dump() for c in message.tool_calls]
        messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
        for call in message.tool_calls:
            result = format_number(evaluate(json.loads(call.function.arguments)["expression"]))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    assert sum(m["role"] == "tool" for m in messages) == 3  # the client's history keeps every result
    records = list(read_trajectories(log))
    assert [r.task["prepared"] for r in records] == ["new", *["prefix_hit"] * (len(records) - 1)]
    return records[-1]


def test_a_policy_of_ones_own_is_one_token_stream_four_ways(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    recipe = recipe_with(DROPPING)
    reference = in_process(recipe, tokenizer)
    assert (reference.stop_reason, reference.final_answer, reference.reward) == (
        "final_answer", "The answer is 1110.", 1.0,
    )  # fmt: skip
    assert reference.tool_calls == 3 and reference.compactions == 2 and len(reference.segments) == 3
    plain = in_process(recipe_with(BudgetPolicy()), tokenizer)  # the same agent without the policy: one segment
    assert len(plain.segments) == 1 and said(plain.messages) == said(reference.messages)  # the record keeps it all
    last_prompt = tokenizer.decode(reference.segments[-1].ids)
    assert last_prompt.count(DROPPING.placeholder) == 2 and "<tool_response>\n333\n" not in last_prompt

    executor, wire = through_openrlhf(recipe, tokenizer)
    agent = over_http_agent_mode(start_server, recipe, tokenizer, tmp_path / "agent.jsonl")
    tools = over_http_tools_mode(start_server, recipe, tokenizer, tmp_path / "tools.jsonl")
    for other in (executor, agent, tools):
        assert tokens(other) == tokens(reference)
        assert said(other.messages) == said(reference.messages)
        assert other.compactions == reference.compactions
    for other in (executor, agent):
        assert (other.stop_reason, other.final_answer, other.turns, other.tool_calls) == (
            reference.stop_reason, reference.final_answer, reference.turns, reference.tool_calls,
        )  # fmt: skip
    assert executor.reward == reference.reward == 1.0  # (a served request has no reference answer to score)
    ids, mask = tokens(reference)[-1]  # OpenRLHF trains the last segment (sample.py)
    assert [int(i) for i in wire["observation_tokens"]] == ids
    assert loss_mask_from_ranges(len(ids), wire["action_ranges"]) == mask
