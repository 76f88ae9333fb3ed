"""Smoke mode of the qwen3 example: the recipe end to end on CPU, no model download.

    uv run python -m examples.qwen3.smoke                        # from the repository root
    uv run python -m examples.qwen3.smoke --protocol gpt-oss     # the same agent in another family's format

The recipe is loaded the way `apps/serve` and `apps/train` load it, and driven by `AgentRuntime` with a
`ScriptedEngine` whose policy plays a trained model: it reads the question from the prompt, calls `calculator`
with the product, reads the result and calls `convert_units`, reads that and answers ``Answer: <number>``. The
first episode's events are printed as they stream; then a batch of test questions runs concurrently and is scored
by the recipe's reward.

With `--protocol NAME` the recipe runs in that family's chat format, on that family's tokenizer
(`examples/family_smoke.py`): the policy reads the question and tool results with a reader learned from the
family's renderer and answers with an assistant message that the family's protocol writes as the model would.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent_protocol import list_protocols
from agent_runtime import LLMEngine, Recipe, load_recipe
from examples._smoke import Prompt, describe, quiet_logs, reply, runtime_for, scripted_engine, tool_call
from examples.family_smoke import FamilyPrompt, family_engine, family_tokenizer

RECIPE_PATH: Final = Path(__file__).with_name("recipe.py")

_QUANTITY: Final = re.compile(r"(\d+(?:\.\d+)?) (miles|lb|gallons|feet)\b")
_COUNT: Final = re.compile(r"\b(\d+) (?:days|crates|such tanks|panels)\b")
_UNITS: Final = {"miles": "mi", "lb": "lb", "gallons": "gal", "feet": "ft"}
_TARGETS: Final = {"kilometres": "km", "kilograms": "kg", "litres": "l", "metres": "m"}


def plan(prompt: Prompt | FamilyPrompt) -> dict[str, object]:
    """A trained model's three turns on a unit word problem, decided from the prompt alone, as an assistant
    message: ``{"content", "reasoning_content", "tool_calls"?}``."""
    question = prompt.question
    quantity, count = _QUANTITY.search(question), _COUNT.search(question)
    target = next((unit for word, unit in _TARGETS.items() if word in question), None)
    if quantity is None or count is None or target is None:
        return _say("I can only help with unit word problems.", "This is not a unit problem.")
    results = prompt.tool_results()
    if not results:
        expression = f"{quantity.group(1)} * {count.group(1)}"
        return _call("calculator", {"expression": expression}, "First the total, with the calculator.")
    if len(results) == 1:
        total = float(results[0].split("≈")[-1])
        arguments = {"value": total, "from_unit": _UNITS[quantity.group(2)], "to_unit": target}
        return _call("convert_units", arguments, f"The total is {results[0]}; now convert it.")
    converted = json.loads(results[-1])["value"]
    return _say(f"Answer: {converted:.2f}", f"The converted total is {converted}; round to 2 decimals.")


def _call(name: str, arguments: dict[str, object], thought: str) -> dict[str, object]:
    call = {"id": f"call{name[:5]:0>5}", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"content": "", "reasoning_content": thought, "tool_calls": [call]}


def _say(text: str, thought: str) -> dict[str, object]:
    return {"content": text, "reasoning_content": thought}


def policy(prompt: Prompt) -> str:
    """`plan` written as Qwen3 text (the recipe's own format)."""
    turn = plan(prompt)
    calls = turn.get("tool_calls")
    if isinstance(calls, list):
        function = calls[0]["function"]
        return tool_call(function["name"], function["arguments"], str(turn["reasoning_content"]))
    return reply(str(turn["content"]), str(turn["reasoning_content"]))


def engine_for(recipe: Recipe, protocol: str | None) -> tuple[Recipe, LLMEngine, str]:
    """The recipe (in `protocol`'s format when given) and a scripted engine playing the trained model on it."""
    if protocol is None:
        return recipe, scripted_engine(policy), "qwen3, the official Qwen3 tokenizer"
    recipe = dataclasses.replace(recipe, protocol=protocol, protocol_options={})
    chat = recipe.chat_protocol()
    tokenizer, origin = family_tokenizer(chat)
    tools = recipe.environment().tools
    return recipe, family_engine(plan, chat, tokenizer, tools), f"{protocol}, {origin}"


@dataclass(frozen=True)
class SmokeResult:
    questions: list[str]
    expected: list[str]
    answers: list[str | None]
    rewards: list[float]
    tool_sequences: list[list[str]]  # the tools each episode called, in order
    streamed: list[str]  # the first episode's events, one line each


async def run_smoke(count: int = 8, *, out: bool = True, protocol: str | None = None) -> SmokeResult:
    recipe, engine, fmt = engine_for(load_recipe(RECIPE_PATH), protocol)
    runtime = runtime_for(recipe, engine)
    rows = list(recipe.rows("test"))[:count]
    say = print if out else (lambda _: None)

    say(f"== {recipe.name} ({fmt}): streaming one episode ==\nuser: {rows[0]['prompt']}")
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=list_protocols(), help="run in this family's chat format")
    parser.add_argument("--count", type=int, default=8, help="test questions in the batch (default 8)")
    args = parser.parse_args()
    quiet_logs()
    result = asyncio.run(run_smoke(args.count, protocol=args.protocol))
    return 0 if all(r == 1.0 for r in result.rewards) else 1


if __name__ == "__main__":
    sys.exit(main())
