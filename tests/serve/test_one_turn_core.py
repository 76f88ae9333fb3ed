"""Training = inference, end to end: one scripted calculator episode run four ways gives the same token ids, loss
masks and record.

1. `AgentRuntime` in process (what the local trainer and `apps/serve` run);
2. OpenRLHF's executor (`AgentExecutor.rollout` over `OpenRLHFEngine` and `LocalRolloutEngine`: vLLM's own
   `SamplingParams` and `RequestOutput` on the way), and the dict `execute` hands OpenRLHF;
3. agent mode over HTTP (a real uvicorn server, the official openai client), read back from the trajectory log;
4. tools mode over HTTP, where the client runs the calculator itself and sends the results back, read back from
   the log's last record for the conversation.

Then the same for an episode that compacts (paths 1-3; in tools mode the client owns the conversation, so there is
nothing to compact). The engine is a `ScriptedEngine` answering from the prompt with real Qwen3 ids, so each
path's prompts come from its own rendering: any drift between them changes the ids.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams as VLLMSamplingParams

from agent_env import CalculatorTool
from agent_env.tools.calculator import evaluate, format_number
from agent_protocol import HFTokenizer, Message, Tokenizer
from agent_runtime import (
    AgentRuntime,
    CompactionPolicy,
    LLMEngine,
    Recipe,
    ScriptedEngine,
    Trajectory,
    read_trajectories,
)
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.openrlhf.rollout_engine import OpenRLHFEngine
from agent_train.task import encode_task, label_of
from tests.serve.conftest import MODEL, ServerFactory
from tests.support.calculator_policy import calculator_policy
from tests.support.calculator_recipe import calculator_recipe
from tests.support.local_rollout_engine import LocalRolloutEngine
from tests.support.loss_masks import loss_mask_from_ranges

QUESTION = "What is 123 * 45?"
ROW = {"prompt": QUESTION, "answer": "5535"}
COMPACTING = CompactionPolicy(compact_at_tokens=300, max_compactions=1)

Agent = Callable[[Tokenizer], Callable[[Sequence[int]], str]]
"""A scripted agent: given the tokenizer, a `ScriptedEngine` policy (prompt ids -> the turn's text)."""


def engine_for(tokenizer: HFTokenizer, agent: Agent = calculator_policy) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, policy=agent(tokenizer), logprob=-0.25)


def in_process(
    recipe: Recipe, tokenizer: HFTokenizer, row: dict[str, str] = ROW, agent: Agent = calculator_policy
) -> Trajectory:
    runtime = AgentRuntime(engine_for(tokenizer, agent), recipe.make_session(tokenizer))
    return asyncio.run(runtime.run(row["prompt"], task={"answer": row["answer"]})).trajectory


def through_openrlhf(
    recipe: Recipe, tokenizer: HFTokenizer, row: dict[str, str] = ROW, agent: Agent = calculator_policy
) -> tuple[Trajectory, dict[str, Any]]:
    """The executor's whole trajectory, and the dict OpenRLHF trains on, for the same episode."""
    executor = AgentExecutor(recipe)
    params = VLLMSamplingParams(temperature=0.0, max_tokens=recipe.max_new_tokens, logprobs=0)
    context = recipe.max_context_tokens or 8192
    end = tokenizer.token_to_id(recipe.chat_protocol().end_of_turn)
    engine = OpenRLHFEngine(LocalRolloutEngine(engine_for(tokenizer, agent)), tokenizer, params,
                            context_length=context, stop_token_ids=(end,) if end is not None else ())  # fmt: skip
    rollout = asyncio.run(
        executor.rollout(encode_task(row), label_of(row), engine, max_length=context, with_logprobs=True)
    )
    wire = asyncio.run(
        executor.execute(
            encode_task(row),
            label_of(row),
            params,
            context,
            tokenizer,
            LocalRolloutEngine(engine_for(tokenizer, agent)),
        )
    )
    return rollout.trajectory, wire


def over_http_agent_mode(
    start_server: ServerFactory, recipe: Recipe, log: Path, question: str = QUESTION, engine: LLMEngine | None = None
) -> Trajectory:
    server = start_server(engine=engine, recipe=recipe, trajectory_log=str(log))
    server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}])
    [record] = list(read_trajectories(log))
    return record


def over_http_tools_mode(
    start_server: ServerFactory, recipe: Recipe, log: Path, question: str = QUESTION, engine: LLMEngine | None = None
) -> Trajectory:
    """The client drives: it sends the recipe's system prompt and tool, runs each call, sends the results back."""
    server = start_server(engine=engine, recipe=recipe, trajectory_log=str(log))
    tool = CalculatorTool()
    spec = {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}  # fmt: skip
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": recipe.system_prompt},
        {"role": "user", "content": question},
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
    records = list(read_trajectories(log))
    assert [r.task["prepared"] for r in records] == ["new", *["prefix_hit"] * (len(records) - 1)]
    return records[-1]


def tokens(trajectory: Trajectory) -> list[tuple[list[int], list[int]]]:
    return [(s.ids, s.loss_mask) for s in trajectory.segments]


def said(messages: list[Message]) -> list[tuple[str, str]]:
    """What the messages view says, without call ids (tools mode's come from the server, not the session)."""
    return [(m.role, m.content or "") for m in messages]


def test_one_episode_four_ways_is_one_token_stream(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    recipe = calculator_recipe()
    reference = in_process(recipe, tokenizer)
    assert reference.stop_reason == "final_answer" and reference.tool_calls == 1 and reference.reward == 1.0
    assert len(reference.segments) == 1

    executor, wire = through_openrlhf(recipe, tokenizer)
    agent = over_http_agent_mode(start_server, recipe, tmp_path / "agent.jsonl")
    tools = over_http_tools_mode(start_server, recipe, tmp_path / "tools.jsonl")

    for other in (executor, agent):
        assert tokens(other) == tokens(reference)
        assert said(other.messages) == said(reference.messages)
        assert (other.stop_reason, other.final_answer, other.turns, other.tool_calls) == (
            reference.stop_reason, reference.final_answer, reference.turns, reference.tool_calls,
        )  # fmt: skip
    assert executor.reward == reference.reward == 1.0
    [(ids, mask)] = tokens(reference)
    assert [int(i) for i in wire["observation_tokens"]] == ids
    assert loss_mask_from_ranges(len(ids), wire["action_ranges"]) == mask
    assert float(wire["reward"]) == reference.reward
    # tools mode: the client ran the tool, the server only the turns, and the transcript is the same
    assert tokens(tools) == tokens(reference)
    assert said(tools.messages) == said(reference.messages)


def test_a_compacted_episode_is_the_same_segments_in_process_through_openrlhf_and_over_http(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    recipe = calculator_recipe(context=COMPACTING)
    reference = in_process(recipe, tokenizer)
    assert reference.compactions == 1 and len(reference.segments) == 2, reference.stop_reason
    assert reference.stop_reason == "final_answer" and reference.reward == 1.0

    executor, wire = through_openrlhf(recipe, tokenizer)
    agent = over_http_agent_mode(start_server, recipe, tmp_path / "agent.jsonl")
    for other in (executor, agent):
        assert tokens(other) == tokens(reference)
        assert said(other.messages) == said(reference.messages)
        assert (other.compactions, other.stop_reason, other.final_answer) == (1, "final_answer", reference.final_answer)
    ids, mask = tokens(reference)[-1]  # OpenRLHF trains the last segment (sample.py)
    assert [int(i) for i in wire["observation_tokens"]] == ids
    assert loss_mask_from_ranges(len(ids), wire["action_ranges"]) == mask
