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
from structlog.testing import capture_logs

from agent_env import CalculatorTool
from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, SamplingParams, ScriptedEngine
from agent_runtime.agent_program import AgentProgram, ProgramTask
from agent_runtime.recipe import Recipe
from agent_train import extra_log_keys
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.openrlhf.segments import SEGMENTS_KEY
from agent_train.program_rollout import program_log_keys
from agent_train.task import encode_task
from examples.any_agent.agent import CALCULATOR_TOOL, calculate, calculator_agent
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import TASK, execute, loss_mask
from tests.support.calculator_policy import calculator_policy
from tests.support.local_rollout_engine import LocalRolloutEngine

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


# -- prefix breaks ---------------------------------------------------------------------------------------------


def two_turns(edit: Any) -> Any:
    """A program like the example's for two turns, whose echo of the first assistant turn goes through `edit`
    (and whose tool message gets the id the edited echo carries)."""

    async def agent(client: Any, task: ProgramTask) -> str | None:
        messages = task.messages
        first = await client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR_TOOL])
        message = first.choices[0].message
        echo = edit(message.model_dump(exclude_none=True))
        (call_,) = echo["tool_calls"]
        messages += [
            echo,
            {"role": "tool", "tool_call_id": call_["id"], "content": calculate(call_["function"]["arguments"])},
        ]
        second = await client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR_TOOL])
        return str(second.choices[0].message.content)

    return agent


def without_reasoning(echo: dict[str, Any]) -> dict[str, Any]:
    echo.pop("reasoning_content")
    return echo


def with_content(echo: dict[str, Any]) -> dict[str, Any]:
    return {**echo, "content": "Let me use the calculator."}


def with_own_ids(echo: dict[str, Any]) -> dict[str, Any]:
    return {**echo, "tool_calls": [{**c, "id": "tool_0"} for c in echo["tool_calls"]]}


def test_dropping_the_reasoning_on_the_way_back_keeps_the_sampled_ids(tokenizer: HFTokenizer) -> None:
    direct = asyncio.run(AgentRuntime(ScriptedEngine(tokenizer, SCRIPT), calculator_recipe().make_session()).run(
        QUESTION, task={"answer": "391"}))  # fmt: skip
    out = rollout(program_recipe(two_turns(without_reasoning)), ScriptedEngine(tokenizer, SCRIPT))
    assert [s.observation_tokens for s in out.segments] == [direct.trajectory.segments[0].ids]
    assert out.sample.extra_logs["agent_prefix_breaks"] == 0 and out.sample.reward == pytest.approx(1.1)


@pytest.mark.parametrize("edit", [with_content, with_own_ids])
def test_a_rewritten_last_turn_is_rolled_back_and_the_sampled_one_kept(tokenizer: HFTokenizer, edit: Any) -> None:
    """The client rewrote the only (so the last) assistant turn: the conversation goes on from the turn's start
    with the rewrite as context, and the sampled turn is a segment of its own (tests/agent_train/
    test_executor_history_edits.py has every edit kind)."""
    direct = asyncio.run(AgentRuntime(ScriptedEngine(tokenizer, SCRIPT), calculator_recipe().make_session()).run(
        QUESTION, task={"answer": "391"}))  # fmt: skip
    (whole,) = direct.trajectory.segments
    (first_turn, _), (answer_start, answer_end) = whole.action_ranges
    answer_ids = whole.ids[answer_start:answer_end]

    engine = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.5)
    out = rollout(program_recipe(two_turns(edit)), engine)
    first, second = out.segments
    # the first turn is trained as sampled, under the context it was sampled in (the rolled-back segment)
    assert first.observation_tokens == whole.ids[: whole.action_ranges[0][1]]
    assert first.action_ranges == [whole.action_ranges[0]] and first_turn == first.action_ranges[0][0]
    # the answer is trained as sampled, under the history the model actually saw (the rewrite untrained)
    (start, end), = second.action_ranges  # fmt: skip
    assert second.observation_tokens[start:end] == answer_ids and end == len(second.observation_tokens)
    assert second.observation_tokens[:start] == list(engine.calls[1])
    assert second.rollout_log_probs is not None and set(second.rollout_log_probs[start:end]) == {-0.5}
    assert second.observation_tokens[:first_turn] == whole.ids[:first_turn]  # the stored ids, up to the turn
    # both with the episode's reward; the rollback is counted, and it is no prefix break
    assert first.reward == second.reward == pytest.approx(1.1)
    logs = out.sample.extra_logs
    assert logs["agent_segments"] == 2 and logs["agent_prefix_breaks"] == 0 and logs["agent_prefix_broken"] == 0
    assert logs["agent_edit_last_turn_rewritten"] == 1
    assert out.trajectory.task["agent_program"]["breaks"] == []


