"""The local trainer trains every segment of a compacted episode: one record per segment, exactly OpenRLHF's
segment rows (`agent_train.sample.segment_samples`) of the episode, each with the advantage of its episode
(computed over the groups of episodes, then given to every segment); the summary turns can be masked (the
ablation) and episodes the token budget ended are left out of the loss by default. An episode that never compacts
(the calculator demo) is one record, trained exactly as before.

The episodes are the scripted experts' through the recipes' own sessions (`ScriptedEngine`), so they compact where
the session's threshold says; a corrupted reference answer makes some of them earn nothing, so advantages differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from agent_demo import running_total
from agent_demo.expert import ExpertPolicy
from agent_demo.recipe import make_recipe as calculator_recipe
from agent_demo.running_total_expert import RunningTotalExpert, train_running_total_tokenizer
from agent_demo.tokenizer import train_demo_tokenizer
from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, Recipe, ScriptedEngine
from agent_train.local.config import ESTIMATORS
from agent_train.local.rl import episode_advantages, group_advantages, trained_records
from agent_train.local.rollout import RolloutRecord, Rollouts
from agent_train.sample import segment_samples
from tests.support.loss_masks import loss_mask_from_ranges


def _rows(
    recipe: Recipe, count: int, keep: Callable[[dict[str, Any]], bool] = lambda row: True
) -> list[dict[str, Any]]:
    """The first `count` training rows that `keep`; every other one with a wrong reference (and ``wrong`` set), so
    the expert earns 0 on it."""
    rows = [dict(row) for row in recipe.rows("train") if keep(row)][:count]
    for row in rows[1::2]:
        row["answer"], row["wrong"] = str(int(row["answer"]) + 1), True
    return rows


def _collect(recipe: Recipe, engine: ScriptedEngine, rows: list[dict[str, Any]]) -> list[RolloutRecord]:
    return asyncio.run(Rollouts(recipe, engine).collect(rows, group_size=2, seed=5))


@pytest.fixture(scope="module")
def compacting() -> tuple[Recipe, ScriptedEngine]:
    recipe = running_total.make_recipe()
    protocol = recipe.chat_protocol()
    tokenizer = HFTokenizer(train_running_total_tokenizer(protocol, recipe.environment().tools, episodes=300))
    engine = ScriptedEngine(tokenizer, policy=RunningTotalExpert(tokenizer, protocol), logprob=-0.5)
    return recipe, engine


def test_a_compacted_episode_is_one_record_per_segment_each_with_its_episodes_advantage(
    compacting: tuple[Recipe, ScriptedEngine],
) -> None:
    recipe, engine = compacting
    rows = _rows(recipe, 4, lambda row: row["count"] >= 8)  # long lists: they compact
    records = _collect(recipe, engine, rows)
    by_episode: dict[int, list[RolloutRecord]] = {}
    for record in records:
        by_episode.setdefault(record.episode, []).append(record)
    assert sorted(by_episode) == list(range(2 * len(rows)))

    # the same episodes through the runtime: each record is the executor's segment row, in order
    runtime = AgentRuntime(engine, recipe.make_session(engine.tokenizer), sampling=recipe.sampling)
    for segments in by_episode.values():
        row = rows[segments[0].group]
        trajectory = asyncio.run(runtime.run(row["prompt"], task=row)).trajectory
        assert trajectory.compactions >= 2 and [r.segment for r in segments] == list(range(len(trajectory.segments)))
        expected = segment_samples(trajectory, prompt=row["prompt"], label=None, rewards=recipe.rewards,
                                   with_logprobs=True, truncated=False)  # fmt: skip
        for record, sample in zip(segments, expected, strict=True):
            assert record.ids == sample.observation_tokens
            assert record.loss_mask == loss_mask_from_ranges(len(record.ids), sample.action_ranges)
            assert record.logprobs == sample.rollout_log_probs
            assert record.reward == trajectory.reward == (0.0 if row.get("wrong") else 1.0)
        # every segment but the last ends with its summary turn: the last action, the summary's text
        for record in segments[:-1]:
            assert record.summary_ranges == [sample_ranges(record)[-1]]
            start, end = record.summary_ranges[0]
            assert engine.tokenizer.decode(record.ids[start:end]).startswith("Total ")
        assert segments[-1].summary_ranges == []

    for estimator in ESTIMATORS:
        advantages = episode_advantages(records, estimator)  # type: ignore[arg-type]
        for episode in by_episode:
            values = {a for a, r in zip(advantages, records, strict=True) if r.episode == episode}
            assert len(values) == 1, (estimator, episode, values)  # broadcast: one advantage per episode
        per_episode = [next(a for a, r in zip(advantages, records, strict=True) if r.episode == e) for e in by_episode]
        expected_adv = group_advantages(
            [by_episode[e][0].reward for e in by_episode],
            [by_episode[e][0].group for e in by_episode],
            estimator,  # type: ignore[arg-type]
            token_counts=[sum(sum(r.loss_mask) for r in by_episode[e]) for e in by_episode],
        )
        assert per_episode == pytest.approx(expected_adv)
    grpo = episode_advantages(records, "grpo")
    assert {round(a, 3) for a in grpo} == {0.0}  # each group's two episodes earned the same: no signal
    reinforce = episode_advantages(records, "reinforce")
    assert len({round(a, 6) for a in reinforce}) == 2  # solved and unsolved episodes, every segment alike

    # the ablation masks the summary turns' tokens, and only those
    kept, _ = trained_records(records, reinforce, mask_summaries=True)
    assert len(kept) == len(records)
    for before, after in zip(records, kept, strict=True):
        summary_tokens = sum(end - start for start, end in before.summary_ranges)
        assert sum(after.loss_mask) == sum(before.loss_mask) - summary_tokens
        assert all(after.loss_mask[i] == 0 for start, end in before.summary_ranges for i in range(start, end))


def sample_ranges(record: RolloutRecord) -> list[tuple[int, int]]:
    """The half-open action ranges of a record's loss mask."""
    ranges: list[tuple[int, int]] = []
    start = None
    for index, value in enumerate([*record.loss_mask, 0]):
        if value and start is None:
            start = index
        elif not value and start is not None:
            ranges.append((start, index))
            start = None
    return ranges


