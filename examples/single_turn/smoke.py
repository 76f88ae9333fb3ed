"""Smoke mode of the single_turn example: one generation per question, scored by `MathReward`, on CPU.

    uv run python -m examples.single_turn.smoke          # from the repository root

The recipe is loaded as the apps load it and driven by `AgentRuntime` with a `ScriptedEngine` whose policy plays
a model that can do this arithmetic: it reads the question from the prompt, works it out exactly (with
`fractions.Fraction`), shows its working inside ``<think>`` and boxes the result, in one of several equivalent
forms (``\\frac{19}{12}``, ``19/12``, a decimal), so the reward has to compare mathematically, not as text. Then
the recipe's reward grades a few hand-written answers to one question, right and wrong, to show what it accepts.
"""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Final

from agent_env import EpisodeRecord
from agent_runtime import Recipe, load_recipe
from examples._smoke import Prompt, describe, quiet_logs, reply, runtime_for, scripted_engine

RECIPE_PATH: Final = Path(__file__).with_name("recipe.py")

_NUMBER: Final = r"-?\\frac\{\d+\}\{\d+\}|-?\d+"
_COMPUTE: Final = re.compile(rf"Compute \$({_NUMBER}) (\+|-|\\times) ({_NUMBER})\$")
_LINEAR: Final = re.compile(r"Solve for \$x\$: \$(-?\d+)x ([+-]) (\d+) = (-?\d+)\$")
_PERCENT: Final = re.compile(r"What is \$(\d+)\\%\$ of \$(\d+)\$")

# Answers to "Compute $\frac{3}{4} + \frac{5}{6}$." (gold \frac{19}{12}), and what MathReward should give each.
GRADED: Final = (
    ("The answer is $\\boxed{\\frac{19}{12}}$.", 1.0),
    ("So $x = \\boxed{19/12}$.", 1.0),
    ("Unreduced: $\\boxed{\\frac{38}{24}}$.", 1.0),
    ("Approximately $\\boxed{1.58}$.", 0.0),
    ("$\\boxed{\\frac{19}{13}}$", 0.0),
    ("I think it is nineteen twelfths.", 0.0),
)


def _value(latex: str) -> Fraction:
    if found := re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", latex):
        sign = -1 if found.group(1) else 1
        return sign * Fraction(int(found.group(2)), int(found.group(3)))
    return Fraction(int(latex))


def _written(value: Fraction, style: int) -> str:
    """`value` in one of three equivalent notations."""
    if value.denominator == 1:
        return str(value.numerator)
    if style == 1:
        return f"{value.numerator}/{value.denominator}"
    denominator = value.denominator
    for factor in (2, 5):
        while denominator % factor == 0:
            denominator //= factor
    if style == 2 and denominator == 1:  # a finite decimal, written exactly
        return str((Decimal(value.numerator) / Decimal(value.denominator)).normalize())
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def solve(question: str) -> tuple[Fraction, str] | None:
    """The exact answer to `question` and the working, or None for a question of another kind."""
    if found := _COMPUTE.search(question):
        a, op, b = _value(found.group(1)), found.group(2), _value(found.group(3))
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return value, f"{a} {op.replace(chr(92) + 'times', '*')} {b} = {value}"
    if found := _LINEAR.search(question):
        k, c = int(found.group(1)), int(found.group(4))
        d = int(found.group(3)) * (1 if found.group(2) == "+" else -1)
        value = Fraction(c - d, k)
        return value, f"{k}x = {c} - ({d}) = {c - d}, so x = {c - d}/{k} = {value}"
    if found := _PERCENT.search(question):
        p, n = int(found.group(1)), int(found.group(2))
        value = Fraction(p * n, 100)
        return value, f"{p}% of {n} = {p} * {n} / 100 = {value}"
    return None


def policy(prompt: Prompt) -> str:
    """Work the question out and box the result (the notation varies with the question)."""
    solved = solve(prompt.question)
    if solved is None:
        return reply("I cannot solve this one.", "This is not a kind of question I know.")
    value, working = solved
    answer = _written(value, style=len(prompt.question) % 3)
    return reply(f"The answer is $\\boxed{{{answer}}}$.", working)


async def grade(recipe: Recipe, answer: str, reference: str) -> float:
    """The recipe's reward for `answer` against `reference`, outside any episode."""
    if recipe.rewards is None:
        raise ValueError(f"recipe {recipe.name!r} has no rewards")
    breakdown = await recipe.rewards.score(EpisodeRecord(final_answer=answer, references=(reference,)))
    return breakdown.total


@dataclass(frozen=True)
class SmokeResult:
    answers: list[str | None]
    expected: list[str]
    rewards: list[float]
    graded: list[tuple[str, float]]  # (answer, reward) for the GRADED answers
    streamed: list[str]


async def run_smoke(count: int = 12, *, out: bool = True) -> SmokeResult:
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
    for row, result in zip(rows, results, strict=True):
        say(f"  {row['prompt']:42s} -> {result.final_answer!s:40s} gold {row['answer']:16s} reward={result.reward}")
    say(f"== {len(results)} episodes, mean reward {sum(r.reward for r in results) / len(results):.2f} ==")

    say("== what MathReward accepts, for gold \\frac{19}{12} ==")
    graded = []
    for answer, _ in GRADED:
        graded.append((answer, await grade(recipe, answer, "\\frac{19}{12}")))
        say(f"  {answer:45s} reward={graded[-1][1]}")
    return SmokeResult(
        answers=[r.final_answer for r in results],
        expected=[row["answer"] for row in rows],
        rewards=[r.reward for r in results],
        graded=graded,
        streamed=streamed,
    )


def main() -> int:
    quiet_logs()
    result = asyncio.run(run_smoke())
    right = all(r == 1.0 for r in result.rewards)
    return 0 if right and [g for _, g in result.graded] == [want for _, want in GRADED] else 1


if __name__ == "__main__":
    sys.exit(main())
