"""Build the single_turn example's math questions from templates and one seed.

    uv run python -m examples.single_turn.build_data            # (re)write data/{train,test}.jsonl
    uv run python -m examples.single_turn.build_data --check    # exit 1 when the committed files differ

Three kinds of question, each with an exact answer written in LaTeX as a math dataset would (``\\frac{19}{12}``,
``-\\frac{3}{2}``, ``84``): fraction arithmetic, a linear equation in x, a percentage. Rows are
``{"prompt", "answer", "kind"}``; `MathReward` compares the model's ``\\boxed{}`` answer with `answer`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

DATA_DIR: Final = Path(__file__).with_name("data")
SEED: Final = 7
SPLIT_SIZES: Final = {"test": 60, "train": 600}


def latex(value: Fraction) -> str:
    """`value` as a math dataset writes it: ``7``, ``\\frac{19}{12}``, ``-\\frac{3}{2}``."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _fractions(rng: random.Random) -> tuple[str, Fraction]:
    a, b = Fraction(rng.randint(1, 9), rng.randint(2, 9)), Fraction(rng.randint(1, 9), rng.randint(2, 9))
    op = rng.choice("+-*")
    value = a + b if op == "+" else a - b if op == "-" else a * b
    symbol = {"+": "+", "-": "-", "*": "\\times"}[op]
    return f"Compute ${latex(a)} {symbol} {latex(b)}$.", value


def _linear(rng: random.Random) -> tuple[str, Fraction]:
    a, b, c = rng.choice([2, 3, 4, 5, 6, 7, 8, 9, -2, -3]), rng.randint(-20, 20), rng.randint(-30, 30)
    sign = "+" if b >= 0 else "-"
    return f"Solve for $x$: ${a}x {sign} {abs(b)} = {c}$.", Fraction(c - b, a)


def _percent(rng: random.Random) -> tuple[str, Fraction]:
    p, n = rng.choice([5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 60, 75, 80]), rng.randint(2, 80) * 10
    return f"What is ${p}\\%$ of ${n}$?", Fraction(p * n, 100)


KINDS: Final[dict[str, Callable[[random.Random], tuple[str, Fraction]]]] = {
    "fractions": _fractions,
    "linear": _linear,
    "percent": _percent,
}


def question_sets() -> dict[str, list[dict[str, Any]]]:
    """Each split's rows; a question appears in one split only."""
    seen: set[str] = set()
    sets: dict[str, list[dict[str, Any]]] = {}
    for split, size in SPLIT_SIZES.items():
        rng = random.Random(f"{SEED}-{split}")
        rows: list[dict[str, Any]] = []
        while len(rows) < size:
            kind = list(KINDS)[len(rows) % len(KINDS)]
            prompt, value = KINDS[kind](rng)
            if prompt not in seen:
                seen.add(prompt)
                rows.append({"prompt": prompt, "answer": latex(value), "kind": kind})
        sets[split] = rows
    return sets


def build() -> dict[str, str]:
    """Every data file's name and text."""
    return {f"{split}.jsonl": "".join(json.dumps(r) + "\n" for r in rows) for split, rows in question_sets().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the single_turn example's math questions.")
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = parser.parse_args(argv)
    files = build()
    stale = [n for n, text in files.items() if not (DATA_DIR / n).is_file() or (DATA_DIR / n).read_text() != text]
    if args.check:
        print("stale: " + ", ".join(stale) if stale else "data files are up to date")
        return 1 if stale else 0
    DATA_DIR.mkdir(exist_ok=True)
    for name, text in files.items():
        (DATA_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote {DATA_DIR / name} ({text.count(chr(10))} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
