"""HFEngine's transposed output layer (`hf_head.TransposedHead`): the model's own logits, prefill and cached decode;
a fresh copy after the weights change; the engine's ids equal transformers' `generate` with it; and the models it
must not apply to (a scaled head, a bias, bfloat16, a subclass, a head too large) run the model's forward."""

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
from agent_runtime.engines import hf_head
from agent_runtime.engines.base import SamplingParams
from agent_runtime.engines.hf import HFEngine
from agent_runtime.engines.hf_head import TransposedHead
from tests.support.greedy_reference import greedy_reference


def load(model_dir: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def small_config(**changes: Any) -> transformers.Qwen3Config:
    settings: dict[str, Any] = {
        "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    }  # fmt: skip
    return transformers.Qwen3Config(**{**settings, **changes})


def test_its_logits_are_the_models_own_at_prefill_and_cached_decode(tiny_qwen3_dir: Path) -> None:
    model = load(tiny_qwen3_dir)
    head = TransposedHead.of(model)
    assert head is not None and head.backbone is model.model
    ids = torch.randint(10, 5000, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, :7] = 0  # a left-padded row, as the engine lays them out
    with torch.inference_mode():
        ours_cache, theirs_cache = (
            transformers.DynamicCache(config=model.config),
            transformers.DynamicCache(config=model.config),
        )
        hidden = model.model(input_ids=ids, attention_mask=mask, past_key_values=ours_cache, use_cache=True)
        ours = head.logits(hidden.last_hidden_state[:, -1, :])
        theirs = model(
            input_ids=ids, attention_mask=mask, past_key_values=theirs_cache, use_cache=True, logits_to_keep=1
        ).logits[:, -1, :]
        assert ours.shape == theirs.shape == (2, model.config.vocab_size)
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
        step = theirs.argmax(-1, keepdim=True)
        longer = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        for row in range(2):  # one row a step, as a lone decode runs
            hidden = model.model(
                input_ids=step[row : row + 1], attention_mask=longer[row : row + 1], use_cache=False,
                past_key_values=_row_cache(ours_cache, row, model),
            ).last_hidden_state  # fmt: skip
            theirs_row = model(
                input_ids=step[row : row + 1], attention_mask=longer[row : row + 1], use_cache=False,
                past_key_values=_row_cache(theirs_cache, row, model), logits_to_keep=1,
            ).logits[:, -1, :]  # fmt: skip
            assert torch.allclose(head.logits(hidden[:, -1, :]), theirs_row, atol=1e-5, rtol=0)


def test_a_change_of_weights_makes_a_new_copy(tiny_qwen3_dir: Path) -> None:
    model = load(tiny_qwen3_dir)
    head = TransposedHead.of(model)
    assert head is not None
    hidden = torch.randn(1, model.config.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = head.logits(hidden)
        model.lm_head.weight.mul_(2.0)  # in place, as an optimizer step: the version counter moves
        after = head.logits(hidden)
        assert torch.allclose(after, 2 * before, atol=1e-5)
        assert torch.allclose(after, model.lm_head(hidden), atol=1e-5, rtol=0)
        model.lm_head.weight = torch.nn.Parameter(torch.zeros_like(model.lm_head.weight))  # new storage
        assert head.logits(hidden).abs().max() == 0


def test_the_engine_uses_it_and_gives_the_ids_of_generate(tiny_qwen3_dir: Path) -> None:
    reference, model = load(tiny_qwen3_dir), load(tiny_qwen3_dir)
    engine = HFEngine(model, HFTokenizer.from_file(tiny_qwen3_dir), max_batch_size=8)
    used = []
    logits = engine.head.logits  # type: ignore[union-attr]
    engine.head.logits = lambda hidden: used.append(hidden.shape[0]) or logits(hidden)  # type: ignore[method-assign,union-attr]
    try:
        prompts = [[(5 * i + 11 * j) % 900 + 20 for j in range(12 + 5 * i)] for i in range(6)]
        sampling = SamplingParams(max_new_tokens=7, temperature=0.0)

        async def alone_then_together() -> list[list[int]]:
            alone = [(await engine.generate(p, sampling)).ids for p in prompts[:1]]
            together = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts[1:]))
            return alone + [g.ids for g in together]

        got = asyncio.run(alone_then_together())
        assert used and max(used) <= hf_head.MAX_ROWS  # the lone request's steps; the batch of 5 ran the model's
        assert engine.batch_sizes[1] >= 1 and engine.batch_sizes[5] == 1
        for prompt, ids in zip(prompts, got, strict=True):
            assert ids == greedy_reference(reference, prompt, 7)
    finally:
        asyncio.run(engine.close())


def test_models_it_must_not_apply_to_run_their_own_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    plain = transformers.Qwen3ForCausalLM(small_config()).eval()
    assert TransposedHead.of(plain) is not None
    assert TransposedHead.of(plain.to(torch.bfloat16)) is None

    class Scaled(transformers.Qwen3ForCausalLM):  # a subclass may change what follows the head
        pass

    assert TransposedHead.of(Scaled(small_config())) is None
    biased = transformers.Qwen3ForCausalLM(small_config())
    biased.lm_head = torch.nn.Linear(32, 96, bias=True)
    assert TransposedHead.of(biased) is None
    gemma = transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16,
        )
    )  # fmt: skip  # softcaps its logits
    assert TransposedHead.of(gemma) is None
    monkeypatch.setattr(hf_head, "MAX_BYTES", 96 * 32 * 4 - 1)
    assert TransposedHead.of(transformers.Qwen3ForCausalLM(small_config())) is None


def _row_cache(cache: Any, row: int, model: Any) -> Any:
    """A copy of one row of `cache` (each decode above runs on its own copy, the two sides on equal ones)."""
    copy = transformers.DynamicCache(config=model.config)
    for index, layer in enumerate(cache.layers):
        copy.update(layer.keys[row : row + 1].clone(), layer.values[row : row + 1].clone(), index)
    return copy
