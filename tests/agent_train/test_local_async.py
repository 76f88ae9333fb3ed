"""Asynchronous local RL (`agent_train.local.pipeline`, ``apps/train -- --async K``), for real: a tiny demo model, the
real `HFEngine` and lockstep engine, the recipe's episodes, OpenRLHF's IS correction in the loss.

- every action token carries the version of the weights that sampled it, and the weights are that version's;
- no step trains on an episode staler than K (the schedule bounds it; `fresh_records` drops what is older);
- ``rl_async=0`` (the pipeline on a second copy, no overlap) gives exactly the synchronous loop's records;
- the IS ratio is 1 where the versions are equal, and the correction masks or clips as OpenRLHF's `PolicyLoss`;
- a failure on the generating side surfaces as a `TrainError`, without hanging;
- the CLI's ``--async`` and the refusals (resume or pause inside asynchronous RL).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

torch = pytest.importorskip("torch")

from agent_demo.recipe import demo_rewards, make_recipe  # noqa: E402
from agent_demo.tokenizer import train_demo_tokenizer  # noqa: E402
from agent_env import FormatReward, RewardPipeline, ToolCallReward  # noqa: E402
from agent_protocol import HFTokenizer  # noqa: E402
from agent_runtime import read_trajectories  # noqa: E402
from agent_train.demo.model import build_demo_model  # noqa: E402
from agent_train.errors import TrainError  # noqa: E402
from agent_train.local.batch import pad_batch, token_logprobs, values_on_targets  # noqa: E402
from agent_train.local.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from agent_train.local.cli import build_parser  # noqa: E402
from agent_train.local.config import LocalTrainConfig, check_config  # noqa: E402
from agent_train.local.metrics import read_metrics  # noqa: E402
from agent_train.local.pipeline import RolloutPipeline, fresh_records, record_versions, snapshot  # noqa: E402
from agent_train.local.rl import is_coefficients, policy_loss  # noqa: E402
from agent_train.local.trainer import train_local  # noqa: E402
from tests.support.tiny_demo import TINY_DEMO_SPEC  # noqa: E402

RECIPE = make_recipe()
#: the demo with a format reward on top, so that a tiny, barely trained model's episodes differ in reward and the
#: updates are not all zero (the demo's own reward is 0 for every episode of such a model)
SHAPED = dataclasses.replace(
    RECIPE,
    rewards=RewardPipeline(
        result=list(demo_rewards().result.values()), process=[FormatReward(ok_reward=0.1), ToolCallReward()]
    ),
)
TINY = msgspec.structs.replace(
    LocalTrainConfig(),
    model=TINY_DEMO_SPEC,
    tokenizer_episodes=300,
    sft_episodes=40,
    sft_steps=4,
    sft_batch_size=4,
    rl_steps=4,
    rl_prompts=2,
    rl_group_size=4,
    rl_temperature=1.5,
    eval_size=4,
    eval_every=2,
    checkpoint_every=100,
)


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, HFTokenizer]:
    raw = train_demo_tokenizer(RECIPE.chat_protocol(), RECIPE.environment().tools, episodes=300)
    return build_demo_model(raw, TINY_DEMO_SPEC, seed=2), HFTokenizer(raw)


def _perturbed(model: Any, seed: int) -> dict[str, Any]:
    """The weights of `model` with noise added to every parameter (tied ones once), as a version's snapshot."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.5 * torch.randn(parameter.shape, generator=generator))
    return snapshot(other)


