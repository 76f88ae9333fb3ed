"""Every history-edit kind an agent program can make, end to end through OpenRLHF's executor path: the shipped
`AgentExecutor` (OpenRLHF's `AgentExecutorBase`) driven by `execute` as OpenRLHF drives it, on OpenRLHF's
rollout-engine stand-in with vLLM's own sampling params, replaying real Qwen3 ids (the official tokenizer). Each
kind's scripted program makes three requests, the third one edited; the test checks the records OpenRLHF gets
(how many segments, which tokens each trains, with which logprobs and reward), the kind's counts in `extra_logs`
and in the logged trajectory, and the break recorded, against the rule `EDIT_RULES` gives the kind:
``continue`` (one segment), ``rollback`` (the rewritten turn rendered, untrained, the sampled one kept in a
segment of its own) or ``new_segment``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_runtime.agent_program import ProgramTask
from agent_runtime.proxy import EDIT_KINDS, EDIT_RULES
from agent_runtime.trajectory import read_trajectories
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.openrlhf.segments import SEGMENTS_KEY
from examples.any_agent.agent import CALCULATOR_TOOL, calculate
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.test_executor import execute
from tests.agent_train.test_executor_proxy import program_recipe
from tests.support.local_rollout_engine import LocalRolloutEngine

SCRIPT = [call("17 * 23"), call("391 + 0", "Let me check it."), answer("The answer is 391.")]
FEW_SHOT = [
    {"role": "user", "content": "What is 2 * 3?"},
    {"role": "assistant", "content": "The answer is 6."},
    {"role": "user", "content": QUESTION},
]
LOGPROB = -0.5

Messages = list[dict[str, Any]]


def answered(echo: dict[str, Any]) -> Messages:
    """The assistant message as the program echoes it, and a tool result for each of its calls."""
    results = [
        {"role": "tool", "tool_call_id": c["id"], "content": calculate(c["function"]["arguments"])}
        for c in echo.get("tool_calls", [])
    ]
    return [echo, *results]


def program(third: Callable[[Messages, Messages], Messages], *, first: Messages | None = None) -> Any:
    """A program of three requests: the task's prompt (or `first`), then it with the first turn and its tool
    result, then `third(prompt, history)` where history is the prompt and both turns with their results."""

    async def agent(client: Any, task: ProgramTask) -> str | None:
        async def ask(messages: Messages) -> dict[str, Any]:
            out = await client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR_TOOL])
            return out.choices[0].message.model_dump(exclude_none=True)

        prompt = copy.deepcopy(first) if first is not None else list(task.messages)
        history = [*prompt, *answered(await ask(prompt))]
        history += answered(await ask(history))
        return str((await ask(third(prompt, copy.deepcopy(history))))["content"])

    return agent


def strip_reasoning(prompt: Messages, history: Messages) -> Messages:
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in history]


def rewrite_last_call(prompt: Messages, history: Messages) -> Messages:
    last = history[-2]["tool_calls"][0]["function"]
    last["arguments"] = '{"expression": "391"}'  # a harness that cleans the model's call
    return history


def rename_first_ids(prompt: Messages, history: Messages) -> Messages:
    n = len(prompt)
    history[n]["tool_calls"][0]["id"] = history[n + 1]["tool_call_id"] = "tool_0"
    return history


def edit_first_turn(prompt: Messages, history: Messages) -> Messages:
    history[len(prompt)]["content"] = "Let me use the calculator."
    return history


def drop_example(prompt: Messages, history: Messages) -> Messages:
    return history[2:]  # a window that lets the oldest exchange (the few-shot example) go


def ask_anew(prompt: Messages, history: Messages) -> Messages:
    return [{"role": "user", "content": "Is 17 * 23 = 391 right?"}]


def branch(prompt: Messages, history: Messages) -> Messages:
    n = len(prompt)
    return [*history[: n + 1], {**history[n + 1], "content": "391 (checked)"}]  # the first turn, answered again


def resend_prompt(prompt: Messages, history: Messages) -> Messages:
    return prompt  # the few-shot prompt, sent again: an earlier point of the conversation


@dataclass(frozen=True)
class Case:
    kind: str
    third: Callable[[Messages, Messages], Messages]
    #: per record OpenRLHF gets (earlier segments first), which scripted turns it trains
    trained: list[list[int]]
    first: Messages | None = None
    at_message: int | None = None  # where the break's first difference is (a break only)


CASES = [
    Case("append", lambda prompt, history: history, [[0, 1, 2]]),
    Case("reasoning_stripped", strip_reasoning, [[0, 1, 2]]),
    Case("last_turn_rewritten", rewrite_last_call, [[1], [0, 2]]),
    Case("new_conversation", ask_anew, [[0, 1], [2]], at_message=0),
    Case("branched", branch, [[0, 1], [2]], at_message=2),
    Case("history_truncated", resend_prompt, [[0, 1], [2]], first=FEW_SHOT, at_message=3),
    Case("messages_dropped", drop_example, [[0, 1], [2]], first=FEW_SHOT, at_message=0),
    Case("tool_ids_rewritten", rename_first_ids, [[0, 1], [2]], at_message=1),
    Case("message_edited", edit_first_turn, [[0, 1], [2]], at_message=1),
]


def test_every_kind_has_a_case_and_a_rule() -> None:
    assert [case.kind for case in CASES] == list(EDIT_KINDS) and set(EDIT_RULES) == set(EDIT_KINDS)


@pytest.mark.parametrize("case", CASES, ids=[case.kind for case in CASES])
def test_each_edit_kind_gets_its_rule(tokenizer: HFTokenizer, hf_tokenizer: Any, tmp_path: Path, case: Case) -> None:
    log = tmp_path / "trajectories.jsonl"
    executor = AgentExecutor(program_recipe(program(case.third, first=case.first)), trajectory_log=str(log))
    engine = ScriptedEngine(tokenizer, SCRIPT, logprob=LOGPROB)
    out = execute(executor, LocalRolloutEngine(engine), hf_tokenizer)

    records = [*out.get(SEGMENTS_KEY, []), out]
    sampled = [tokenizer.encode(turn) for turn in SCRIPT]
    rule = EDIT_RULES[case.kind]  # type: ignore[index]
    assert len(records) == len(case.trained) == (1 if rule == "continue" else 2)
    for record, turns in zip(records, case.trained, strict=True):
        ids, ranges = record["observation_tokens"], record["action_ranges"]
        # each record trains exactly the turns the model sampled in it, as sampled, with their logprobs
        assert [ids[start:end] for start, end in ranges] == [sampled[i] for i in turns]
        trained = {i for start, end in ranges for i in range(start, end)}
        assert all((lp == LOGPROB) == (i in trained) for i, lp in enumerate(record["rollout_log_probs"]))
        assert record["reward"] == out["reward"]
    # each request's prompt was a record's prefix: the model was trained on what it saw
    prompts = [list(p) for p in engine.calls]
    assert all(any(r["observation_tokens"][: len(p)] == p for r in records) for p in prompts)

    logs = out["extra_logs"]
    counts = {kind: logs[f"agent_edit_{kind}"] for kind in EDIT_KINDS}
    expected = dict.fromkeys(EDIT_KINDS, 0.0) | {"append": 1.0}
    expected[case.kind] += 1.0
    assert counts == expected  # the second request appends; the third is the case's kind
    assert logs["agent_segments"] == len(records)
    assert logs["agent_prefix_breaks"] == (rule == "new_segment" and case.kind != "new_conversation")

    (trajectory,) = read_trajectories(log)
    recorded = trajectory.task["agent_program"]
    assert recorded["edits"] == {kind: int(count) for kind, count in expected.items()}
    if rule == "new_segment":
        assert recorded["breaks"] == [{"reason": case.kind, "request": 2, "segment": 1, "at_message": case.at_message}]
    else:
        assert recorded["breaks"] == []


def test_a_rolled_back_conversation_is_the_template_render_of_the_edited_one(
    tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    """The rule's token-in-token-out invariant: the ids the model saw after the rollback (the stored ids up to
    the rewritten turn, the rewrite tokenized alone, the feedback) are the chat template's render of the
    conversation the program sent, tokenized whole."""
    sent: list[Messages] = []

    def rewrite(prompt: Messages, history: Messages) -> Messages:
        sent.append(rewrite_last_call(prompt, history))
        return sent[-1]

    engine = ScriptedEngine(tokenizer, SCRIPT)
    out = execute(AgentExecutor(program_recipe(program(rewrite))), LocalRolloutEngine(engine), hf_tokenizer)
    (edited,) = sent
    render = hf_tokenizer.apply_chat_template(
        edited, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert list(engine.calls[2]) == list(render)
    (start, _), = out["action_ranges"][1:]  # fmt: skip
    assert out["observation_tokens"][:start] == list(render)
    # the rewritten call is in the context, untrained; the sampled one is not
    context = tokenizer.decode(out["observation_tokens"][:start])
    assert '"expression": "391"}' in context and '"expression": "391 + 0"' not in context
