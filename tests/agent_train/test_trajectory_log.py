"""`TrajectoryLog`: what the local trainer writes for the trajectory viewer, on a real compacted episode (the
session of `tests/agent_runtime/test_compaction.py`, the real Qwen3 tokenizer): an RL step's file holds every
sampled episode once, in episode order, with the loss masks and advantages the update took (a masked summary
reads masked, an episode the loss never saw reads all zeros), the transcript's ids and logprobs, and the viewer
reads it back as the step's, with the compaction's segment boundary and its summary marked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

pytest.importorskip("torch")

from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, ScriptedEngine, Trajectory, read_trajectories
from agent_runtime.serving import TrajectoryFiles
from agent_train.local.rl import trained_records
from agent_train.local.rollout import RolloutRecord, episode_records, summary_ranges
from agent_train.local.trajectory_log import TrajectoryLog
from tests.agent_runtime.test_compaction import SUMMARY
from tests.agent_runtime.test_compaction import make as compacting_session
from tests.agent_runtime.test_session import QUESTION, answer, call


@pytest.fixture(scope="module")
def compacted(tokenizer: HFTokenizer) -> Trajectory:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), f"{SUMMARY}<|im_end|>", answer("391")], logprob=-0.5)
    runtime = AgentRuntime(engine, compacting_session(tokenizer))
    trajectory = asyncio.run(runtime.run(QUESTION, task={"answer": "391"})).trajectory
    assert trajectory.compactions == 1 and len(trajectory.segments) == 2
    return trajectory


def test_an_rl_step_is_logged_as_the_update_took_it_and_the_viewer_shows_it(
    compacted: Trajectory, tokenizer: HFTokenizer, tmp_path: Path
) -> None:
    def records(group: int, episode: int) -> list[RolloutRecord]:
        return episode_records(
            compacted, group=group, episode=episode, truncated=False, logs={}, summaries=summary_ranges(compacted)
        )

    taken, left_out = records(0, 3), records(1, 1)
    trained, advantages = trained_records(taken, [0.5] * len(taken), mask_summaries=True)
    path = TrajectoryLog(tmp_path / "trajectories").rl_step(207, left_out + taken, trained, advantages)

    assert path == tmp_path / "trajectories" / "step_00207.jsonl"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no scratch file left beside it
    first, second = read_trajectories(path)
    assert [first.task["episode"], second.task["episode"]] == [1, 3]  # episode order, each once
    assert second.task == {"answer": "391", "step": 207, "group": 0, "episode": 3, "advantage": 0.5, "trained": True}
    assert first.task["trained"] is False and first.task["advantage"] is None
    for logged, original in zip(second.segments, compacted.segments, strict=True):
        assert logged.ids == original.ids and logged.logprobs == original.logprobs and logged.spans == original.spans
    assert [s.loss_mask for s in second.segments] == [r.loss_mask for r in trained]
    start, end = compacted.segments[0].action_ranges[-1]  # the summary turn: masked in the log, not in the transcript
    assert set(second.segments[0].loss_mask[start:end]) == {0} and set(compacted.segments[0].loss_mask[start:end]) == {
        1
    }
    assert all(set(s.loss_mask) == {0} for s in first.segments)  # never trained: nothing coloured as trained

    files = TrajectoryFiles(tmp_path / "trajectories", tokenizer=tokenizer)
    items = files.page(limit=10)["items"]
    assert [item.checkpoint for item in items] == ["step_00207.jsonl step 207"] * 2
    view = files.record(items[1].id)
    assert [s["loss_mask"] for s in view["segments"]] == [r.loss_mask for r in trained]
    assert view["segments"][0]["summary_range"] == [start, end] and view["segments"][1]["summary"] == SUMMARY


def test_evaluations_and_expert_episodes_are_named_by_their_checkpoint(compacted: Trajectory, tmp_path: Path) -> None:
    log = TrajectoryLog(tmp_path)
    assert log.evaluation(200, [compacted], label="after_sft").name == "eval_after_sft.jsonl"
    assert log.evaluation(50, [compacted]).name == "eval_step_00050.jsonl"
    (labelled,) = read_trajectories(tmp_path / "eval_after_sft.jsonl")
    (unlabelled,) = read_trajectories(tmp_path / "eval_step_00050.jsonl")
    assert labelled.task == {"answer": "391", "step": 200, "checkpoint": "after_sft"}
    assert unlabelled.task == {"answer": "391", "step": 50} and unlabelled.segments == compacted.segments
    log.expert([compacted, compacted], trained=[True, False])
    assert [t.task["trained"] for t in read_trajectories(tmp_path / "sft_expert.jsonl")] == [True, False]
    log.evaluation(200, [], label="after_sft")  # a file is replaced as a whole, never appended to
    assert list(read_trajectories(tmp_path / "eval_after_sft.jsonl")) == []


@pytest.mark.parametrize("name", ["", "../escape", ".hidden"])
def test_a_file_name_that_is_not_a_plain_name_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="plain name"):
        TrajectoryLog(tmp_path).write(name, [])


def test_an_rl_step_needs_an_advantage_per_trained_record_and_the_episodes_trajectories(
    compacted: Trajectory, tmp_path: Path
) -> None:
    records = episode_records(compacted, group=0, episode=0, truncated=False, logs={})
    with pytest.raises(ValueError, match="advantages"):
        TrajectoryLog(tmp_path).rl_step(1, records, records, [])
    bare = [msgspec.structs.replace(r, trajectory=None) for r in records]
    with pytest.raises(ValueError, match="no trajectory"):
        TrajectoryLog(tmp_path).rl_step(1, bare, bare, [0.0] * len(bare))
