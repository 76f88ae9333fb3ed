"""`CompactionPolicy`: the model summarizes, a new segment starts from the summary, the episode goes on.
`CompactableSession` is its deprecated spelling."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
from agent_protocol import HFTokenizer
from agent_runtime import (
    AgentRuntime,
    AgentSession,
    CompactableSession,
    CompactionEvent,
    CompactionPolicy,
    ScriptedEngine,
)
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.support.adding_policy import adding_policy
from tests.support.drop_tool_results import DropOldestToolResults

SUMMARY = "I computed 17 * 23 with the calculator: 391. Left to do: answer."


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def make(tokenizer: HFTokenizer, **policy: object) -> AgentSession:
    prompt_len = len(
        tokenizer.encode(
            AgentSession(
                protocol="qwen3", environment=FunctionCallEnvironment(tools=[CalculatorTool()])
            ).protocol.render_prompt([{"role": "user", "content": QUESTION}], tools=[CalculatorTool().spec])
        )
    )
    return AgentSession(
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()]),
        protocol="qwen3",
        rewards=RewardPipeline(result=[MatchingReward()]),
        tokenizer=tokenizer,
        max_new_tokens=64,
        context=CompactionPolicy(compact_at_tokens=prompt_len + 80, **policy),  # type: ignore[arg-type]
    )


def test_compaction_starts_a_new_segment_from_the_summary(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), f"{SUMMARY}<|im_end|>", answer("391")])
    session = make(tokenizer)
    runtime = AgentRuntime(engine, session)
    result = asyncio.run(runtime.run(QUESTION, task={"answer": "391"}, keep_events=True))

    assert result.final_answer == "391"
    assert result.trajectory.compactions == 1
    first, second = result.trajectory.segments
    # segment 1: the tool turn, then the summary turn, both trained
    assert len(first.action_ranges) == 2
    first_text = tokenizer.decode(first.ids)
    assert isinstance(session.context, CompactionPolicy) and session.context.instruction_text in first_text
    start, end = first.action_ranges[1]
    assert tokenizer.decode(first.ids[start:end]) == f"{SUMMARY}<|im_end|>"
    # segment 2: system/tools + the original task + the summary, then the answer
    second_prompt = tokenizer.decode(second.ids[: second.action_ranges[0][0]])
    assert QUESTION in second_prompt and SUMMARY in second_prompt and "<tools>" in second_prompt
    assert "<tool_response>" not in second_prompt  # the raw tool history is gone
    assert len(second.action_ranges) == 1
    # the engine was asked with the compacted context, not the long one
    assert engine.calls[2] == second.ids[: second.action_ranges[0][0]]
    events = [e for e in result.events if isinstance(e, CompactionEvent)]
    assert [e.summary for e in events] == [SUMMARY]
    assert result.reward == 1.0  # one episode reward, shared by both segments


def test_no_compaction_when_disabled(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), answer("391")])
    result = asyncio.run(AgentRuntime(engine, make(tokenizer, max_compactions=0)).run(QUESTION))
    assert result.trajectory.compactions == 0
    assert len(result.trajectory.segments) == 1
    assert result.final_answer == "391"


def test_empty_summary_ends_the_episode_cleanly(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), "<|im_end|>"])
    result = asyncio.run(AgentRuntime(engine, make(tokenizer)).run(QUESTION))
    assert result.stop_reason == "compaction_failed"
    assert len(result.trajectory.segments) == 1


def test_bad_resume_template_is_rejected() -> None:
    with pytest.raises(ValueError, match="summary"):
        CompactionPolicy(resume_template="no slot")


def test_compactable_session_is_a_deprecated_spelling_of_the_policy(tokenizer: HFTokenizer) -> None:
    with pytest.warns(DeprecationWarning, match=r"AgentSession\(\.\.\., context=CompactionPolicy"):
        old = CompactableSession(
            protocol="qwen3", environment=FunctionCallEnvironment(), compact_at_tokens=300, instruction="Sum up."
        )
    assert old.context == CompactionPolicy(compact_at_tokens=300, instruction_text="Sum up.")
    script = [call("17 * 23"), f"{SUMMARY}<|im_end|>", answer("391")]
    new = make(tokenizer)
    with pytest.warns(DeprecationWarning):
        same = CompactableSession(
            environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()]),
            protocol="qwen3",
            rewards=RewardPipeline(result=[MatchingReward()]),
            tokenizer=tokenizer,
            max_new_tokens=64,
            compact_at_tokens=new.context.compact_at_tokens,  # type: ignore[attr-defined]
        )
    new_run, old_run = (
        asyncio.run(AgentRuntime(ScriptedEngine(tokenizer, script), s).run(QUESTION, task={"answer": "391"}))
        for s in (new, same)
    )
    assert new_run.trajectory.segments == old_run.trajectory.segments and len(new_run.trajectory.segments) == 2
    assert new_run.trajectory.compactions == old_run.trajectory.compactions == 1


def test_the_readme_shows_the_policy_the_four_way_test_runs() -> None:
    """The agent-runtime README's policy of one's own is `tests/support/drop_tool_results.py`'s, line for line
    (comments aside), so what the README shows is what `tests/serve/test_context_policy_four_ways.py` proves."""

    def lines(text: str) -> list[str]:
        return [line.split("  #")[0].rstrip() for line in text.splitlines()]

    readme = lines((Path(__file__).resolve().parents[2] / "packages/agent-runtime/README.md").read_text("utf-8"))
    source = lines(inspect.getsource(DropOldestToolResults))
    assert any(readme[i : i + len(source)] == source for i in range(len(readme))), "the README's policy drifted"


def test_a_policy_of_ones_own_starts_a_new_segment_from_its_messages(tokenizer: HFTokenizer) -> None:
    """In process, with the scripted adder: two drops, three segments; the record keeps every tool result."""
    session = AgentSession(
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()]),
        protocol="qwen3",
        tokenizer=tokenizer,
        max_new_tokens=64,
        context=DropOldestToolResults(at_tokens=380),
    )
    engine = ScriptedEngine(tokenizer, policy=adding_policy(tokenizer))
    result = asyncio.run(AgentRuntime(engine, session).run("Add 111, 222, 333 and 444 with the calculator."))
    trajectory = result.trajectory
    assert result.final_answer == "The answer is 1110." and trajectory.compactions == len(trajectory.segments) - 1 >= 1
    assert [m.content for m in trajectory.messages if m.role == "tool"] == ["333", "666", "1110"]
    assert "<tool_response>\n333\n" not in tokenizer.decode(trajectory.segments[-1].ids)  # dropped from the context
