"""A whole rollout batch survives its worst episode, in OpenRLHF and in the local trainer.

OpenRLHF's vLLM actor gathers `num_samples` executor calls with a bare `asyncio.gather` (`generate_responses`),
so one exception from one episode ends the training step. Here OpenRLHF's own `generate_responses` runs (taken
from its Ray actor class, unchanged) with our `AgentExecutor` and `LocalRolloutEngine` standing in for the vLLM
actor; the scripted engine replays real Qwen3 ids, among them a degenerate generation (a 1,500-deep tool call)
and a dead engine call. The local trainer's `Rollouts.collect` gets the same faults plus a row whose prompt
cannot be rendered. Each test prints what came back (``uv run pytest tests/agent_train/test_rollout_batch_boundary.py
-s``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_train.local.rollout import Rollouts
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.task import encode_task
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import openrlhf_params
from tests.support.local_rollout_engine import LocalRolloutEngine

DEGENERATE = "<tool_call>\n" + "[" * 1500 + "]" * 1500 + "\n</tool_call><|im_end|>"


class Faults:
    """A policy for ScriptedEngine: the n-th first-turn generation of the batch is degenerate, the m-th raises."""

    def __init__(self, tokenizer: HFTokenizer, *, degenerate_at: int, dead_at: int) -> None:
        self.tokenizer = tokenizer
        self.first_turns = 0
        self.degenerate_at = degenerate_at
        self.dead_at = dead_at

    def __call__(self, prompt: Sequence[int]) -> str | BaseException:
        text = self.tokenizer.decode(prompt)
        if "<tool_response>" in text:
            return answer("The answer is 391.")
        self.first_turns += 1
        if self.first_turns == self.degenerate_at:
            return DEGENERATE
        if self.first_turns == self.dead_at:
            return RuntimeError("the engine died mid-batch")
        return call("17 * 23")


class ActorStandIn(LocalRolloutEngine):
    """What `generate_responses` needs of `self`: the executor, and `generate` (it passes itself as the engine)."""

    def __init__(self, engine: ScriptedEngine, executor: AgentExecutor) -> None:
        super().__init__(engine)
        self.executor = executor


def test_openrlhf_generate_responses_keeps_every_sample(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    generate_responses = RolloutRayActor.__ray_metadata__.modified_class.generate_responses  # OpenRLHF's code
    engine = ScriptedEngine(tokenizer, policy=Faults(tokenizer, degenerate_at=3, dead_at=6))
    actor = ActorStandIn(engine, AgentExecutor(calculator_recipe()))
    prompt = encode_task({"prompt": QUESTION, "answer": "391"})
    samples = asyncio.run(
        generate_responses(
            actor, prompt, "391", openrlhf_params(logprobs=True), 4096, hf_tokenizer, num_samples=8, images=None
        )
    )

    logs = [s["extra_logs"] for s in samples]
    print(f"\nOpenRLHF's generate_responses, 8 samples with a degenerate and a dead one: {len(samples)} / 8 returned, "
          f"{sum(s['reward'] > 0 for s in samples)} scored > 0, "
          f"{sum(log['agent_error_engine_error'] for log in logs):.0f} with engine_error")  # fmt: skip
    assert len(samples) == 8
    assert sum(log["agent_error_engine_error"] for log in logs) == 1
    degenerate = [
        s for s in samples if s["extra_logs"]["agent_error_invalid_json"] or s["extra_logs"]["agent_error_unclosed_tag"]
    ]
    # the degenerate turn was answered with a parse error, stays in the sample to be trained on, and the episode
    # went on (this policy then calls the tool, as a recovering model would)
    assert len(degenerate) == 1 and len(degenerate[0]["action_ranges"]) >= 2
    assert sum(s["reward"] > 0 for s in samples) == 7  # all but the dead engine's episode


def test_local_rollouts_keep_every_episode_that_can_run(tokenizer: HFTokenizer) -> None:
    engine = ScriptedEngine(tokenizer, policy=Faults(tokenizer, degenerate_at=2, dead_at=4))
    rollouts = Rollouts(calculator_recipe(), engine, max_length=4096)
    rows: list[dict[str, Any]] = [
        {"prompt": QUESTION, "answer": "391"},
        {"prompt": [{"role": "robot", "content": "no chat format renders this"}], "answer": "1"},
        {"prompt": QUESTION, "answer": "391"},
    ]
    records = asyncio.run(rollouts.collect(rows, group_size=3, temperature=1.0, seed=0))
    kept = sum(r.group != 1 for r in records)
    print(f"\nthe local trainer's collect, 3 rows x 3 episodes, one row unrenderable: {kept} / 6 runnable episodes "
          f"kept, {sum(r.group == 1 for r in records)} of the unrenderable row; {sum(r.reward > 0 for r in records)} "
          f"scored > 0")  # fmt: skip

    assert sorted(r.group for r in records) == [0, 0, 0, 2, 2, 2]  # only the unrenderable row's episodes are lost
    assert sum(r.reward > 0 for r in records) == 5  # the degenerate episode recovers; the dead one scores 0
    assert sum(r.extra_logs["agent_error_engine_error"] for r in records) == 1
