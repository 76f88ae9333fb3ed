"""The OpenRLHF executor driven by the real vLLM (CPU build) the way OpenRLHF's rollout actor drives it, and
OpenRLHF's experience-making code consuming what it returns.

The actor is OpenRLHF's own: `RolloutRayActor.generate` and `generate_responses` are taken from its Ray actor
class unchanged and bound to a stand-in holding what its `__init__` would have built (`llm`, vLLM's `AsyncLLM`,
here the session's engine's; the executor; no multimodal pad ids). So `execute` receives that actor as
`llm_engine`, calls `generate(prompt_token_ids, sampling_params, multi_modal_data=None)` and gets vLLM's real
`RequestOutput`. The reference is the same executor on `HFEngine` behind `LocalRolloutEngine`.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_train.openrlhf.executor import AgentExecutor
from agent_train.task import encode_task
from tests.agent_runtime.test_session import QUESTION
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import openrlhf_params
from tests.support.local_rollout_engine import LocalRolloutEngine
from tests.vllm_cpu.conftest import CONTEXT, LoopThread
from tests.vllm_cpu.test_engine import LOGPROB_TOLERANCE

TASK = encode_task({"prompt": QUESTION, "answer": "391"})


class RolloutActor:
    """OpenRLHF's `RolloutRayActor` after its `__init__`, with OpenRLHF's own `generate` and
    `generate_responses`."""

    def __init__(self, llm: Any, executor: AgentExecutor) -> None:
        from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

        actor_class = RolloutRayActor.__ray_metadata__.modified_class
        self.llm = llm
        self.executor = executor
        self._mm_pad_token_ids = None
        self.generate = actor_class.generate.__get__(self)
        self.generate_responses = actor_class.generate_responses.__get__(self)


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


VERSION_LOGS = ("policy_version_min", "policy_version_max", "staleness")


def assert_same_logs(on_vllm: dict[str, float], on_hf: dict[str, float]) -> None:
    """The executor's extra_logs on OpenRLHF's vLLM actor equal its logs on the hf stand-in but for the policy
    versions: the vLLM actor counts the weight syncs it loaded (none here: version 0, staleness 0), while the
    stand-in actor tracks none (-1.0, the logs' value for untracked)."""
    assert {k: v for k, v in on_vllm.items() if k not in VERSION_LOGS} == {
        k: v for k, v in on_hf.items() if k not in VERSION_LOGS
    }
    assert [on_vllm[key] for key in VERSION_LOGS] == [0.0, 0.0, 0.0]
    assert [on_hf[key] for key in VERSION_LOGS] == [-1.0, -1.0, -1.0]


def test_openrlhf_actor_on_vllm_returns_a_real_request_output(loop: LoopThread, vllm_engine: Any) -> None:
    from vllm.outputs import RequestOutput

    actor = RolloutActor(vllm_engine._engine, AgentExecutor(calculator_recipe()))
    prompt = vllm_engine.tokenize("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    params = openrlhf_params(logprobs=True, temperature=0.0)
    params.max_tokens = 6
    output = loop.run(actor.generate(prompt, params))
    assert isinstance(output, RequestOutput)
    (completion,) = output.outputs
    assert len(completion.token_ids) == 6 and len(completion.logprobs) == 6
    assert params.max_tokens == 6  # OpenRLHF's actor copies the params; the executor's turn params are its own


def test_the_executor_on_openrlhfs_vllm_actor_equals_it_on_hf(
    loop: LoopThread, vllm_engine: Any, hf_engine: Any, hf_tokenizer: Any
) -> None:
    from openrlhf.trainer.ppo_utils.experience import make_experience_batch
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    executor = AgentExecutor(calculator_recipe(max_new_tokens=16))
    actor = RolloutActor(vllm_engine._engine, executor)
    params = openrlhf_params(logprobs=True, temperature=0.0)
    samples = loop.run(actor.generate_responses(TASK, "391", params, CONTEXT, hf_tokenizer, num_samples=4))
    reference = loop.run(executor.execute(TASK, "391", params, CONTEXT, hf_tokenizer, LocalRolloutEngine(hf_engine)))

    assert len(samples) == 4
    for sample in samples:  # greedy: the four episodes, batched by vLLM, are one and the same
        assert sample["extra_logs"]["agent_turns"] >= 1
        assert sample["observation_tokens"] == reference["observation_tokens"]
        assert sample["action_ranges"] == reference["action_ranges"]
        assert sample["rollout_log_probs"] == pytest.approx(reference["rollout_log_probs"], abs=LOGPROB_TOLERANCE)
        assert (sample["reward"], sample["truncated"]) == (reference["reward"], reference["truncated"])
        assert_same_logs(sample["extra_logs"], reference["extra_logs"])
    (start, _), *_ = reference["action_ranges"]
    assert 0 < start < CONTEXT

    experiences = [SamplesGenerator._process_response_into_experience(None, s, max_len=CONTEXT) for s in samples]
    for sample, experience in zip(samples, experiences, strict=True):
        assert experience.sequences[0].tolist() == sample["observation_tokens"]
        mask = [0] * len(sample["observation_tokens"])
        for begin, end in sample["action_ranges"]:
            mask[begin:end] = [1] * (end - begin)
        assert experience.action_mask[0].tolist() == mask[1:]  # OpenRLHF shifts the mask onto targets
    batch = make_experience_batch(experiences)
    assert [float(r) for r in batch.rewards] == pytest.approx([s["reward"] for s in samples])
