"""The `ScriptedEngine` counts its own work: `stats()` (a server's /metrics "engine") gives the generations it
answered and the CPU seconds spent in them, so a benchmark can take the stand-in model's share out of the server's
CPU. A sleep (`delay_s`) is not CPU; a policy that raises is still counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import EngineError, SamplingParams, ScriptedEngine


def _busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_policy_cpu_is_counted_and_a_sleep_is_not(qwen3_tokenizer_file: Path) -> None:
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)

    def policy(prompt_ids: Sequence[int]) -> str:
        _busy(0.05)
        if len(prompt_ids) > 2:
            raise EngineError("the policy gave up")
        return "Hello.<|im_end|>"

    engine = ScriptedEngine(tokenizer, policy=policy, delay_s=0.2, record=False)
    assert engine.stats() == {"generations": 0, "model_cpu_s": 0.0}
    generation = asyncio.run(engine.generate([1, 2], SamplingParams()))
    assert tokenizer.decode(generation.ids) == "Hello.<|im_end|>"
    with pytest.raises(EngineError):
        asyncio.run(engine.generate([1, 2, 3], SamplingParams()))
    stats = engine.stats()
    assert stats["generations"] == 2
    assert 0.1 <= stats["model_cpu_s"] < 0.3  # two busy policies; the two 0.2 s sleeps are not CPU
