"""Recipe: a Qwen3 model that answers unit word problems with two tools, over several turns.

    uv run apps/serve --model Qwen/Qwen3-4B-Instruct-2507 --engine vllm --recipe examples/qwen3/recipe.py
    uv run apps/train --backend openrlhf --recipe examples/qwen3/recipe.py --pretrain Qwen/Qwen3-4B --dry-run

A question like "A van drives 37.5 miles a day. How many kilometres does it drive in 12 days?" takes three turns:
`calculator` for the product, `convert_units` (a tool defined here with `@tool`) for miles to kilometres, then a
last line ``Answer: 724.20``. The reward is an exact match of that number. The dataset is generated (seeded per
split, so "train" and "test" are fixed and disjoint) with the same conversion the tool does, so every answer is
reachable exactly. This file is the whole agent: `apps/serve` and `apps/train` both load it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from fractions import Fraction
from typing import Any, Final, Literal

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline, ToolError, tool
from agent_runtime import Recipe

Unit = Literal["mi", "km", "lb", "kg", "gal", "l", "ft", "m"]

# How many of the second unit make one of the first.
FACTORS: Final[dict[tuple[str, str], float]] = {
    ("mi", "km"): 1.609344,
    ("lb", "kg"): 0.45359237,
    ("gal", "l"): 3.785411784,
    ("ft", "m"): 0.3048,
}

SYSTEM_PROMPT: Final = (
    "You are a careful assistant with tools. Use `calculator` for every arithmetic step and `convert_units` for "
    "every unit conversion; never work a number out in your head. When you are done, reply with one line: "
    "`Answer: <number>`, the number rounded to 2 decimals."
)


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """`value` in `from_unit`, expressed in `to_unit` (rounded to 4 decimals, as the tool reports it)."""
    if (from_unit, to_unit) in FACTORS:
        return round(value * FACTORS[from_unit, to_unit], 4)
    if (to_unit, from_unit) in FACTORS:
        return round(value / FACTORS[to_unit, from_unit], 4)
    raise ToolError(f"cannot convert {from_unit} to {to_unit}", hint=f"Known pairs: {sorted(FACTORS)}.")


@tool(timeout_s=5)
def convert_units(value: float, from_unit: Unit, to_unit: Unit) -> dict[str, object]:
    """Convert a quantity between units (miles/km, pounds/kg, US gallons/litres, feet/metres).

    Args:
        value: The quantity to convert.
        from_unit: The unit the value is in.
        to_unit: The unit wanted.
    """
    return {"value": convert(value, from_unit, to_unit), "unit": to_unit}


# (question template, source unit, target unit); {a} is a per-item quantity, {n} a count.
TEMPLATES: Final = (
    ("A delivery van drives {a} miles a day. How many kilometres does it drive in {n} days?", "mi", "km"),
    ("Each crate weighs {a} lb. What do {n} crates weigh in kilograms?", "lb", "kg"),
    ("A water tank holds {a} gallons. How many litres do {n} such tanks hold?", "gal", "l"),
    ("A fence panel is {a} feet long. How many metres long is a fence of {n} panels?", "ft", "m"),
)
SPLIT_SIZES: Final = {"train": 2048, "test": 64}
SPLIT_SEEDS: Final = {"train": 11, "test": 12}


def problems(split: str) -> Iterator[dict[str, Any]]:
    """Rows {"prompt", "answer"} of `split`; the answer is what the tools give, rounded to 2 decimals."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"the qwen3 example has splits {sorted(SPLIT_SIZES)}, not {split!r}")
    rng = random.Random(SPLIT_SEEDS[split])
    for _ in range(SPLIT_SIZES[split]):
        template, source, target = rng.choice(TEMPLATES)
        a, n = f"{rng.randint(10, 999) / 10:g}", rng.randint(2, 40)
        total = float(Fraction(a) * n)  # what `calculator` prints, read back as the model would pass it on
        answer = f"{convert(total, source, target):.2f}"
        yield {"prompt": template.format(a=a, n=n), "answer": answer}


recipe = Recipe(
    name="qwen3-units",
    protocol="qwen3",
    environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool(), convert_units], max_steps=8),
    rewards=RewardPipeline(result=[MatchingReward(mode="exact", extract="answer_line", name="exact_match")]),
    system_prompt=SYSTEM_PROMPT,
    max_new_tokens=1024,
    max_context_tokens=8192,
    dataset=problems,
    metadata={"tools": ["calculator", "convert_units"]},
)
