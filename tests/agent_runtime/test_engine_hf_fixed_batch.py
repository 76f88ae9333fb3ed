"""HFEngine.generate_batch, on the tiny random-weight Qwen3 with the real Qwen3 tokenizer: the requests run in
batches formed from them alone, in their order, `max_batch_size` rows at a time; a request sent meanwhile by
`generate` neither joins them nor is joined; a bad request fails only itself; every request gives its lone ids."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.hf import HFEngine
from agent_runtime.errors import ContextBudgetExceeded
from tests.agent_runtime.test_engine_hf_join import question, run

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
TEXTS = ["What is 2 + 2?", "Name a colour.", "Count to three.", "Say hi.", "What is 7 times 6?"]


def test_a_fixed_batch_runs_in_its_order_in_runs_of_max_batch_size_and_gives_the_lone_ids(
    tiny_hf_engine: HFEngine, alone: HFEngine
) -> None:
    prompts = [question(tiny_hf_engine, text) for text in TEXTS]
    expected = [run(alone.generate(prompt, GREEDY)).ids for prompt in prompts]
    engine = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, max_batch_size=2, join_ratio=0, join_wait_steps=0)

    async def both() -> tuple[list[Generation | Exception], Generation]:
        fixed = asyncio.create_task(engine.generate_batch(prompts, [GREEDY] * len(prompts)))
        await asyncio.sleep(0)  # the fixed batch is queued first
        lone = await engine.generate(question(tiny_hf_engine, "A request on its own."), GREEDY)
        return await fixed, lone

    try:
        answers, _ = run(both())
        assert [a.ids if isinstance(a, Generation) else a for a in answers] == expected
        # 2 + 2 + 1 rows, then the lone request in a batch of its own; nothing joined anything
        assert engine.batch_sizes == Counter({2: 2, 1: 2}) and engine.joined_requests == 0
    finally:
        run(engine.close())


def test_a_bad_request_in_a_fixed_batch_fails_only_itself(tiny_hf_engine: HFEngine, alone: HFEngine) -> None:
    good = question(tiny_hf_engine, TEXTS[0])
    too_long = [good[0]] * tiny_hf_engine.context_length
    engine = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer)
    try:
        answers = run(engine.generate_batch([good, [], too_long, good], [GREEDY] * 4))
        assert isinstance(answers[1], ValueError) and isinstance(answers[2], ContextBudgetExceeded)
        expected = run(alone.generate(good, GREEDY)).ids
        assert [a.ids for a in (answers[0], answers[3]) if isinstance(a, Generation)] == [expected, expected]
        with pytest.raises(ValueError, match="one sampling"):
            run(engine.generate_batch([good, good], [GREEDY]))
    finally:
        run(engine.close())
