"""The demo agent's `Recipe`: the Qwen3-Instruct-2507 chat format (no reasoning), a `FunctionCallEnvironment`
with the `calculator` tool, a result reward that checks the final number, tight budgets, and the arithmetic
problems of `agent_demo.task` as its dataset.

    from agent_runtime import load_recipe
    recipe = load_recipe("agent_demo.recipe")      # this module's `recipe`
    rows = list(recipe.rows("test"))                     # held-out problems; "train" for training

The reward is `MatchingReward` on the number after "The answer is" (normalized, so ``1,234`` equals ``1234``):
1.0 for the right answer, 0.0 otherwise, also when the model answers without one. An episode is at most three
turns (`max_steps=3`); the expert needs two. This module defines the agent; it loads no model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from agent_demo.task import problem_rows
from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
from agent_runtime import Recipe, SamplingParams

__all__ = [
    "DEMO_PROTOCOL",
    "HELD_OUT_SIZE",
    "TRAIN_SIZE",
    "demo_dataset",
    "demo_environment",
    "demo_rewards",
    "make_recipe",
    "recipe",
]

DEMO_PROTOCOL: Final = "qwen3-instruct-2507"
TRAIN_SIZE: Final = 4000
HELD_OUT_SIZE: Final = 500


def demo_environment() -> FunctionCallEnvironment:
    """A fresh environment for one episode: the calculator, at most three turns."""
    return FunctionCallEnvironment(tools=[CalculatorTool(timeout_s=5.0)], max_steps=3)


def demo_rewards() -> RewardPipeline:
    """1.0 when the number after "The answer is" equals the reference, else 0.0."""
    return RewardPipeline(result=[MatchingReward(mode="normalized", extract="answer_line", name="correct")])


def demo_dataset(split: str) -> Iterable[Mapping[str, Any]]:
    """`TRAIN_SIZE` training rows or `HELD_OUT_SIZE` held-out rows (split "test"), fixed by seed 0."""
    return problem_rows(split, TRAIN_SIZE if split == "train" else HELD_OUT_SIZE, seed=0)


def make_recipe() -> Recipe:
    return Recipe(
        name="demo-calculator",
        protocol=DEMO_PROTOCOL,
        environment=demo_environment,
        rewards=demo_rewards(),
        max_new_tokens=32,
        max_context_tokens=512,
        sampling=SamplingParams(max_new_tokens=32, temperature=0.0),
        dataset=demo_dataset,
        metadata={"task": "arithmetic a * b +/- c through the calculator tool", "model": "demo"},
    )


recipe: Final = make_recipe()
