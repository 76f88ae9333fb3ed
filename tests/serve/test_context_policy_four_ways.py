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
from pathlib import Path

import pytest

pytest.importorskip("vllm")


from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, BudgetPolicy, CompactionEvent, ContextPolicy, Recipe, ScriptedEngine
from tests.serve.conftest import ServerFactory
from tests.serve.test_one_turn_core import (
    engine_for,
    in_process,
    over_http_agent_mode,
    over_http_tools_mode,
    said,
    through_openrlhf,
    tokens,
)
from tests.support.adding_policy import adding_policy
from tests.support.calculator_recipe import calculator_recipe
from tests.support.drop_tool_results import DropOldestToolResults
from tests.support.loss_masks import loss_mask_from_ranges

QUESTION = "Add 111, 222, 333 and 444 with the calculator."
ROW = {"prompt": QUESTION, "answer": "1110"}
DROPPING = DropOldestToolResults(at_tokens=420)  # the second and the third results' feedback pass it


def recipe_with(context: ContextPolicy) -> Recipe:
    return calculator_recipe(max_new_tokens=64, context=context)


def adder(tokenizer: HFTokenizer) -> ScriptedEngine:
    return engine_for(tokenizer, adding_policy)


def test_a_policy_of_ones_own_is_one_token_stream_four_ways(
    start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    recipe = recipe_with(DROPPING)
    reference = in_process(recipe, tokenizer, ROW, adding_policy)
    assert (reference.stop_reason, reference.final_answer, reference.reward) == (
        "final_answer", "The answer is 1110.", 1.0,
    )  # fmt: skip
    assert reference.tool_calls == 3 and reference.compactions == 2 and len(reference.segments) == 3
    plain = in_process(recipe_with(BudgetPolicy()), tokenizer, ROW, adding_policy)  # no policy: one segment
    assert len(plain.segments) == 1 and said(plain.messages) == said(reference.messages)  # the record keeps it all
    runtime = AgentRuntime(adder(tokenizer), recipe.make_session(tokenizer))
    events = asyncio.run(runtime.run(QUESTION, task={"answer": ROW["answer"]}, keep_events=True)).events
    opened = [(e.segment, e.summary) for e in events if isinstance(e, CompactionEvent)]
    assert opened == [(1, ""), (2, "")], "every segment the policy opens is an event (no summary: a rewrite)"
    last_prompt = tokenizer.decode(reference.segments[-1].ids)
    assert last_prompt.count(DROPPING.placeholder) == 2 and "<tool_response>\n333\n" not in last_prompt

    executor, wire = through_openrlhf(recipe, tokenizer, ROW, adding_policy)
    agent = over_http_agent_mode(start_server, recipe, tmp_path / "agent.jsonl", QUESTION, adder(tokenizer))
    tools = over_http_tools_mode(start_server, recipe, tmp_path / "tools.jsonl", QUESTION, adder(tokenizer))
    assert sum(m.role == "tool" for m in tools.messages) == 3  # the record keeps every result the client sent
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
