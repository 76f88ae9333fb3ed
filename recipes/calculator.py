"""Recipe: a Qwen3-family model that answers arithmetic questions with the `calculator` tool.

    uv run apps/train --backend openrlhf --recipe recipes/calculator.py --pretrain Qwen/Qwen3-4B --dry-run
    uv run apps/serve --recipe recipes/calculator.py --model Qwen/Qwen3-4B

One definition for training and serving: the Qwen3 chat protocol, a function-calling environment with the
calculator tool (at most 6 turns), an exact-match reward on the final answer, 1024 new tokens per turn in an 8192
token context, and compaction when the context fills up. The dataset is generated (seeded per split, so "train"
and "test" are fixed and disjoint): multi-step integer arithmetic whose answer is the exact integer.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
from agent_runtime import CompactionPolicy, Recipe

SYSTEM_PROMPT = (
    "You are a careful assistant. Use the calculator tool for every arithmetic step, then reply with the final "
    "number only."
)
SPLIT_SIZES = {"train": 2048, "test": 256}
SPLIT_SEEDS = {"train": 1, "test": 2}


def problems(split: str) -> Iterator[dict[str, Any]]:
    """Rows {"prompt", "answer"} for `split` ("train" or "test")."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"the calculator recipe has splits {sorted(SPLIT_SIZES)}, not {split!r}")
    rng = random.Random(SPLIT_SEEDS[split])
    for _ in range(SPLIT_SIZES[split]):
        a, b, c = rng.randint(12, 999), rng.randint(12, 999), rng.randint(2, 99)
        op = rng.choice(["+", "-"])
        value = a * b + c if op == "+" else a * b - c
        yield {"prompt": f"What is {a} * {b} {op} {c}?", "answer": str(value)}


recipe = Recipe(
    name="calculator",
    protocol="qwen3",
    environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=6),
    rewards=RewardPipeline(result=[MatchingReward(mode="exact")]),
    system_prompt=SYSTEM_PROMPT,
    max_new_tokens=1024,
    max_context_tokens=8192,
    context=CompactionPolicy(max_compactions=2),
    dataset=problems,
)
