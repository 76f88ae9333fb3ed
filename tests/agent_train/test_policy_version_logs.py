"""Policy versions through the training paths: the OpenRLHF executor's `extra_logs` report each episode's oldest and
newest version and its staleness (-1.0 when the engine tracks none), its records (`observation_tokens`,
`action_ranges`, `rollout_log_probs`: what OpenRLHF and the segment extension train) are the same whether a turn
was split by a weight update or not, and the local trainer's rollout records keep one version per token. The
engines are real: `ScriptedEngine` replaying real Qwen3 ids with versions, OpenRLHF's vLLM-shaped contract over
it (`LocalRolloutEngine`), and the hf engine on the tiny Qwen3 behind the local trainer's `LockstepEngine`."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, ScriptedEngine
from agent_train import extra_log_keys
from agent_train.local.lockstep import LockstepEngine
from agent_train.local.rollout import Rollouts, summary_ranges
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.openrlhf.segments import SEGMENTS_KEY, episode_record
from agent_train.sample import VERSION_KEYS, segment_samples
from agent_train.task import encode_task
from tests.agent_runtime.test_compaction import SUMMARY
from tests.agent_runtime.test_compaction import make as compacting_session
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import execute
from tests.support.local_rollout_engine import LocalRolloutEngine

if TYPE_CHECKING:
    from agent_runtime.engines.hf import HFEngine

TASK = encode_task({"prompt": QUESTION, "answer": "391"})


def test_extra_logs_report_the_versions_and_staleness_and_the_records_are_unchanged(tokenizer: HFTokenizer) -> None:
    script = [tokenizer.encode(call("17 * 23")), tokenizer.encode(answer("391"))]
    recipe = calculator_recipe()

    def rollout(versions: list[list[int]] | None) -> Any:
        engine = ScriptedEngine(tokenizer, script, logprob=-0.5, versions=versions or ())
        if versions is not None:
            engine.set_policy_version(5)
        return asyncio.run(AgentExecutor(recipe).rollout(TASK, "391", engine, with_logprobs=True))

    first, second = script
    split = rollout([[3] * 4 + [4] * (len(first) - 4), [4] * len(second)])
    plain = rollout(None)
    assert split.trajectory.policy_versions == [3, 4] and split.trajectory.staleness == 2
    logs = split.sample.extra_logs
    assert list(logs) == extra_log_keys(recipe.rewards)
    assert [logs[key] for key in VERSION_KEYS] == [3.0, 4.0, 2.0]
    assert [plain.sample.extra_logs[key] for key in VERSION_KEYS] == [-1.0, -1.0, -1.0]
    ours, theirs = split.sample.to_openrlhf(), plain.sample.to_openrlhf()
    for key in VERSION_KEYS:
        del ours["extra_logs"][key], theirs["extra_logs"][key]
    assert ours == theirs  # one action range per turn, the same ids and logprobs: OpenRLHF trains the same thing
    assert len(ours["action_ranges"]) == 2


def test_a_summary_turn_split_by_an_update_is_still_one_summary_and_the_segments_train_the_same(
    tokenizer: HFTokenizer,
) -> None:
    """A compacted episode whose summary turn an update split: the local trainer's summary range and the segment
    extension's records (every segment, `episode_record`) are the unsplit episode's."""
    script = [
        tokenizer.encode(call("17 * 23")),
        tokenizer.encode(f"{SUMMARY}<|im_end|>"),
        tokenizer.encode(answer("391")),
    ]
    tool, summary, last = (len(ids) for ids in script)

    def episode(versions: list[list[int]] | None) -> Any:
        engine = ScriptedEngine(tokenizer, script, logprob=-0.5, versions=versions or ())
        runtime = AgentRuntime(engine, compacting_session(tokenizer))
        return asyncio.run(runtime.run(QUESTION, task={"answer": "391"})).trajectory

    split = episode([[1] * tool, [1] * 5 + [2] * (summary - 5), [2] * last])
    plain = episode(None)
    assert split.compactions == plain.compactions == 1
    assert [s.version for s in split.segments[0].spans if s.kind == "action"] == [1, 1, 2]  # the summary split
    assert summary_ranges(split) == summary_ranges(plain) and summary_ranges(plain)[0] != []

    def records(trajectory: Any) -> dict[str, Any]:
        samples = segment_samples(
            trajectory, prompt=TASK, label="391", rewards=None, with_logprobs=True, truncated=False
        )
        record = dict(episode_record(samples))
        for item in [record, *record[SEGMENTS_KEY]]:
            for key in VERSION_KEYS:
                del item["extra_logs"][key]
        return record

    assert records(split) == records(plain)


def test_an_engine_without_versions_reports_minus_one_through_openrlhfs_contract(
    tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), answer("391")], policy_version=7)  # tags, but vLLM's
    out = execute(AgentExecutor(calculator_recipe()), LocalRolloutEngine(engine), hf_tokenizer)  # RequestOutput drops
    assert [out["extra_logs"][key] for key in VERSION_KEYS] == [-1.0, -1.0, -1.0]
    assert all(isinstance(out["extra_logs"][key], float) for key in VERSION_KEYS)


@pytest.fixture
def lockstep(tiny_hf_engine: HFEngine) -> Any:
    from agent_runtime.engines.hf import HFEngine

    engine = LockstepEngine(HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, context_length=1024))
    yield engine
    asyncio.run(engine.close())


def test_local_rollout_records_keep_one_version_per_token(lockstep: LockstepEngine) -> None:
    recipe = calculator_recipe(max_new_tokens=6)
    rows = [{"prompt": QUESTION, "answer": "391"}]
    rollouts = Rollouts(recipe, lockstep)
    before = asyncio.run(rollouts.collect(rows, group_size=2, seed=1))
    lockstep.set_policy_version(3)  # the trainer's update, through the lockstep engine to the hf engine
    assert lockstep.policy_version == lockstep.engine.policy_version == 3
    after = asyncio.run(rollouts.collect(rows, group_size=2, seed=1))
    for records, version in ((before, 0), (after, 3)):
        assert records
        for record in records:
            assert len(record.versions) == len(record.ids)
            assert record.versions == [version if mask else -1 for mask in record.loss_mask]
            assert record.trajectory is not None and record.trajectory.policy_versions == [version]
            assert record.extra_logs["staleness"] == 0.0 and record.extra_logs["policy_version_min"] == version
