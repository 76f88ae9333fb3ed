"""HFEngine on the tiny random-weight Qwen3 model with the real Qwen3 tokenizer: greedy decoding against
transformers' own `generate`, logprobs against a teacher-forced forward pass, batching against running alone,
sampling rules, stop and length limits, and errors."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from agent_protocol import get_protocol
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.hf import HFEngine
from agent_runtime.errors import ContextBudgetExceeded, EngineError, EngineUnavailable
from tests.support.greedy_reference import greedy_reference

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
PROMPTS = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "hi",
    "<|im_start|>system\nYou are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 2+2? Use the tool."
    "<|im_end|>\n<|im_start|>assistant\n<think>\n",
]


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def prompt_ids(engine: HFEngine, index: int = 0) -> list[int]:
    return engine.tokenize(PROMPTS[index])


def teacher_forced_logits(engine: HFEngine, prompt: Sequence[int], ids: Sequence[int]) -> Any:
    """Logits that predicted each of `ids`, from one full forward pass without a KV cache."""
    full = torch.tensor([list(prompt) + list(ids)])
    with torch.inference_mode():
        logits = engine.model(input_ids=full).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)]


def test_loads_the_model_directory_with_its_eos_ids_and_context(tiny_hf_engine: HFEngine) -> None:
    assert tiny_hf_engine.stop_token_ids == (151645, 151643)  # generation_config.json, in its order
    assert tiny_hf_engine.context_length == 4096
    assert tiny_hf_engine.vocab_size == 151669
    assert tiny_hf_engine.tokenize("<|im_end|>") == [151645]


def test_greedy_matches_transformers_generate(tiny_hf_engine: HFEngine) -> None:
    engine = tiny_hf_engine
    for index in range(len(PROMPTS)):
        prompt = prompt_ids(engine, index)
        generation = run(engine.generate(prompt, GREEDY))
        assert generation.ids == greedy_reference(engine.model, prompt, 8)
        assert len(set(generation.ids)) > 1, "the tiny model should not just repeat one token"
        assert generation.finish_reason == "length"
        assert generation.text == engine.tokenizer.decode(generation.ids)


def test_logprobs_are_raw_log_softmax_of_the_sampled_tokens(tiny_hf_engine: HFEngine) -> None:
    engine = tiny_hf_engine
    prompt = prompt_ids(engine, 2)
    sampled = run(engine.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0.7, top_k=20, seed=3)))
    assert sampled.logprobs is not None and len(sampled.logprobs) == len(sampled.ids) == 6
    expected = torch.log_softmax(teacher_forced_logits(engine, prompt, sampled.ids), dim=-1)
    for step, (token, logprob) in enumerate(zip(sampled.ids, sampled.logprobs, strict=True)):
        # raw: before temperature and top-k, as vLLM's default logprobs_mode
        assert logprob == pytest.approx(float(expected[step, token]), abs=1e-4)
    without = run(engine.generate(prompt, SamplingParams(max_new_tokens=2, temperature=0.0, logprobs=False)))
    assert without.logprobs is None


def test_concurrent_requests_are_batched_and_match_running_alone(tiny_hf_engine: HFEngine) -> None:
    engine = tiny_hf_engine
    prompts = [prompt_ids(engine, i) for i in range(len(PROMPTS))]
    assert len({len(p) for p in prompts}) == len(prompts), "different lengths exercise the left padding"
    budgets = [8, 3, 6]  # rows finish at different steps
    alone = [run(engine.generate(p, GREEDY)) for p in prompts]

    async def together() -> list[Generation]:
        samplings = [SamplingParams(max_new_tokens=n, temperature=0.0) for n in budgets]
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, samplings, strict=True))))

    before = engine.batch_sizes[3]
    batched = run(together())
    assert engine.batch_sizes[3] == before + 1, f"expected one batch of three, saw {dict(engine.batch_sizes)}"
    for solo, joint, budget in zip(alone, batched, budgets, strict=True):
        assert joint.ids == solo.ids[:budget]
        assert joint.logprobs == pytest.approx(solo.logprobs[:budget], abs=1e-4)  # type: ignore[index]
        assert joint.finish_reason == "length"


def test_a_seed_reproduces_a_sample_and_different_seeds_differ(tiny_hf_engine: HFEngine) -> None:
    engine = tiny_hf_engine
    prompt = prompt_ids(engine)

    def sample(seed: int) -> list[int]:
        return run(engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=1.0, seed=seed))).ids

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first
    greedy = run(engine.generate(prompt, GREEDY)).ids
    assert first != greedy


def test_top_k_and_top_p_restrict_every_draw(tiny_hf_engine: HFEngine) -> None:
    engine = tiny_hf_engine
    prompt = prompt_ids(engine, 1)
    greedy = run(engine.generate(prompt, GREEDY)).ids
    top1 = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=1, seed=1)
    assert run(engine.generate(prompt, top1)).ids == greedy
    tiny_p = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=1)
    assert run(engine.generate(prompt, tiny_p)).ids == greedy

    for seed in range(3):
        top_k = SamplingParams(max_new_tokens=6, temperature=2.0, top_k=3, seed=seed)
        ids = run(engine.generate(prompt, top_k)).ids
        logits = teacher_forced_logits(engine, prompt, ids)
        for step, token in enumerate(ids):
            assert token in torch.topk(logits[step], 3).indices.tolist()

        top_p = SamplingParams(max_new_tokens=6, temperature=2.0, top_p=0.05, seed=seed)
        ids = run(engine.generate(prompt, top_p)).ids
        logits = teacher_forced_logits(engine, prompt, ids)
        for step, token in enumerate(ids):
            probs, order = torch.sort(torch.softmax(logits[step] / 2.0, dim=-1), descending=True)
            nucleus = order[: int((probs.cumsum(0) < 0.05).sum()) + 1].tolist()  # smallest set reaching 0.05
            assert token in nucleus


def test_a_stop_token_ends_the_generation_and_is_kept(tiny_hf_engine: HFEngine) -> None:
    engine = tiny_hf_engine
    prompt = prompt_ids(engine)
    greedy = run(engine.generate(prompt, GREEDY)).ids
    stop = greedy[2]
    expected = greedy[: greedy.index(stop) + 1]
    stopped = run(engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,))))
    assert stopped.ids == expected
    assert stopped.finish_reason == "stop"
    assert stopped.logprobs is not None and len(stopped.logprobs) == len(expected)


def test_the_context_length_bounds_prompt_and_completion(tiny_hf_engine: HFEngine) -> None:
    engine = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, context_length=32)
    try:
        with pytest.raises(ContextBudgetExceeded, match="32-token context"):
            run(engine.generate(list(range(100, 132)), GREEDY))
        clamped = run(engine.generate(list(range(100, 129)), SamplingParams(max_new_tokens=10, temperature=0.0)))
        assert len(clamped.ids) == 3
        assert clamped.finish_reason == "length"
    finally:
        run(engine.close())


@pytest.mark.parametrize(
    ("prompt", "sampling", "message"),
    [
        ([], GREEDY, "empty"),
        ([1, 151669], GREEDY, "outside the model's vocabulary"),
        ([1, -1], GREEDY, "outside the model's vocabulary"),
    ],
    ids=["empty", "id_too_large", "negative_id"],
)
def test_bad_requests_are_rejected_before_they_reach_the_model(
    tiny_hf_engine: HFEngine, prompt: list[int], sampling: SamplingParams, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        run(tiny_hf_engine.generate(prompt, sampling))


@pytest.mark.parametrize(
    ("options", "message"),
    [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -0.5}, "temperature"), ({"top_p": 0.0}, "top_p")],
    ids=["no_tokens", "negative_temperature", "zero_top_p"],
)
def test_bad_sampling_params_are_rejected_for_every_engine(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**options)


class PoisonedModel(torch.nn.Module):
    """The real tiny model, except that a forward pass over the `poison` id raises, as a CUDA error would."""

    def __init__(self, model: Any, poison: int) -> None:
        super().__init__()
        self.inner = model
        self.poison = poison
        self.config = model.config
        self.generation_config = model.generation_config

    def get_input_embeddings(self) -> Any:
        return self.inner.get_input_embeddings()

    def forward(self, input_ids: Any, **kwargs: Any) -> Any:
        if bool((input_ids == self.poison).any()):
            raise RuntimeError("device-side assert triggered")
        return self.inner(input_ids=input_ids, **kwargs)


def test_a_model_failure_is_an_engine_error_and_spares_its_batch_neighbours(tiny_hf_engine: HFEngine) -> None:
    poison = 4242
    engine = HFEngine(PoisonedModel(tiny_hf_engine.model, poison), tiny_hf_engine.tokenizer, batch_wait_s=0.05)
    good = [prompt_ids(tiny_hf_engine, 0), prompt_ids(tiny_hf_engine, 1)]
    expected = [run(tiny_hf_engine.generate(p, GREEDY)).ids for p in good]

    async def together() -> list[Generation | BaseException]:
        requests = [engine.generate(good[0], GREEDY), engine.generate([1, poison, 2], GREEDY)]
        requests.append(engine.generate(good[1], GREEDY))
        return list(await asyncio.gather(*requests, return_exceptions=True))

    try:
        first, failed, second = run(together())
        assert isinstance(failed, EngineError)
        assert "device-side assert triggered" in str(failed)
        assert isinstance(failed.__cause__, RuntimeError)
        assert isinstance(first, Generation) and first.ids == expected[0]
        assert isinstance(second, Generation) and second.ids == expected[1]
    finally:
        run(engine.close())


def test_a_closed_engine_refuses_work(tiny_hf_engine: HFEngine) -> None:
    engine = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer)
    assert run(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=1, temperature=0.0))).ids
    run(engine.close())
    run(engine.close())  # idempotent
    with pytest.raises(EngineUnavailable, match="closed"):
        run(engine.generate([1, 2, 3], GREEDY))


def test_chat_renders_generates_and_parses(tiny_hf_engine: HFEngine) -> None:
    protocol = get_protocol("qwen3")
    answer = run(tiny_hf_engine.chat([{"role": "user", "content": "hi"}], protocol, SamplingParams(max_new_tokens=4)))
    assert isinstance(answer, str)


def test_loading_errors_name_the_model(tmp_path: Path, tiny_qwen3_dir: Path) -> None:
    with pytest.raises(EngineUnavailable, match=f"cannot load model '{tmp_path}'"):
        HFEngine.from_pretrained(tmp_path)  # an existing directory is read locally: no hub lookup
    with pytest.raises(ValueError, match="unknown dtype 'float33'"):
        HFEngine.from_pretrained(tiny_qwen3_dir, dtype="float33")