def test_every_action_token_carries_the_version_of_the_weights_that_sampled_it(tiny: tuple[Any, HFTokenizer]) -> None:
    model, tokenizer = tiny
    rows = list(RECIPE.rows("train"))[:2]
    v0 = snapshot(model)
    v1 = _perturbed(model, 1)

    async def run() -> list[Any]:
        pipeline = RolloutPipeline.on_copy(RECIPE, model, tokenizer, ahead=1, group_size=2, seed=5)
        try:
            pipeline.submit(0, rows, version=0, weights=v0)
            pipeline.submit(1, rows, version=0, weights=v0)
            first, second = await pipeline.next(), await pipeline.next()
            with pytest.raises(ValueError, match="at most 1 behind"):
                pipeline.submit(2, rows, version=0, weights=v0)  # 2 versions behind the batch's own
            pipeline.submit(2, rows, version=1, weights=v1)
            third = await pipeline.next()
            return [first, second, third, pipeline]
        finally:
            await pipeline.close()

    first, second, third, pipeline = asyncio.run(run())
    assert [b.index for b in (first, second, third)] == [0, 1, 2]
    assert [b.version for b in (first, second, third)] == [0, 0, 1]
    for batch in (first, second, third):
        for record in batch.records:
            spans = record.trajectory.segments[record.segment].spans
            actions = [s for s in spans if s.kind == "action"]
            assert actions and all(s.version == batch.version for s in actions)
            assert record_versions(record) == [batch.version] * sum(record.loss_mask)
    # the rollout copy holds version 1's weights now, and the trainer's model is untouched by the swap
    assert all(torch.equal(pipeline.model.state_dict()[k], v1[k]) for k in v1)
    assert all(torch.equal(model.state_dict()[k], v0[k]) for k in v0)
    # the same prompts and seed on other weights sample other tokens: the versions are the weights' own
    assert [r.ids for r in third.records] != [r.ids for r in first.records]
    assert [r.ids for r in second.records] != [r.ids for r in first.records]  # its own seed (batch 1)
    # OpenRLHF's IS ratio (training policy / rollout policy) of the model at version 0 on these tokens: 1 where the
    # tokens are version 0's (up to the float rounding of batched sampling), not 1 on version 1's
    for batch, same in ((first, True), (third, False)):
        tokens = pad_batch([r.ids for r in batch.records], [r.loss_mask for r in batch.records], pad_id=0)
        with torch.no_grad():
            trained = token_logprobs(model, tokens)
        rollout = values_on_targets([r.logprobs for r in batch.records], tokens.input_ids.shape[1])
        _, stats = is_coefficients(trained, rollout, tokens.target_mask)
        deviation = max(abs(stats["is_ratio_min"] - 1.0), abs(stats["is_ratio_max"] - 1.0))
        assert (deviation < 1e-3) is same, (batch.version, stats)


def test_a_failure_on_the_generating_side_is_an_error_not_a_hang(tiny: tuple[Any, HFTokenizer]) -> None:
    model, tokenizer = tiny
    rows = list(RECIPE.rows("train"))[:1]
    broken = {k: v for k, v in snapshot(model).items() if "lm_head" not in k and "norm" not in k}

    async def run() -> None:
        pipeline = RolloutPipeline.on_copy(RECIPE, model, tokenizer, ahead=1, group_size=2)
        try:
            pipeline.submit(0, rows, version=0, weights=broken)  # the weight swap fails inside the producer
            await asyncio.wait_for(pipeline.next(), timeout=60)
        finally:
            await pipeline.close()

    with pytest.raises(TrainError, match=r"(?s)rollout generation failed: RuntimeError: .*Missing key"):
        asyncio.run(run())

    async def closed() -> None:  # the engine closed under the producer: every episode lost, the batch fails
        pipeline = RolloutPipeline.on_copy(RECIPE, model, tokenizer, ahead=0, group_size=2)
        await pipeline.engine.close()
        try:
            pipeline.submit(0, rows, version=0, weights=snapshot(model))
            await asyncio.wait_for(pipeline.next(), timeout=60)
        finally:
            await pipeline.close()

    with pytest.raises(TrainError, match=r"batch 0: no episode generated a token \(engine_error: .*closed"):
        asyncio.run(closed())


def test_fresh_records_drop_whole_episodes_staler_than_the_bound(tiny: tuple[Any, HFTokenizer]) -> None:
    model, tokenizer = tiny
    rows = list(RECIPE.rows("train"))[:2]

    async def sample(version: int) -> list[Any]:
        pipeline = RolloutPipeline.on_copy(RECIPE, model, tokenizer, ahead=version, group_size=2)
        try:
            pipeline.submit(0, rows, version=0, weights=snapshot(model))
            return (await pipeline.next()).records
        finally:
            await pipeline.close()

    records = asyncio.run(sample(0))  # every token version 0
    kept, histogram, dropped = fresh_records(records, version=2, bound=2)
    assert kept == records and histogram == {2: 4} and dropped == 0
    kept, histogram, dropped = fresh_records(records, version=3, bound=2)
    assert kept == [] and histogram == {3: 4} and dropped == 4


