"""AgentSession and AgentRuntime on exact multi-turn scenarios: the scripted engine replays real Qwen3 token ids,
the environment runs the real calculator tool, rewards are real strategies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline, ToolCallReward
from agent_protocol import HFTokenizer, get_protocol
from agent_runtime import (
    AgentRuntime,
    AgentSession,
    EngineError,
    ErrorEvent,
    FinalEvent,
    Generation,
    SamplingParams,
    ScriptedEngine,
    SessionStateError,
    ToolCallEvent,
    ToolResultEvent,
)

QUESTION = "What is 17 * 23?"


def call(expression: str, reasoning: str = "I should use the calculator.") -> str:
    payload = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<think>\n{reasoning}\n</think>\n\n<tool_call>\n{payload}\n</tool_call><|im_end|>"


def answer(text: str, reasoning: str = "The tool answered.") -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{text}<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def make_session(tokenizer: HFTokenizer, **kwargs: Any) -> AgentSession:
    return AgentSession(
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=kwargs.pop("max_steps", 6)),
        rewards=RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()]),
        tokenizer=tokenizer,
        **kwargs,
    )


def test_tool_call_then_answer_is_token_in_token_out(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), answer("The answer is 391.")], logprob=-0.5)
    runtime = AgentRuntime(engine, make_session(tokenizer))
    result = asyncio.run(runtime.run(QUESTION, task={"answer": "391"}, keep_events=True))

    assert result.final_answer == "The answer is 391."
    assert result.stop_reason == "final_answer"
    trajectory = result.trajectory
    (segment,) = trajectory.segments
    # The token stream is exactly the official render of the conversation the episode had.
    rendered = get_protocol("qwen3").render_messages(trajectory.messages, tools=[CalculatorTool().spec])
    assert tokenizer.decode(segment.ids) == rendered.removesuffix("\n")
    assert segment.ids == tokenizer.encode(rendered.removesuffix("\n"))
    # The prompt the engine saw for turn 2 is the transcript up to that point, nothing re-rendered.
    assert engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
    # Loss mask and logprobs cover exactly the generated ids.
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [
        tokenizer.encode(call("17 * 23")),
        tokenizer.encode(answer("The answer is 391.")),
    ]
    assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)
    assert all((lp == -0.5) == bool(m) for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True) if m)
    # The tool really ran.
    tool_messages = [m for m in trajectory.messages if m.role == "tool"]
    assert [m.content for m in tool_messages] == ["391"]
    assert result.reward > 0 and trajectory.breakdown is not None and trajectory.breakdown.result["matching"] == 1.0
    kinds = [type(e).__name__ for e in result.events]
    assert kinds == ["AssistantEvent", "ToolCallEvent", "ToolResultEvent", "AssistantEvent", "FinalEvent"]
    assert result.usage.completion_tokens == sum(segment.loss_mask)
    assert result.usage.prompt_tokens + result.usage.completion_tokens == len(segment.ids)


def test_malformed_call_is_answered_and_the_episode_goes_on(tokenizer: HFTokenizer) -> None:
    body = '{"name": "calculator", "arguments": {"expression": "1+1"}'  # one closing brace missing
    broken = f"<think>\nhmm\n</think>\n\n<tool_call>\n{body}\n</tool_call><|im_end|>"
    engine = ScriptedEngine(tokenizer, [broken, call("1 + 1"), answer("2")])
    result = asyncio.run(
        AgentRuntime(engine, make_session(tokenizer)).run("1+1?", task={"answer": "2"}, keep_events=True)
    )
    assert result.final_answer == "2"
    codes = [e.code for e in result.trajectory.errors]
    assert codes == ["invalid_json"]
    first_result = next(e for e in result.events if isinstance(e, ToolResultEvent))
    assert first_result.ok is False and first_result.code == "invalid_json"
    assert json.loads(first_result.content)["error"]["code"] == "invalid_json"
    assert result.trajectory.breakdown is not None
    assert result.trajectory.breakdown.process["tool_calls"] < 1.0  # the parse error was penalized


def test_unknown_tool_and_failing_expression_become_observations(tokenizer: HFTokenizer) -> None:
    wrong_tool = '<tool_call>\n{"name": "calculater", "arguments": {"expression": "1"}}\n</tool_call><|im_end|>'
    engine = ScriptedEngine(tokenizer, [wrong_tool, call("1 / 0"), answer("undefined")])
    result = asyncio.run(AgentRuntime(engine, make_session(tokenizer)).run("1/0?", keep_events=True))
    results = [e for e in result.events if isinstance(e, ToolResultEvent)]
    assert [r.code for r in results] == ["unknown_tool", "tool_error"]
    assert result.stop_reason == "final_answer"


def test_budget_ends_the_episode_and_never_overflows_the_context(tokenizer: HFTokenizer) -> None:
    session = make_session(tokenizer, max_new_tokens=64)
    prompt_len = len(
        tokenizer.encode(
            session.protocol.render_prompt([{"role": "user", "content": QUESTION}], tools=[CalculatorTool().spec])
        )
    )
    first = len(tokenizer.encode(call("17 * 23")))
    feedback = len(tokenizer.encode(session.protocol.render_feedback([{"role": "tool", "content": "391"}])))
    context = prompt_len + first + feedback + 5  # one call and its result fit; a second call does not
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), call("391 + 0"), answer("391")], context_length=context)
    result = asyncio.run(AgentRuntime(engine, session).run(QUESTION))
    assert result.stop_reason == "context_exhausted"
    assert result.final_answer is None
    for prompt in engine.calls:
        assert len(prompt) < context
    (segment,) = result.trajectory.segments
    assert len(segment.ids) <= context
    assert result.trajectory.turns >= 1  # what happened before the budget ran out is kept
    assert result.trajectory.errors[-1].code == "context_exhausted"


def test_long_prompt_ends_before_any_generation(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, [answer("x")], context_length=32)
    result = asyncio.run(AgentRuntime(engine, make_session(tokenizer)).run(QUESTION))
    assert result.stop_reason == "context_exhausted"
    assert engine.calls == []


def test_engine_failure_mid_episode_keeps_what_was_recorded(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), EngineError("GPU fell off the bus")])
    runtime = AgentRuntime(engine, make_session(tokenizer))
    result = asyncio.run(runtime.run(QUESTION, task={"answer": "391"}, keep_events=True))
    assert result.stop_reason == "engine_error"
    error = next(e for e in result.events if isinstance(e, ErrorEvent))
    assert "GPU fell off the bus" in error.message
    assert isinstance(result.events[-1], FinalEvent)
    assert result.trajectory.turns == 1
    assert len(result.trajectory.segments[0].action_ranges) == 1
    assert result.trajectory.breakdown is not None  # still scored, so a rollout gets a reward
    # and the runtime keeps serving
    engine2 = ScriptedEngine(tokenizer, [answer("391")])
    assert asyncio.run(AgentRuntime(engine2, make_session(tokenizer)).run(QUESTION)).final_answer == "391"


def test_hanging_engine_times_out(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, [answer("late")], delay_s=5.0)
    runtime = AgentRuntime(engine, make_session(tokenizer), engine_timeout_s=0.2)
    result = asyncio.run(runtime.run(QUESTION))
    assert result.stop_reason == "engine_timeout"


def test_turn_cut_off_by_the_length_limit_is_closed_by_the_feedback(tokenizer: HFTokenizer) -> None:
    long_call = call("17 * 23", reasoning="let me think " * 40)
    engine = ScriptedEngine(tokenizer, [long_call, answer("391")])
    session = make_session(tokenizer, max_new_tokens=20)
    result = asyncio.run(AgentRuntime(engine, session, sampling=SamplingParams(max_new_tokens=20)).run(QUESTION))
    segment = result.trajectory.segments[0]
    first_end = segment.action_ranges[0][1]
    assert first_end - segment.action_ranges[0][0] == 20
    assert tokenizer.decode(segment.ids[first_end : first_end + 2]).startswith("<|im_end|>\n")
    assert result.trajectory.errors[0].code == "missing_think_end"


def test_step_out_of_order_is_a_clear_error(tokenizer: HFTokenizer) -> None:
    session = make_session(tokenizer)
    gen = Generation(ids=tokenizer.encode("hi<|im_end|>"), text="hi", logprobs=None, finish_reason="stop")
    with pytest.raises(SessionStateError, match="reset"):
        asyncio.run(session.step(gen))


def test_fifty_concurrent_episodes_are_not_mixed_up(tokenizer: HFTokenizer) -> None:
    def policy(prompt_ids: list[int]) -> str:
        text = tokenizer.decode(prompt_ids)
        question = text.split("<|im_start|>user\nWhat is ")[1].split("?")[0]
        if "<tool_response>" not in text:
            return call(question)
        result = text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
        return answer(f"It is {result}.")

    engine = ScriptedEngine(tokenizer, policy=policy, delay_s=0.001)
    runtime = AgentRuntime(engine, make_session(tokenizer), max_concurrency=16)
    pairs = [(f"What is {a} * {a + 7}?", a * (a + 7)) for a in range(50)]
    results = asyncio.run(runtime.run_many([q for q, _ in pairs], tasks=[{"answer": str(v)} for _, v in pairs]))
    assert [r.final_answer for r in results] == [f"It is {v}." for _, v in pairs]
    assert len({r.trajectory.episode_id for r in results}) == 50
    assert all(r.reward > 0 for r in results)


def test_events_stream_live(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, [call("2 ** 10"), answer("1024")])

    async def collect() -> list[str]:
        seen = []
        async for event in AgentRuntime(engine, make_session(tokenizer)).stream("2**10?"):
            seen.append(type(event).__name__)
            if isinstance(event, ToolCallEvent):
                assert event.call.arguments == {"expression": "2 ** 10"}
        return seen

    assert asyncio.run(collect())[-1] == "FinalEvent"


@pytest.mark.parametrize(
    "script",
    [
        [call("17 * 23"), answer("The answer is 391.")],
        ["<tool_call>\n{not json\n</tool_call><|im_end|>", call("17 * 23"), answer("391")],
        [call("17 * 23"), EngineError("the engine fell over")],  # the episode ends on the engine's error
    ],
    ids=["answer", "parse_error", "engine_error"],
)
def test_a_run_that_keeps_no_events_records_the_same_episode(tokenizer: HFTokenizer, script: list[Any]) -> None:
    """`run()` builds step events only when it keeps them; the episode it records is the same either way."""
    results = []
    for keep in (True, False):
        runtime = AgentRuntime(ScriptedEngine(tokenizer, list(script)), make_session(tokenizer))
        results.append(asyncio.run(runtime.run(QUESTION, task={"answer": "391"}, keep_events=keep)))
    kept, bare = results
    assert bare.events == [] and isinstance(kept.events[-1], FinalEvent)
    assert (bare.final_answer, bare.stop_reason, bare.reward) == (kept.final_answer, kept.stop_reason, kept.reward)
    assert bare.trajectory.segments == kept.trajectory.segments
    assert bare.trajectory.errors == kept.trajectory.errors
    assert bare.usage == kept.usage
