"""Shared pytest fixtures for the workspace test suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

if TYPE_CHECKING:
    from agent_runtime.engines.hf import HFEngine


@pytest.fixture(scope="session")
def qwen3_tokenizer_file() -> Path:
    """Path of the official Qwen3 ``tokenizer.json``, rebuilt offline and sha256-verified (cached)."""
    return qwen3_tokenizer_path()


@pytest.fixture(scope="session")
def tiny_qwen3_dir(qwen3_tokenizer_file: Path) -> Path:
    """A tiny random-weight Qwen3 model directory (the real tokenizer and chat template), built once into
    ``.cache/tiny-qwen3`` and reused. Skips where torch/transformers are not installed."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.tiny_qwen3 import tiny_qwen3_path

    return tiny_qwen3_path(qwen3_tokenizer_file)


@pytest.fixture(scope="session")
def tiny_hf_engine(tiny_qwen3_dir: Path) -> Iterator[HFEngine]:
    """One `HFEngine` on the tiny model (CPU, float32), shared by the session: it serves any event loop."""
    import asyncio

    from agent_runtime.engines.hf import HFEngine

    engine = HFEngine.from_pretrained(tiny_qwen3_dir, device="cpu", dtype="float32")
    yield engine
    asyncio.run(engine.close())