def test_the_is_ratio_is_one_where_versions_agree_and_is_masked_or_clipped_outside_the_band() -> None:
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    rollout = old.clone()
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    coef, stats = is_coefficients(old, rollout, mask)
    assert torch.equal(coef, mask) and stats["is_ratio_mean"] == 1.0 and stats["is_filtered"] == 0.0
    assert stats["vllm_kl"] == 0.0
    # pi_train / pi_rollout of 0.25, 1.5 and 8 on the three trained tokens
    rollout = old - torch.log(torch.tensor([[1.0, 0.25, 1.5, 8.0]]))
    coef, stats = is_coefficients(old, rollout, mask, mode="mask")
    assert coef[0].tolist() == pytest.approx([0.0, 0.0, 1.5, 0.0])
    assert stats["is_filtered"] == pytest.approx(2 / 3) and stats["is_ratio_max"] == pytest.approx(8.0)
    coef, _ = is_coefficients(old, rollout, mask, mode="clip")
    assert coef[0].tolist() == pytest.approx([0.0, 0.5, 1.5, 5.0])
    # the loss weighs each token's surrogate by its coefficient: a masked token gives no gradient
    logprobs = old.clone().requires_grad_(True)
    loss, _ = policy_loss(
        logprobs, old, torch.tensor([1.0]), mask, token_weights=is_coefficients(old, rollout, mask)[0]
    )
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0, 1] == 0.0 and logprobs.grad[0, 3] == 0.0 and logprobs.grad[0, 2] != 0.0


def _rl_records(run_dir: Path) -> list[list[tuple[Any, ...]]]:
    """Per RL step, per episode as the trajectory log has it: its segments' ids, loss masks and logprobs, its
    reward and its advantage."""
    return [
        [
            (
                [(s.ids, s.loss_mask, s.logprobs) for s in episode.segments],
                episode.reward,
                episode.task["advantage"],
            )
            for episode in read_trajectories(path)
        ]
        for path in sorted((run_dir / "trajectories").glob("step_*.jsonl"))
    ]


def _assert_same_records(ours: list[list[tuple[Any, ...]]], theirs: list[list[tuple[Any, ...]]]) -> None:
    """The same episodes: the same ids, masks, rewards and advantages exactly, and logprobs up to float rounding.
    On one host the async-0 loop's logprobs came out bit for bit equal to the synchronous loop's; on another
    (2026-12-06, the same code) one episode's differed by 4.8e-7, its ids, masks and rewards equal."""

    def exact(records: list[list[tuple[Any, ...]]]) -> list[Any]:
        return [[([(ids, mask) for ids, mask, _ in segments], r, a) for segments, r, a in step] for step in records]

    def logprobs(records: list[list[tuple[Any, ...]]]) -> list[float]:
        return [lp or 0.0 for step in records for segments, _, _ in step for _, _, lps in segments for lp in lps or ()]

    assert exact(ours) == exact(theirs)
    assert logprobs(ours) == pytest.approx(logprobs(theirs), abs=1e-5)


def _numbers(run_dir: Path) -> list[dict[str, Any]]:
    timing = {"time_s", "generate_s", "update_s", "sample_s"}
    return [{k: v for k, v in r.items() if k not in timing} for r in read_metrics(run_dir / "metrics.jsonl")]


