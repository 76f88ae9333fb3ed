"""The demo agent (`agent_demo.recipe`) with a calculator that answers `LATENCY_S` seconds late, as a tool behind a
network does: `apps/train --recipe tests/vllm_cpu/slow_tool_recipe.py` loads it by path (so do the job's Ray
workers; it imports nothing from the tests).

`tests/vllm_cpu/test_partial_rollout.py` trains on it so that an episode lasts longer than a training step on any
machine: every episode of a vLLM call waits `LATENCY_S` between its two turns, and one GRPO step on the CPU takes
2-5 s, so the weight sync that follows the call's start lands inside its episodes (between two turns, or inside a
turn still generating). With the instant calculator it depended on the host: on one machine a call's 384 episodes
ran 5.8 s and the sync landed 5.2 s in, and on the CI host no episode crossed it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Final

from agent_demo.recipe import make_recipe
from agent_env import CalculatorTool, FunctionCallEnvironment, ToolContext
from agent_env.tools.calculator import CalculatorArguments
from agent_runtime import Recipe

__all__ = ["LATENCY_S", "SlowCalculatorTool", "recipe"]

LATENCY_S: Final = 20.0


class SlowCalculatorTool(CalculatorTool):
    """The calculator, answering after `latency_s` seconds of waiting (on the caller's loop: it only awaits)."""

    event_loop = "shared"

    def __init__(self, latency_s: float) -> None:
        super().__init__(timeout_s=latency_s + 30.0)
        self.latency_s = latency_s

    async def call(self, arguments: CalculatorArguments, context: ToolContext) -> str:
        await asyncio.sleep(self.latency_s)
        return await super().call(arguments, context)


def _environment() -> FunctionCallEnvironment:
    return FunctionCallEnvironment(tools=[SlowCalculatorTool(LATENCY_S)], max_steps=3)


recipe: Final[Recipe] = dataclasses.replace(make_recipe(), name="demo-calculator-slow-tool", environment=_environment)
