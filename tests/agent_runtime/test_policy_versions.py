"""Policy versions in the record: every sampled token keeps the version of the weights that sampled it.

A real `HFEngine` on the tiny random Qwen3 (the real Qwen3 tokenizer) is updated between two turns of one episode,
and inside one generation (a forward hook on the model plays the trainer: it sets the new version between two
decode steps, as a weight broadcast lands between steps); a `ScriptedEngine` replays a turn whose versions change
mid-generation, and engines that answer bad versions. What is checked: the action spans carry the versions and
split exactly where they change, the ids, loss mask, logprobs and action ranges are what the unsplit run has, the
trajectory reports the versions and the staleness, and a record from before versions still reads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from agent_env import CalculatorTool, Environment, FunctionCallEnvironment, Observation, StepResult
from agent_protocol import Action, HFTokenizer, Span, TokenTranscript, TranscriptRecord
from agent_runtime import (
    AgentRuntime,
    AgentSession,
    EngineBadOutput,
    Generation,
    SamplingParams,
    ScriptedEngine,
    Trajectory,
    build_trajectory,
)
from agent_runtime.engines import validate_generation
from agent_runtime.trajectory import read_trajectories
from tests.support.calculator_episode import qwen3_answer as answer
from tests.support.calculator_episode import qwen3_call as call

if TYPE_CHECKING:
    from agent_runtime.engines.hf import HFEngine

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def calculator_session(tokenizer: HFTokenizer) -> AgentSession:
    return AgentSession(
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4),
        tokenizer=tokenizer,
    )


def action_spans(segment: TranscriptRecord) -> list[Span]:
    return [span for span in segment.spans if span.kind == "action"]


class UpdateAfterFirstTurn(Environment):
    """Two turns whatever the model says; after the first, the trainer's update lands (`engine`'s version + 1)."""

    def __init__(self, engine: Any) -> None:
        super().__init__(max_steps=2)
        self.engine = engine

    async def transition(self, action: Action) -> StepResult:
        if self.step_count == 1:
            self.engine.set_policy_version(self.engine.policy_version + 1)
            return StepResult(observations=(Observation(tool_call_id=None, name="user", content="Go on."),))
        return StepResult(done=True, final_answer=action.content, stop_reason="final_answer")


@pytest.fixture
def engine(tiny_hf_engine: HFEngine) -> Any:
    """An engine of its own on the tiny model (its version moves), with no stop ids: every turn is 8 tokens."""
    from agent_runtime.engines.hf import HFEngine

    own = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, stop_token_ids=())
    yield own
    asyncio.run(own.close())


def test_hf_engine_updated_between_two_turns_tags_each_turn_with_its_version(engine: HFEngine) -> None:
    assert engine.policy_version == 0  # the weights it was given
    engine.set_policy_version(4)
    session = AgentSession(protocol="qwen3", environment=lambda: UpdateAfterFirstTurn(engine))
    runtime = AgentRuntime(engine, session, sampling=GREEDY, max_context_tokens=2048)
    trajectory = asyncio.run(runtime.run("Count to three.")).trajectory
    assert trajectory.errors == [] and trajectory.turns == 2
    (segment,) = trajectory.segments
    assert [(s.end - s.start, s.version) for s in action_spans(segment)] == [(8, 4), (8, 5)]
    assert len(segment.action_ranges) == 2  # two turns, two ranges
    assert all(s.version is None for s in segment.spans if s.kind != "action")
    assert trajectory.policy_versions == [4, 5]
    assert trajectory.policy_version == 5
    assert trajectory.staleness == 1
    # the record keeps them through its wire format
    again = msgspec.json.decode(msgspec.json.encode(trajectory), type=Trajectory)
    assert again == trajectory and again.staleness == 1


def test_hf_engine_updated_inside_one_generation_splits_it_where_the_version_changed(engine: HFEngine) -> None:
    prompt = engine.tokenizer.encode("<|im_start|>user\nCount to three.<|im_end|>\n<|im_start|>assistant\n")
    before = asyncio.run(engine.generate(prompt, GREEDY))
    assert before.versions == [0] * 8
    forwards = 0

    def trainer(*_: Any) -> None:  # after the second forward pass (the prefill, one decode step): version 1
        nonlocal forwards
        forwards += 1
        if forwards == 2:
            engine.set_policy_version(1)

    hook = engine.model.model.register_forward_hook(trainer)  # the backbone runs once per pass on both heads' paths
    try:
        during = asyncio.run(engine.generate(prompt, GREEDY))
    finally:
        hook.remove()
    assert during.versions == [0, 0, 1, 1, 1, 1, 1, 1]  # the second pass began before the update: its token is 0
    assert during.ids == before.ids and during.logprobs == before.logprobs  # the weights did not change here

    split, whole = TokenTranscript(), TokenTranscript()
    for transcript, versions in ((split, during.versions), (whole, None)):
        transcript.append_prompt(prompt)
        transcript.append_action(during.ids, during.logprobs, versions=versions)
    start = len(prompt)
    assert split.spans[1:] == [
        Span(kind="action", start=start, end=start + 2, version=0),
        Span(kind="action", start=start + 2, end=start + 8, version=1),
    ]
    assert (split.ids, split.loss_mask, split.logprobs) == (whole.ids, whole.loss_mask, whole.logprobs)
    assert split.action_ranges == whole.action_ranges == [(start, start + 8)]


def test_scripted_versions_split_a_turn_exactly_at_the_change(tokenizer: HFTokenizer) -> None:
    first, second = tokenizer.encode(call("17 * 23")), tokenizer.encode(answer("391"))
    change = 5
    replayed = [[3] * change + [4] * (len(first) - change), [4] * len(second)]

    def run(versions: list[list[int]] | None) -> Trajectory:
        engine = ScriptedEngine(tokenizer, [first, second], logprob=-0.25, versions=versions or ())
        if versions is not None:
            engine.set_policy_version(6)
        return asyncio.run(AgentRuntime(engine, calculator_session(tokenizer)).run("What is 17 * 23?")).trajectory

    split, plain = run(replayed), run(None)
    (ours,), (theirs,) = split.segments, plain.segments
    assert (ours.ids, ours.loss_mask, ours.logprobs) == (theirs.ids, theirs.loss_mask, theirs.logprobs)
    assert ours.action_ranges == theirs.action_ranges and len(ours.action_ranges) == 2
    (a, b), (c, d) = theirs.action_ranges
    assert action_spans(ours) == [
        Span(kind="action", start=a, end=a + change, version=3),
        Span(kind="action", start=a + change, end=b, version=4),
        Span(kind="action", start=c, end=d, version=4),
    ]
    assert all(s.version is None for s in action_spans(theirs))
    assert (split.policy_versions, split.policy_version, split.staleness) == ([3, 4], 6, 3)
    assert (plain.policy_versions, plain.policy_version, plain.staleness) == ([], None, None)
    assert split.usage == plain.usage


def test_scripted_engine_tags_its_current_version_and_cuts_replayed_ones_with_the_ids(tokenizer: HFTokenizer) -> None:
    ids = tokenizer.encode(answer("391")) + tokenizer.encode("never sent")
    engine = ScriptedEngine(tokenizer, [ids, ids], versions=[list(range(len(ids)))], policy_version=2)
    first = asyncio.run(engine.generate([1, 2], SamplingParams()))  # cut at <|im_end|>, and its versions with it
    assert first.versions == list(range(len(first.ids))) and len(first.ids) < len(ids)
    second = asyncio.run(engine.generate([1, 2], SamplingParams()))
    assert second.versions == [2] * len(second.ids)
    with pytest.raises(ValueError, match="below the current 2"):
        engine.set_policy_version(1)


@pytest.mark.parametrize(
    ("versions", "why"),
    [
        (lambda n: [1] * (n - 1) + [0], "below the 1 before it"),
        (lambda n: [0] * (n - 1), "policy versions for"),
        (lambda n: [-1] * n, "not an int >= 0"),
        (lambda n: [True] * n, "not an int >= 0"),
    ],
    ids=["decreasing", "short", "negative", "bool"],
)
def test_bad_versions_from_an_engine_end_the_episode_as_engine_bad_output(
    tokenizer: HFTokenizer, versions: Any, why: str
) -> None:
    turn = tokenizer.encode(call("1 + 1"))
    engine = ScriptedEngine(tokenizer, [turn], versions=[versions(len(turn))])
    result = asyncio.run(AgentRuntime(engine, calculator_session(tokenizer)).run("1+1?"))
    (error,) = result.trajectory.errors
    assert error.code == "engine_bad_output" and why in error.message
    (segment,) = result.trajectory.segments
    assert segment.action_ranges == []  # nothing of the bad generation was recorded
    with pytest.raises(EngineBadOutput, match=why):
        validate_generation(
            "upstream", tokenizer, ids=turn, logprobs=None, finish_reason="stop", max_tokens=len(turn),
            vocab_size=None, versions=versions(len(turn)),
        )  # fmt: skip


def test_transcript_refuses_versions_that_do_not_fit_and_appends_nothing() -> None:
    transcript = TokenTranscript()
    transcript.append_prompt([1, 2])
    for versions, why in (([0], "1 policy versions for 2"), ([2, 1], "below the 2"), ([0, -3], "not an int")):
        with pytest.raises(ValueError, match=why):
            transcript.append_action([5, 6], [-0.1, -0.2], versions=versions)
        assert (transcript.ids, len(transcript.spans)) == ([1, 2], 1)
    span = transcript.append_action([], versions=[])  # an empty generation: one empty span, as without versions
    assert span == Span(kind="action", start=2, end=2)


def test_only_a_split_generation_is_one_action_range() -> None:
    """Adjacent action spans are one range only where a version change split one generation (the later span of a
    higher version); two generations appended back to back stay two, with versions or without."""
    transcript = TokenTranscript()
    transcript.append_prompt([1])
    transcript.append_action([2, 3, 4], versions=[0, 1, 1])  # split: (1, 2) v0, (2, 4) v1
    transcript.append_action([5], versions=[1])  # another generation, same version: its own range
    transcript.append_action([6])  # untracked, right after: its own range
    transcript.append_action([7])
    assert transcript.action_ranges == [(1, 4), (4, 5), (5, 6), (6, 7)]
    assert transcript.record().action_ranges == transcript.action_ranges


def test_a_record_from_before_versions_reads_and_an_untracked_one_writes_as_before(
    tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    engine = ScriptedEngine(tokenizer, [call("2 + 2"), answer("4")])
    trajectory = asyncio.run(AgentRuntime(engine, calculator_session(tokenizer)).run("2+2?")).trajectory
    stored = msgspec.json.decode(msgspec.json.encode(trajectory))
    assert all("version" not in span for segment in stored["segments"] for span in segment["spans"])
    del stored["policy_versions"], stored["policy_version"]  # what a record written before versions holds
    log = tmp_path / "old.jsonl"
    log.write_bytes(msgspec.json.encode(stored) + b"\n")
    (old,) = read_trajectories(log)
    assert old == trajectory
    assert (old.policy_versions, old.policy_version, old.staleness) == ([], None, None)
    rebuilt = build_trajectory(
        episode_id="e", protocol="qwen3", messages=[], segments=old.segments, generations=2, policy_version=3
    )
    assert rebuilt.staleness is None  # the engine has a version, the tokens have none: unknown, not 3


def test_generation_versions_default_to_untracked() -> None:
    generation = Generation(ids=[1], text="", logprobs=None, finish_reason="stop")
    assert generation.versions is None and ScriptedEngine.policy_version is None