def test_async_0_is_the_synchronous_loop_and_async_1_trains_one_version_behind(tmp_path: Path) -> None:
    config = msgspec.structs.replace(TINY, seed=1)  # a seed whose tiny SFT model's episodes differ in reward
    sync = train_local(config, tmp_path / "sync", progress=False, recipe=SHAPED)
    zero = train_local(msgspec.structs.replace(config, rl_async=0), tmp_path / "zero", progress=False, recipe=SHAPED)
    assert zero.figures == sync.figures
    _assert_same_records(_rl_records(tmp_path / "zero"), _rl_records(tmp_path / "sync"))
    staleness = {"staleness_0", "staleness_mean", "staleness_max", "stale_dropped", "sampled_by"}
    assert [{k: v for k, v in r.items() if k not in staleness} for r in _numbers(tmp_path / "zero")] == _numbers(
        tmp_path / "sync"
    )

    assert sum(r["samples"] for r in _numbers(tmp_path / "sync") if r["kind"] == "rl") > 0  # the weights move
    # the synchronous loop's step j is sampled by the weights after j updates, and its records say so
    for run in ("sync", "zero"):
        steps = sorted((tmp_path / run / "trajectories").glob("step_*.jsonl"))
        versions = [{tuple(episode.policy_versions) for episode in read_trajectories(path)} for path in steps]
        assert versions == [{(step,)} for step in range(len(steps))], run
    one = train_local(msgspec.structs.replace(config, rl_async=1), tmp_path / "one", progress=False, recipe=SHAPED)
    assert one.finished and set(one.figures) == {"before", "after_sft", "after_rl"}
    steps = [r for r in read_metrics(tmp_path / "one" / "metrics.jsonl") if r["kind"] == "rl"]
    assert [r["sampled_by"] for r in steps] == [0, 0, 1, 2]  # batch j by version max(0, j - 1)
    assert [r["staleness_max"] for r in steps] == [0, 1, 1, 1] and all(r["stale_dropped"] == 0 for r in steps)
    assert one.staleness == {"0": 8, "1": 24, "dropped": 0}  # 8 episodes a step; what summary.json and the CLI give
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["rl_staleness"] == one.staleness
    updated = [r for r in steps if r["samples"] > 0]
    assert len(updated) >= 2 and all({"is_ratio_mean", "is_filtered", "vllm_kl"} <= set(r) for r in updated)
    # the first batch is the synchronous loop's (version 0, same prompts and seed: the same tokens, masks and
    # rewards; logprobs up to float rounding, sampled on a copy); batch 2, by version 1 rather than 2, is not
    _assert_same_records(_rl_records(tmp_path / "one")[:1], _rl_records(tmp_path / "sync")[:1])
    assert [ids for s, _, _ in _rl_records(tmp_path / "one")[2] for ids, _, _ in s] != [
        ids for s, _, _ in _rl_records(tmp_path / "sync")[2] for ids, _, _ in s
    ]
    again = train_local(msgspec.structs.replace(config, rl_async=1), tmp_path / "again", progress=False, recipe=SHAPED)
    assert again.figures == one.figures and _rl_records(tmp_path / "again") == _rl_records(tmp_path / "one")
    assert _numbers(tmp_path / "again") == _numbers(tmp_path / "one")  # seeded: the same run, bit for bit


def test_asynchronous_rl_refuses_to_pause_or_resume_inside_rl(tmp_path: Path) -> None:
    config = msgspec.structs.replace(TINY, rl_async=1)
    with pytest.raises(TrainError, match="inside asynchronous RL"):
        train_local(config, tmp_path / "a", progress=False, stop_after=6)
    # a checkpoint two steps into asynchronous RL (what a crash after a periodic checkpoint leaves)
    paused = train_local(TINY, tmp_path / "b", progress=False, stop_after=6)
    assert not paused.finished
    checkpoint = load_checkpoint(tmp_path / "b" / "checkpoint")
    assert checkpoint is not None and checkpoint.state.rl_step == 2
    checkpoint.state.config = config
    save_checkpoint(tmp_path / "b" / "checkpoint", model=checkpoint.model, tokenizer=checkpoint.tokenizer,
                    state=checkpoint.state, optimizer=None, rng=checkpoint.rng)  # fmt: skip
    with pytest.raises(TrainError, match="cannot resume in the middle of asynchronous RL"):
        train_local(config, tmp_path / "b", progress=False, resume=True)
    # paused at the end of SFT, it resumes into asynchronous RL
    assert not train_local(config, tmp_path / "c", progress=False, stop_after=4).finished
    assert train_local(config, tmp_path / "c", progress=False, resume=True).finished


def test_the_cli_and_the_config_check_the_async_options() -> None:
    parser = build_parser()
    args = parser.parse_args(["--async", "2", "--is-mode", "clip", "--branch-from", "runs/sync"])
    assert (args.rl_async, args.is_mode, args.branch_from) == (2, "clip", "runs/sync")
    assert "--async K" in parser.format_help() and "at most K versions stale" in " ".join(parser.format_help().split())
    with pytest.raises(ValueError, match="rl_async must be at least 0"):
        check_config(msgspec.structs.replace(TINY, rl_async=-1))
    with pytest.raises(ValueError, match="dynamic filtering"):
        check_config(msgspec.structs.replace(TINY, rl_async=1, rl_dynamic_filtering=True))
    with pytest.raises(ValueError, match="rl_is_bounds"):
        check_config(msgspec.structs.replace(TINY, rl_is_bounds=(1.5, 5.0)))
