"""`OpenRLHFEngine` checks what OpenRLHF's rollout actor answers before it can reach a training sample.

The actor stand-in is `LocalRolloutEngine` (vLLM's real `RequestOutput` from real Qwen3 ids replayed by the
scripted engine); each fault rewrites one field of that real output, as a broken or hostile actor could. The
executor runs the episode end to end and must return a sample whose episode ended with the fault's code.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest
from vllm.logprobs import Logprob

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine
from agent_train.openrlhf.executor import AgentExecutor
from agent_train.task import encode_task
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.conftest import calculator_recipe
from tests.agent_train.test_executor import openrlhf_params
from tests.support.local_rollout_engine import LocalRolloutEngine

Rewrite = Callable[[Any], None]


def _oov(completion: Any) -> None:
    completion.token_ids = [*completion.token_ids[:-1], 10**9]


def _too_many(completion: Any) -> None:
    completion.token_ids = list(completion.token_ids) * 200
    completion.logprobs = None


def _bool_id(completion: Any) -> None:
    completion.token_ids = [True, *completion.token_ids[1:]]


def _nan_logprob(completion: Any) -> None:
    first = completion.token_ids[0]
    completion.logprobs[0] = {first: Logprob(logprob=math.nan, rank=None, decoded_token=None)}


def _error_finish(completion: Any) -> None:
    completion.finish_reason = "error"


def _unknown_finish(completion: Any) -> None:
    completion.finish_reason = "overheated"


FAULTS: dict[str, tuple[Rewrite, str]] = {
    "id_outside_vocabulary": (_oov, "engine_bad_output"),
    "more_ids_than_max_tokens": (_too_many, "engine_bad_output"),
    "bool_as_id": (_bool_id, "engine_bad_output"),
    "nan_logprob": (_nan_logprob, "engine_bad_output"),
    "unknown_finish_reason": (_unknown_finish, "engine_bad_output"),
    "vllm_error_finish": (_error_finish, "engine_error"),
}


class FaultyActor(LocalRolloutEngine):
    def __init__(self, engine: ScriptedEngine, rewrite: Rewrite | None) -> None:
        super().__init__(engine)
        self.rewrite = rewrite

    async def generate(self, prompt_token_ids: Any, sampling_params: Any, multi_modal_data: Any = None) -> Any:
        output = await super().generate(prompt_token_ids, sampling_params, multi_modal_data)
        if self.rewrite is not None:
            self.rewrite(output.outputs[0])
        return output


def _execute(tokenizer: HFTokenizer, hf_tokenizer: Any, rewrite: Rewrite | None) -> dict[str, Any]:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), answer("The answer is 391.")], logprob=-0.25)
    executor = AgentExecutor(calculator_recipe())
    task = encode_task({"prompt": QUESTION, "answer": "391"})
    params = openrlhf_params(logprobs=True)
    actor = FaultyActor(engine, rewrite)
    return asyncio.run(executor.execute(task, "391", params, 4096, hf_tokenizer, actor))


def test_an_honest_actor_passes_every_check(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    out = _execute(tokenizer, hf_tokenizer, None)
    assert out["reward"] > 0 and out["extra_logs"]["agent_errors"] == 0


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_actor_answer_ends_the_episode_with_a_code(tokenizer: HFTokenizer, hf_tokenizer: Any, fault: str) -> None:
    rewrite, code = FAULTS[fault]
    out = _execute(tokenizer, hf_tokenizer, rewrite)
    assert out["extra_logs"][f"agent_error_{code}"] == 1, out["extra_logs"]
    assert out["action_ranges"] == [], "nothing the actor answered reached the sample"
    assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size for i in out["observation_tokens"])