def test_episodes_the_budget_ended_are_left_out_of_the_loss_unless_asked(
    compacting: tuple[Recipe, ScriptedEngine],
) -> None:
    recipe, engine = compacting
    plain = running_total.make_recipe(compaction=False)  # no compaction: a long list runs out of context
    rows = _rows(recipe, 2, lambda row: row["count"] >= 8)
    records = _collect(plain, engine, rows)
    assert records and all(r.overlong and r.stop_reason == "context_exhausted" for r in records)
    advantages = episode_advantages(records, "reinforce")
    assert trained_records(records, advantages) == ([], [])  # mask_overlong is on by default
    kept, kept_advantages = trained_records(records, advantages, mask_overlong=False)
    assert kept == records and kept_advantages == advantages


def test_the_calculator_demo_trains_exactly_as_before() -> None:
    """No compaction: one record per episode (segment 0, nothing masked), and its advantage is what the trainer
    computed before segments existed: `group_advantages` over the records, weighted by their action tokens."""
    recipe = calculator_recipe()
    protocol = recipe.chat_protocol()
    tokenizer = HFTokenizer(train_demo_tokenizer(protocol, recipe.environment().tools, episodes=300))
    engine = ScriptedEngine(tokenizer, policy=ExpertPolicy(tokenizer, protocol), logprob=-0.25)
    rows = _rows(recipe, 6, lambda row: row["phrasing"] == "plain")
    records = _collect(recipe, engine, rows)
    assert [r.episode for r in records] == list(range(2 * len(rows)))
    assert all(r.segment == 0 and r.summary_ranges == [] and not r.overlong for r in records)
    runtime = AgentRuntime(engine, recipe.make_session(tokenizer), sampling=recipe.sampling)
    for record in records:
        row = rows[record.group]
        trajectory = asyncio.run(runtime.run(row["prompt"], task=row)).trajectory
        segment = trajectory.last_segment  # what the trainer trained before: the one segment, as recorded
        assert record.ids == segment.ids and record.loss_mask == segment.loss_mask
        assert record.logprobs == [0.0 if lp is None else lp for lp in segment.logprobs]
        assert record.reward == trajectory.reward
    assert {r.reward for r in records} == {0.0, 1.0}
    for estimator in ESTIMATORS:
        before = group_advantages(
            [r.reward for r in records],
            [r.group for r in records],
            estimator,  # type: ignore[arg-type]
            token_counts=[sum(r.loss_mask) for r in records],
        )
        assert episode_advantages(records, estimator) == pytest.approx(before, abs=0)  # type: ignore[arg-type]
        trained, advantages = trained_records(records, before)  # the defaults mask nothing here
        assert trained == records and advantages == before
    for mask_summaries in (False, True):
        assert trained_records(records, [1.0] * len(records), mask_summaries=mask_summaries)[0] == records


def test_segments_of_one_episode_must_agree() -> None:
    one = RolloutRecord(group=0, ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0], reward=1.0, truncated=False)
    other = msgspec.structs.replace(one, reward=0.0, segment=1)
    with pytest.raises(ValueError, match="disagree"):
        episode_advantages([one, other], "grpo")
