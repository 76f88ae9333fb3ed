"""The local trainer's RL rollouts run the recipe through `AgentRuntime` and train from trajectory segments; the
records are exactly what OpenRLHF's contract (`AgentExecutor.execute` over `LocalRolloutEngine`, vLLM's own
classes) gives for the same episodes and seeds (tokens, action-range masks, rewards, logprobs), and the logprobs
are what the trainer's own forward pass computes for the same tokens."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from agent_demo.recipe import make_recipe  # noqa: E402
from agent_demo.tokenizer import train_demo_tokenizer  # noqa: E402
from agent_protocol import HFTokenizer  # noqa: E402
from agent_runtime.engines.hf import HFEngine  # noqa: E402
from agent_train.demo.model import DemoModelSpec, build_demo_model  # noqa: E402
from agent_train.local.batch import pad_batch, token_logprobs  # noqa: E402
from agent_train.local.rollout import Rollouts  # noqa: E402
from agent_train.openrlhf.executor import AgentExecutor  # noqa: E402
from agent_train.task import encode_task, label_of  # noqa: E402
from tests.support.local_rollout_engine import LocalRolloutEngine  # noqa: E402
from tests.support.loss_masks import loss_mask_from_ranges  # noqa: E402

RECIPE = make_recipe()
SMALL = DemoModelSpec(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2, head_dim=32,
                      initializer_range=0.2)  # fmt: skip


def test_rollouts_are_the_executors_records_with_the_engines_logprobs() -> None:
    from vllm import SamplingParams as VLLMSamplingParams

    raw = train_demo_tokenizer(RECIPE.chat_protocol(), RECIPE.environment().tools, episodes=300)
    model = build_demo_model(raw, SMALL, seed=3)
    # one request at a time: the same prompt and seed then give the same floats on both paths
    engine = HFEngine(model, HFTokenizer(raw), context_length=512, max_batch_size=1)
    rows = list(RECIPE.rows("train"))[:3]
    rollouts = Rollouts(RECIPE, engine)
    records = asyncio.run(rollouts.collect(rows, group_size=4, temperature=1.0, seed=11))

    executor, actor = AgentExecutor(RECIPE), LocalRolloutEngine(engine)
    for index, record in enumerate(records):  # the same episode through OpenRLHF's contract and wire format
        row = rows[record.group]
        params = VLLMSamplingParams(temperature=1.0, top_p=1.0, max_tokens=RECIPE.max_new_tokens, logprobs=0,
                                    seed=11 * 100_003 + index)  # fmt: skip
        out = asyncio.run(
            executor.execute(encode_task(row), label_of(row), params, rollouts.max_length, engine.tokenizer, actor)
        )
        assert record.ids == [int(i) for i in out["observation_tokens"]]
        assert record.loss_mask == loss_mask_from_ranges(len(record.ids), out["action_ranges"])
        assert record.logprobs == pytest.approx([float(x) for x in out["rollout_log_probs"]], abs=1e-6)
        assert record.reward == float(out["reward"])
    assert actor.calls >= len(records)
    asyncio.run(engine.close())

    assert [r.group for r in records] == [0] * 4 + [1] * 4 + [2] * 4
    messages = [{"role": "user", "content": rows[0]["prompt"]}]
    prompt = HFTokenizer(raw).encode(RECIPE.chat_protocol().render_prompt(messages, tools=RECIPE.environment().tools))
    for record in records:
        assert len(record.ids) == len(record.loss_mask) == len(record.logprobs)
        assert record.reward == 0.0  # an untrained model solves nothing
        assert sum(record.loss_mask) > 0 and set(record.extra_logs) >= {"agent_turns", "agent_tool_calls"}
        assert all(lp == 0.0 for lp, m in zip(record.logprobs, record.loss_mask, strict=True) if not m)
    assert records[0].ids[: len(prompt)] == prompt and records[0].loss_mask[: len(prompt)] == [0] * len(prompt)

    batch = pad_batch([r.ids for r in records], [r.loss_mask for r in records], pad_id=0)
    with torch.no_grad():
        recomputed = token_logprobs(model, batch)
    for row, record in enumerate(records):
        for position, (logprob, mask) in enumerate(zip(record.logprobs, record.loss_mask, strict=True)):
            if mask:
                assert float(recomputed[row, position - 1]) == pytest.approx(logprob, abs=2e-3)
