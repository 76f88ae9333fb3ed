"""Fixtures for the agent-train tests: the real Qwen3 tokenizer (ours and transformers'), a calculator recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline, ToolCallReward
from agent_protocol import HFTokenizer
from agent_runtime import BudgetPolicy, ContextPolicy, Recipe


@pytest.fixture(scope="session")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_qwen3_dir: Path) -> Any:
    """What OpenRLHF hands the executor: the model's transformers tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen3_dir)


def calculator_recipe(*, context: ContextPolicy | None = None, max_new_tokens: int = 64, **kwargs: Any) -> Recipe:
    return Recipe(
        name="calc",
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4),
        rewards=RewardPipeline(result=[MatchingReward()], process=[ToolCallReward()]),
        max_new_tokens=max_new_tokens,
        context=context or BudgetPolicy(),
        **kwargs,
    )
