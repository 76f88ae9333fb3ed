"""Smoke mode of the qwen3 example: the recipe end to end on CPU, no model download.

    uv run python -m examples.qwen3.smoke          # from the repository root

The recipe is loaded the way `apps/serve` and `apps/train` load it, and driven by `AgentRuntime` with a
`ScriptedEngine` whose policy plays a trained model: it reads the question from the prompt, calls `calculator`
with the product, reads the result and calls `convert_units`, reads that and answers ``Answer: <number>``. The
first episode's events are printed as they stream; then a batch of test questions runs concurrently and is scored
by the recipe's reward.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent_runtime import load_recipe
from examples._smoke import Prompt, describe, quiet_logs, reply, runtime_for, scripted_engine, tool_call

RECIPE_PATH: Final = Path(__file__).with_name("recipe.py")

_QUANTITY: Final = re.compile(r"(\d+(?:\.\d+)?) (miles|lb|gallons|feet)\b")
_COUNT: Final = re.compile(r"\b(\d+) (?:days|crates|such tanks|panels)\b")
_UNITS: Final = {"miles": "mi", "lb": "lb", "gallons": "gal", "feet": "ft"}
_TARGETS: Final = {"kilometres": "km", "kilograms": "kg", "litres": "l", "metres": "m"}


def policy(prompt: Prompt) -> str:
    """A trained model's three turns on a unit word problem, decided from the prompt alone."""
    question = prompt.question
    quantity, count = _QUANTITY.search(question), _COUNT.search(question)
    target = next((unit for word, unit in _TARGETS.items() if word in question), None)
    if quantity is None or count is None or target is None:
        return reply("I can only help with unit word problems.", "This is not a unit problem.")
    results = prompt.tool_results()
    if not results:
        expression = f"{quantity.group(1)} * {count.group(1)}"
        return tool_call("calculator", {"expression": expression}, "First the total, with the calculator.")
    if len(results) == 1:
        total = float(results[0].split("≈")[-1])
        arguments = {"value": total, "from_unit": _UNITS[quantity.group(2)], "to_unit": target}
        return tool_call("convert_units", arguments, f"The total is {results[0]}; now convert it.")
    converted = json.loads(results[-1])["value"]
    return reply(f"Answer: {converted:.2f}", f"The converted total is {converted}; round to 2 decimals.")


@dataclass(frozen=True)
class SmokeResult:
    questions: list[str]
    expected: list[str]
    answers: list[str | None]
    rewards: list[float]
    tool_sequences: list[list[str]]  # the tools each episode called, in order
    streamed: list[str]  # the first episode's events, one line each


async def run_smoke(count: int = 8, *, out: bool = True) -> SmokeResult:
    recipe = load_recipe(RECIPE_PATH)
    runtime = runtime_for(recipe, scripted_engine(policy))
    rows = list(recipe.rows("test"))[:count]
    say = print if out else (lambda _: None)

    say(f"== {recipe.name}: streaming one episode ==\nuser: {rows[0]['prompt']}")
    streamed = []
    async for event in runtime.stream(rows[0]["prompt"], task=rows[0]):
        streamed.append(describe(event))
        say("  " + streamed[-1])

    results = await runtime.run_many([row["prompt"] for row in rows], tasks=rows)
    sequences = []
    for row, result in zip(rows, results, strict=True):
        called = [m.tool_calls[0].name for m in result.trajectory.messages if m.role == "assistant" and m.tool_calls]
        sequences.append(called)
        say(f"  {row['prompt'][:70]:70s} -> {result.final_answer!r} (gold {row['answer']}) reward={result.reward}")
    mean = sum(r.reward for r in results) / len(results)
    say(f"== {len(results)} episodes, mean reward {mean:.2f} ==")
    return SmokeResult(
        questions=[row["prompt"] for row in rows],
        expected=[row["answer"] for row in rows],
        answers=[r.final_answer for r in results],
        rewards=[r.reward for r in results],
        tool_sequences=sequences,
        streamed=streamed,
    )


def main() -> int:
    quiet_logs()
    result = asyncio.run(run_smoke())
    return 0 if all(r == 1.0 for r in result.rewards) else 1


if __name__ == "__main__":
    sys.exit(main())
