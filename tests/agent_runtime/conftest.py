"""Fixtures of the agent-runtime tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from agent_runtime.engines.hf import HFEngine


@pytest.fixture
def alone(tiny_hf_engine: HFEngine) -> Iterator[HFEngine]:
    """The hf engines' reference: every request on its own, no kept prefixes, nothing joins (the tiny model)."""
    from agent_runtime.engines.hf import HFEngine

    lone = HFEngine(tiny_hf_engine.model, tiny_hf_engine.tokenizer, prefix_cache_sequences=0, join_running=False)
    yield lone
    asyncio.run(lone.close())
