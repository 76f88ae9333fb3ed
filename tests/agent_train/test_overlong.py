"""One definition of an "overlong" episode, `agent_train.sample.ended_by_budget`: it ran out of budget (its context,
its steps, or a last turn cut by the length limit) without answering. The OpenRLHF job (`RolloutSample.overlong`,
``agent_overlong`` on the executor's dict) and the local trainer (`RolloutRecord.overlong`) mask the same episodes;
before, the local trainer counted only ``context_exhausted``, so an episode that ran out of steps was masked by one
trainer and trained by the other.

The local trainer's record is read from the transcript record directly; it holds exactly what OpenRLHF's record of
the same segment holds (ids, the loss mask its action ranges give, the action logprobs).
"""

from __future__ import annotations

import pytest

from agent_protocol import Span, TranscriptRecord
from agent_runtime import Trajectory
from agent_runtime.outcomes import STOP_REASONS
from agent_train.local.rollout import episode_records
from agent_train.openrlhf.segments import OVERLONG_KEY, episode_record
from agent_train.sample import BUDGET_STOPS, SampleFields, ended_by_budget, sample_from_trajectory, segment_samples
from tests.support.loss_masks import loss_mask_from_ranges

SEGMENT = TranscriptRecord(
    ids=[5, 6, 7, 8, 9, 10],
    loss_mask=[0, 0, 1, 1, 0, 1],
    logprobs=[None, None, -0.5, None, None, -1.25],  # an action token the engine gave no logprob for reads 0.0
    spans=[
        Span(kind="prompt", start=0, end=2),
        Span(kind="action", start=2, end=4),
        Span(kind="observation", start=4, end=5),
        Span(kind="action", start=5, end=6),
    ],
)


def trajectory(stop_reason: str, final_answer: str | None = None) -> Trajectory:
    return Trajectory(
        episode_id="e",
        protocol="qwen3",
        messages=[],
        segments=[SEGMENT, SEGMENT],
        reward=0.5,
        final_answer=final_answer,
        stop_reason=stop_reason,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("stop_reason", "final_answer", "truncated", "overlong"),
    [
        ("context_exhausted", None, False, True),  # no room for a turn, a result, a summary
        ("max_steps", None, False, True),  # out of steps
        ("done", None, True, True),  # its last turn cut by the length limit
        ("final_answer", "42", False, False),
        ("final_answer", "42", True, False),  # an answer is never overlong, whatever budget it used
        ("done", None, False, False),
        ("compaction_failed", None, False, False),  # an empty summary: the policy's failure, trained as such
        ("engine_error", None, False, False),
    ],
)
def test_both_trainers_mask_the_episodes_that_ran_out_of_budget_without_answering(
    stop_reason: str, final_answer: str | None, truncated: bool, overlong: bool
) -> None:
    episode = trajectory(stop_reason, final_answer)
    assert ended_by_budget(episode, truncated=truncated) is overlong
    samples = segment_samples(episode, prompt="p", label=None, rewards=None, with_logprobs=True, truncated=truncated)
    assert [s.overlong for s in samples] == [overlong, overlong]
    assert episode_record(samples).get(OVERLONG_KEY, False) is overlong  # what the OpenRLHF job masks
    records = episode_records(episode, group=0, episode=0, truncated=truncated, logs={})
    assert [r.overlong for r in records] == [overlong, overlong]  # what the local trainer masks


def test_the_budget_stops_are_stop_reasons() -> None:
    assert set(BUDGET_STOPS) <= set(STOP_REASONS)


def test_a_local_record_is_the_transcript_record_and_what_openrlhf_gets_for_it() -> None:
    episode = trajectory("final_answer", "42")
    samples = segment_samples(episode, prompt="p", label=None, rewards=None, with_logprobs=True, truncated=False)
    records = episode_records(episode, group=3, episode=7, truncated=False, logs={"agent_turns": 2.0})
    for index, (record, sample) in enumerate(zip(records, samples, strict=True)):
        assert (record.group, record.episode, record.segment) == (3, 7, index)
        assert record.ids == SEGMENT.ids == sample.observation_tokens
        assert record.loss_mask == SEGMENT.loss_mask == loss_mask_from_ranges(len(record.ids), sample.action_ranges)
        assert record.logprobs == [0.0, 0.0, -0.5, 0.0, 0.0, -1.25] == sample.rollout_log_probs
        assert (record.reward, record.stop_reason, record.extra_logs) == (0.5, "final_answer", {"agent_turns": 2.0})


def test_the_openrlhf_record_of_an_episode_is_its_last_segments() -> None:
    episode = trajectory("final_answer", "42")
    fields: SampleFields = {"prompt": "p", "label": None, "rewards": None, "with_logprobs": True, "truncated": False}
    last = sample_from_trajectory(episode, **fields)
    assert last == segment_samples(episode, **fields)[-1]
    assert last.observation_tokens == episode.last_segment.ids
