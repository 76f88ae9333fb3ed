"""HFEngine's grouped-query attention (`hf_attention.GQA_SDPA`): the same logits as transformers' ``sdpa`` on a
batch with padding, prefill and cached decode, and through the engine the ids of ``sdpa``'s own `generate`; models
it does not apply to are left as they are."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
import transformers

from agent_protocol import HFTokenizer
from agent_runtime.engines.base import SamplingParams
from agent_runtime.engines.hf import HFEngine
from agent_runtime.engines.hf_attention import GQA_SDPA, use_gqa_sdpa
from tests.support.greedy_reference import greedy_reference


def load(model_dir: Path, attn: str = "sdpa") -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn)


def test_the_grouped_call_gives_the_logits_of_sdpa_batched_and_cached(tiny_qwen3_dir: Path) -> None:
    plain, grouped = load(tiny_qwen3_dir).eval(), load(tiny_qwen3_dir).eval()
    assert plain.config.num_key_value_heads < plain.config.num_attention_heads, "the tiny model must group its heads"
    assert use_gqa_sdpa(grouped) and grouped.config._attn_implementation == GQA_SDPA
    assert plain.config._attn_implementation == "sdpa"
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 1000, (3, 12), generator=generator)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :5] = 0  # left padding, as the engine lays out its rows
    mask[2, :2] = 0
    with torch.inference_mode():
        outputs = []
        for model in (plain, grouped):
            cache = transformers.DynamicCache(config=model.config)
            first = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            step = first.logits[:, -1].argmax(-1, keepdim=True)
            longer = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
            second = model(input_ids=step, attention_mask=longer, past_key_values=cache, use_cache=True)
            outputs.append((first.logits, second.logits))
    (plain_first, plain_second), (grouped_first, grouped_second) = outputs
    real = mask.bool()  # padded positions' logits are not used by anyone
    assert torch.allclose(plain_first[real], grouped_first[real], atol=1e-5)
    assert torch.allclose(plain_second, grouped_second, atol=1e-5)


def test_the_engine_switches_and_gives_the_ids_of_sdpa_generate(tiny_qwen3_dir: Path) -> None:
    plain, grouped = load(tiny_qwen3_dir).eval(), load(tiny_qwen3_dir)
    engine = HFEngine(grouped, HFTokenizer.from_file(tiny_qwen3_dir), max_batch_size=4)
    try:
        assert engine.gqa_sdpa and grouped.config._attn_implementation == GQA_SDPA
        prompts = [[(7 * i + 3 * j) % 900 + 20 for j in range(9 + 4 * i)] for i in range(4)]
        sampling = SamplingParams(max_new_tokens=6, temperature=0.0)

        async def together() -> list[list[int]]:
            return [g.ids for g in await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))]

        got = asyncio.run(together())
        assert engine.batch_sizes[4] == 1
        for prompt, ids in zip(prompts, got, strict=True):
            assert ids == greedy_reference(plain, prompt, 6)
    finally:
        asyncio.run(engine.close())


def test_models_it_does_not_apply_to_are_left_as_they_are(tiny_qwen3_dir: Path) -> None:
    eager = load(tiny_qwen3_dir, "eager")
    assert not use_gqa_sdpa(eager) and eager.config._attn_implementation == "eager"
    config = transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    ungrouped = transformers.Qwen3ForCausalLM(config)
    assert ungrouped.config._attn_implementation == "sdpa"
    assert not use_gqa_sdpa(ungrouped) and ungrouped.config._attn_implementation == "sdpa"
