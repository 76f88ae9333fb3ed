"""A minimal built-in recipe: a Qwen3-format agent with the `calculator` tool. `apps/serve` falls back to it when
the project's demo recipe (`agent_train.demo`) is not installed; tests and the benchmark serve it too.

This module defines a recipe; it runs nothing.
"""

from __future__ import annotations

from typing import Final

from agent_env import CalculatorTool, FunctionCallEnvironment
from agent_runtime.recipe import Recipe

__all__ = ["CALCULATOR_SYSTEM_PROMPT", "calculator_recipe"]

CALCULATOR_SYSTEM_PROMPT: Final = (
    "You are a careful assistant. Use the calculator tool for any arithmetic, then answer in one short sentence."
)


def calculator_recipe(*, max_steps: int = 6, max_new_tokens: int = 512) -> Recipe:
    """The calculator agent: one `calculator` tool, a plain-text final answer, no rewards (serving needs none)."""
    tools = [CalculatorTool()]  # read-only, built once and shared by every episode's environment
    return Recipe(
        name="calculator-agent",
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=tools, max_steps=max_steps),
        system_prompt=CALCULATOR_SYSTEM_PROMPT,
        max_new_tokens=max_new_tokens,
    )
