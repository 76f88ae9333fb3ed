"""Shared pytest fixtures for the workspace test suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.qwen3_tokenizer import qwen3_tokenizer_path


@pytest.fixture(scope="session")
def qwen3_tokenizer_file() -> Path:
    """Path of the official Qwen3 ``tokenizer.json``, rebuilt offline and sha256-verified (cached)."""
    return qwen3_tokenizer_path()
