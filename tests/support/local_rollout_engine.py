"""`LocalRolloutEngine`: OpenRLHF's rollout-engine contract, served in this process by any `LLMEngine`.

Inside OpenRLHF the executor talks to a vLLM Ray actor: ``await llm_engine.generate(prompt_token_ids,
sampling_params, multi_modal_data=None)`` with vLLM's own `SamplingParams`, answered by vLLM's own
`RequestOutput`. This class offers exactly that call on top of an `LLMEngine` (the `hf` engine on a CPU, the
scripted engine in tests), so the executor runs unchanged outside a cluster: the local trainer and the test suite
use it as a faithful stand-in for OpenRLHF's rollout engine. The objects it returns are vLLM's real classes
(`RequestOutput`, `CompletionOutput`, `Logprob`), not look-alikes.

The vLLM sampling settings it honours are the ones `LLMEngine` knows (`max_tokens`, `temperature`, `top_p`,
`top_k`, `seed`, `stop_token_ids`, `logprobs`); a request that needs anything else (several completions, stop
strings, penalties, `min_tokens` above 1) is refused with a `ValueError` rather than silently sampled differently.
The logprob of each position is the sampled token's, as vLLM reports it. This module imports vLLM.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput

from agent_runtime import Generation, LLMEngine, SamplingParams

__all__ = ["LocalRolloutEngine", "sampling_from_vllm"]


class LocalRolloutEngine:
    """Answers OpenRLHF-style `generate` calls with `engine`; counts the calls in `calls`."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.calls = 0

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling_params: Any, multi_modal_data: Any = None
    ) -> Any:
        if multi_modal_data:
            raise ValueError("LocalRolloutEngine serves text-only models; multi_modal_data is not supported")
        prompt = [int(i) for i in prompt_token_ids]
        sampling = sampling_from_vllm(sampling_params, room=self.engine.context_length - len(prompt))
        self.calls += 1
        generation = await self.engine.generate(prompt, sampling)
        return self._request_output(prompt, generation, sampling_params)

    def _request_output(self, prompt: list[int], generation: Generation, params: Any) -> Any:
        tokenizer = self.engine.tokenizer
        logprobs: list[dict[int, Any]] | None = None
        if params.logprobs is not None and generation.logprobs is not None:
            logprobs = [
                {token: Logprob(logprob=value, rank=None, decoded_token=tokenizer.decode([token]))}
                for token, value in zip(generation.ids, generation.logprobs, strict=True)
            ]
        stops = set(params.stop_token_ids or ())
        stopped_on = generation.ids[-1] if generation.ids and generation.finish_reason == "stop" else None
        completion = CompletionOutput(
            index=0,
            text=tokenizer.decode(generation.ids, skip_special_tokens=bool(params.skip_special_tokens)),
            token_ids=list(generation.ids),
            cumulative_logprob=sum(generation.logprobs) if logprobs is not None and generation.logprobs else None,
            logprobs=logprobs,
            finish_reason=generation.finish_reason,
            stop_reason=stopped_on if stopped_on in stops else None,  # vLLM: None for the model's own eos
        )
        return RequestOutput(
            request_id=uuid.uuid4().hex,
            prompt=None,
            prompt_token_ids=prompt,
            prompt_logprobs=None,
            outputs=[completion],
            finished=True,
        )


def sampling_from_vllm(params: Any, *, room: int) -> SamplingParams:
    """The `SamplingParams` equivalent of vLLM's `params`; `room` is what the context leaves (vLLM's meaning of
    ``max_tokens=None``). Raises `ValueError` for settings an `LLMEngine` cannot honour."""
    unsupported = {
        "n": (getattr(params, "n", 1), 1),
        "presence_penalty": (getattr(params, "presence_penalty", 0.0), 0.0),
        "frequency_penalty": (getattr(params, "frequency_penalty", 0.0), 0.0),
        "repetition_penalty": (getattr(params, "repetition_penalty", 1.0), 1.0),
        "min_p": (getattr(params, "min_p", 0.0), 0.0),
    }
    bad = [name for name, (value, default) in unsupported.items() if value != default]
    if getattr(params, "min_tokens", 0) > 1:
        bad.append("min_tokens")
    if getattr(params, "stop", None):
        bad.append("stop")
    if bad:
        raise ValueError(f"LocalRolloutEngine cannot honour these vLLM sampling settings: {', '.join(sorted(bad))}")
    max_tokens = params.max_tokens if params.max_tokens is not None else room
    return SamplingParams(
        max_new_tokens=max(1, int(max_tokens)),
        temperature=float(params.temperature),
        top_p=float(params.top_p),
        top_k=max(0, int(params.top_k or 0)),
        stop_token_ids=tuple(int(i) for i in (params.stop_token_ids or ())),
        seed=params.seed,
        logprobs=params.logprobs is not None,
    )