def test_openrlhf_gets_every_segment_of_a_broken_episode(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    engine = LocalRolloutEngine(ScriptedEngine(tokenizer, SCRIPT))
    out = execute(AgentExecutor(program_recipe(two_turns(with_content))), engine, hf_tokenizer)
    (earlier,) = out[SEGMENTS_KEY]
    assert earlier["reward"] == out["reward"] == pytest.approx(1.1)
    assert len(earlier["action_ranges"]) == len(out["action_ranges"]) == 1


def test_a_second_conversation_is_a_segment_but_not_a_rewrite(tokenizer: HFTokenizer) -> None:
    async def asks_twice(client: Any, task: ProgramTask) -> str | None:
        first = await calculator_agent(client, task)
        check = ProgramTask(prompt=f"Is {first} right?", model=task.model)
        await client.chat.completions.create(model=task.model, messages=check.messages, tools=[CALCULATOR_TOOL])
        return first

    out = rollout(program_recipe(asks_twice), ScriptedEngine(tokenizer, [*SCRIPT, answer("Yes.")]))
    logs = out.sample.extra_logs
    assert logs["agent_segments"] == 2 and logs["agent_edit_new_conversation"] == 1
    assert logs["agent_prefix_breaks"] == 0 and logs["agent_prefix_broken"] == 0
    assert out.trajectory.final_answer == "The answer is 391." and out.sample.reward == pytest.approx(1.1)


def test_a_streamed_request_is_recorded_as_a_plain_one(tokenizer: HFTokenizer) -> None:
    async def streams(client: Any, task: ProgramTask) -> str | None:
        chunks = await client.chat.completions.create(
            model=task.model, messages=task.messages, tools=[CALCULATOR_TOOL], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    script = [answer("The answer is 391.")]
    direct = asyncio.run(AgentRuntime(ScriptedEngine(tokenizer, script), calculator_recipe().make_session()).run(
        QUESTION, task={"answer": "391"}))  # fmt: skip
    out = rollout(program_recipe(streams), ScriptedEngine(tokenizer, script))
    assert out.sample.observation_tokens == direct.trajectory.segments[0].ids
    assert out.trajectory.final_answer == "The answer is 391." and out.sample.reward == direct.reward == 1.0


# -- failures and budgets --------------------------------------------------------------------------------------


def test_a_program_that_raises_ends_only_its_episode_and_keeps_its_turns(tokenizer: HFTokenizer) -> None:
    async def raises(client: Any, task: ProgramTask) -> str | None:
        await client.chat.completions.create(model=task.model, messages=task.messages, tools=[CALCULATOR_TOOL])
        raise RuntimeError("the framework broke")

    out = rollout(program_recipe(raises), ScriptedEngine(tokenizer, SCRIPT))
    program = out.trajectory.task["agent_program"]
    assert program["code"] == "program_error" and "the framework broke" in program["message"]
    assert out.sample.extra_logs["agent_program_program_error"] == 1
    assert len(out.sample.action_ranges) == 1  # the turn the model generated is kept and trained
    assert out.trajectory.final_answer is None and out.sample.reward == pytest.approx(0.0)  # no answer, no call ran


def test_a_program_past_its_time_budget_is_cancelled(tokenizer: HFTokenizer) -> None:
    async def hangs(client: Any, task: ProgramTask) -> str | None:
        await client.chat.completions.create(model=task.model, messages=task.messages, tools=[CALCULATOR_TOOL])
        await asyncio.sleep(3600)
        return None

    out = rollout(program_recipe(hangs, timeout_s=0.5), ScriptedEngine(tokenizer, SCRIPT))
    assert out.trajectory.task["agent_program"]["code"] == "program_timeout"
    assert out.sample.extra_logs["agent_program_program_timeout"] == 1 and len(out.sample.action_ranges) == 1


def test_the_token_budget_ends_the_episode_as_over_long(tokenizer: HFTokenizer) -> None:
    first_turn = len(tokenizer.encode(SCRIPT[0]))
    out = rollout(program_recipe(max_episode_tokens=first_turn), ScriptedEngine(tokenizer, SCRIPT))
    assert out.trajectory.task["agent_program"]["code"] == "token_budget_exhausted"
    assert out.trajectory.stop_reason == "context_exhausted" and out.sample.overlong
    assert out.sample.extra_logs["agent_error_engine_error"] == 1  # the refused request, as the server recorded it
    assert sum(e - s for s, e in out.sample.action_ranges) == first_turn


def test_a_program_that_never_calls_the_model_gets_nothing(tokenizer: HFTokenizer) -> None:
    async def answers_alone(client: Any, task: ProgramTask) -> str | None:
        return "The answer is 391."

    with capture_logs() as logs:
        out = rollout(program_recipe(answers_alone), ScriptedEngine(tokenizer, []))
    assert out.sample.reward == 0.0 and out.sample.action_ranges == []
    assert out.sample.observation_tokens == tokenizer.encode(
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out.sample.extra_logs["agent_program_no_model_calls"] == 1
    assert any(e["event"] == "agent_program_failed" and e["code"] == "no_model_calls" for e in logs)


def test_concurrent_episodes_are_isolated_and_one_failing_costs_nothing_else(tokenizer: HFTokenizer) -> None:
    async def flaky(client: Any, task: ProgramTask) -> str | None:
        if "13" in task.question:
            raise ValueError("this one breaks")
        return await calculator_agent(client, task)

    executor = AgentExecutor(program_recipe(flaky))
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), delay_s=0.01)
    questions = {f"What is {a} * {b}?": str(a * b) for a, b in [(17, 23), (13, 7), (41, 59), (12, 12), (99, 3)]}

    async def all_at_once() -> list[Any]:
        return await asyncio.gather(
            *(executor.rollout(encode_task({"prompt": q, "answer": r}), r, engine) for q, r in questions.items())
        )

    outs = asyncio.run(all_at_once())
    for (question, result), out in zip(questions.items(), outs, strict=True):
        if "13" in question:
            assert out.trajectory.task["agent_program"]["code"] == "program_error"
            continue
        assert out.trajectory.final_answer == f"The answer is {result}."
        assert out.sample.reward == pytest.approx(1.1)
        assert question in tokenizer.decode(out.sample.observation_tokens)


def test_the_endpoint_refuses_another_episodes_key(tokenizer: HFTokenizer) -> None:
    async def borrows(client: Any, task: ProgramTask) -> str | None:
        intruder = client.with_options(api_key="episode-someone-else")
        await intruder.chat.completions.create(model=task.model, messages=task.messages, tools=[CALCULATOR_TOOL])
        return "never"

    out = rollout(program_recipe(borrows), ScriptedEngine(tokenizer, SCRIPT))
    program = out.trajectory.task["agent_program"]
    assert program["code"] == "program_error" and "AuthenticationError" in program["message"]
    assert out.sample.action_ranges == []


# -- the hf engine ---------------------------------------------------------------------------------------------


def test_on_the_hf_engine_a_program_gets_what_the_recipe_gets(tiny_hf_engine: Any) -> None:
    recipe = calculator_recipe(max_new_tokens=12)
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    direct = asyncio.run(AgentRuntime(tiny_hf_engine, recipe.make_session(), sampling=greedy).run(
        QUESTION, task={"answer": "391"}))  # fmt: skip
    program = dataclasses.replace(recipe, agent=AgentProgram(calculator_agent))
    out = asyncio.run(AgentExecutor(program).rollout(TASK, "391", tiny_hf_engine, sampling=greedy, with_logprobs=True))
    (segment,) = direct.trajectory.segments
    assert out.sample.observation_tokens == segment.ids
    assert out.sample.action_ranges == segment.action_ranges
    assert out.sample.rollout_log_probs == pytest.approx(
        [lp if m else 0.0 for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True)], abs=1e-4
    )
    assert out.sample.reward == direct.reward
