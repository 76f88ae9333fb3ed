"""`VLLMEngine` on the real vLLM (CPU build) against `HFEngine` on the same model: greedy ids equal token for
token, single and concurrent; logprobs within `LOGPROB_TOLERANCE`; seeds; stop tokens; `max_tokens`; the context
edge; and a prompt longer than the context, each as `LLMEngine`'s contract says.

`LOGPROB_TOLERANCE` is measured, not guessed: over these prompts the largest |vLLM - HF| logprob difference was
6.2e-6 in float32 (vLLM's CPU kernels and transformers' eager attention sum in different orders); the bound
leaves room for other CPUs' vector units without letting a wrong token's logprob (off by whole nats) pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.errors import ContextBudgetExceeded
from tests.vllm_cpu.conftest import CONTEXT, LoopThread

LOGPROB_TOLERANCE = 1e-3
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
PROMPTS = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "hi",
    "<|im_start|>system\nYou are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 2+2? Use the tool."
    "<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "The quick brown fox jumps over the lazy dog. " * 6,
]


def both(loop: LoopThread, vllm: Any, hf: Any, prompt: list[int], sampling: SamplingParams) -> list[Generation]:
    return [loop.run(engine.generate(prompt, sampling)) for engine in (vllm, hf)]


def logprob_gap(a: Generation, b: Generation) -> float:
    assert a.logprobs is not None and b.logprobs is not None
    return max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))


def test_vllm_reads_the_model_directory_as_hf_does(vllm_engine: Any, hf_engine: Any) -> None:
    assert vllm_engine.stop_token_ids == hf_engine.stop_token_ids == (151645, 151643)
    assert vllm_engine.context_length == hf_engine.context_length == CONTEXT
    assert vllm_engine.vocab_size == hf_engine.vocab_size == 151669


def test_greedy_ids_and_logprobs_equal_hf(loop: LoopThread, vllm_engine: Any, hf_engine: Any) -> None:
    gaps = []
    for text in PROMPTS:
        prompt = hf_engine.tokenize(text)
        vllm, hf = both(loop, vllm_engine, hf_engine, prompt, GREEDY)
        assert vllm.ids == hf.ids, f"prompt {text[:30]!r}"
        assert len(set(vllm.ids)) > 3, "the tiny model should not just repeat a token"
        assert (vllm.text, vllm.finish_reason) == (hf.text, hf.finish_reason) == (hf.text, "length")
        gaps.append(logprob_gap(vllm, hf))
    print(f"greedy: largest |vLLM - HF| logprob difference {max(gaps):.2e} over {len(PROMPTS)} x 24 tokens")
    assert max(gaps) <= LOGPROB_TOLERANCE


def test_concurrent_requests_equal_hf_alone(loop: LoopThread, vllm_engine: Any, hf_engine: Any) -> None:
    prompts = [hf_engine.tokenize(PROMPTS[i % len(PROMPTS)]) for i in range(8)]
    budgets = [24, 5, 17, 1, 9, 24, 3, 12]  # requests finish at different steps of vLLM's running batch
    alone = [loop.run(hf_engine.generate(p, GREEDY)) for p in prompts[: len(PROMPTS)]]

    async def together() -> list[Generation]:
        samplings = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in budgets]
        jobs = (vllm_engine.generate(p, s) for p, s in zip(prompts, samplings, strict=True))
        return list(await asyncio.gather(*jobs))

    for index, (joint, budget) in enumerate(zip(loop.run(together()), budgets, strict=True)):
        solo = alone[index % len(PROMPTS)]
        assert joint.ids == solo.ids[:budget], f"request {index}"
        assert joint.finish_reason == "length"
        assert joint.logprobs == pytest.approx(solo.logprobs[:budget], abs=LOGPROB_TOLERANCE)  # type: ignore[index]


def test_a_seed_reproduces_a_sample_and_its_logprobs_are_raw(
    loop: LoopThread, vllm_engine: Any, hf_engine: Any
) -> None:
    prompt = hf_engine.tokenize(PROMPTS[2])

    def sample(seed: int) -> Generation:
        return loop.run(vllm_engine.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0.8, seed=seed)))

    first = sample(5)
    assert sample(5).ids == first.ids
    assert sample(6).ids != first.ids
    # raw logprobs (before temperature), as the contract says: HF's log-softmax of the same ids, teacher-forced
    forced = loop.run(hf_engine.generate(prompt, SamplingParams(max_new_tokens=1, temperature=0.0)))
    assert forced.logprobs is not None and first.logprobs is not None
    if forced.ids[0] == first.ids[0]:
        assert first.logprobs[0] == pytest.approx(forced.logprobs[0], abs=LOGPROB_TOLERANCE)
    import torch

    with torch.inference_mode():
        logits = hf_engine.model(input_ids=torch.tensor([prompt + first.ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    for step, (token, logprob) in enumerate(zip(first.ids, first.logprobs, strict=True)):
        assert logprob == pytest.approx(float(expected[step, token]), abs=LOGPROB_TOLERANCE)


def test_a_stop_token_ends_the_generation_and_is_kept(loop: LoopThread, vllm_engine: Any, hf_engine: Any) -> None:
    prompt = hf_engine.tokenize(PROMPTS[0])
    free = loop.run(hf_engine.generate(prompt, GREEDY)).ids
    cut = next(i for i in range(3, len(free)) if free[i] not in free[:i])  # its first appearance
    stop = SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=(free[cut],))
    vllm, hf = both(loop, vllm_engine, hf_engine, prompt, stop)
    assert vllm.ids == hf.ids == free[: cut + 1]  # the stop token is returned, as vLLM returns it
    assert vllm.finish_reason == hf.finish_reason == "stop"


def test_max_tokens_and_the_context_edge_cap_the_generation(loop: LoopThread, vllm_engine: Any, hf_engine: Any) -> None:
    long = hf_engine.tokenize(PROMPTS[3] * 20)
    assert len(long) > CONTEXT
    one = SamplingParams(max_new_tokens=1, temperature=0.0)
    vllm, hf = both(loop, vllm_engine, hf_engine, long[:40], one)
    assert len(vllm.ids) == 1 and vllm.ids == hf.ids and vllm.finish_reason == "length"
    edge = long[: CONTEXT - 3]  # room for 3 tokens although 24 are asked
    vllm, hf = both(loop, vllm_engine, hf_engine, edge, GREEDY)
    assert len(vllm.ids) == 3 and vllm.ids == hf.ids
    assert vllm.finish_reason == hf.finish_reason == "length"


def test_a_prompt_that_fills_the_context_is_refused_and_the_engine_goes_on(
    loop: LoopThread, vllm_engine: Any, hf_engine: Any
) -> None:
    long = hf_engine.tokenize(PROMPTS[3] * 20)
    for prompt in (long[:CONTEXT], long):
        for engine in (vllm_engine, hf_engine):
            with pytest.raises(ContextBudgetExceeded, match="leaves no room"):
                loop.run(engine.generate(prompt, GREEDY))
    after = loop.run(vllm_engine.generate(hf_engine.tokenize(PROMPTS[1]), GREEDY))
    assert len(after.ids) == 24
