"""The compaction demo: a running total over a list of numbers, one calculator call per number, in a context too
small for the whole episode, so the agent must carry its state (the total so far, the numbers left) through
summaries. Its `Recipe` is `load_recipe("agent_demo.running_total")`.

    problem = generate_totals("test", 1)[0]
    problem.question     # "Add up one at a time: 471938256"
    problem.answer       # "45"

A solved episode: ``calculator("4 + 7")``, then ``"11 + 1"``, ... one call per number, each adding the next number
to the tool's last result, then ``The answer is 45.``. Each step costs about 20 tokens of context and the recipe's
context holds `MAX_CONTEXT_TOKENS`, so the session (the recipe's `context` is a `CompactionPolicy`) asks for a
summary once the next turn would pass `COMPACT_AT_TOKENS`, and the episode continues in a new context from the
question and the summary (`RESUME_TEMPLATE`). The summary that carries the episode on is ``Total 12. Left:
38256.`` (``Left: none.`` when every number is added): the last result and the numbers after the last one added.
Held-out lists are long enough to need at least `MIN_HELD_OUT_COMPACTIONS` compactions; without compaction the
budget ends them (``context_exhausted``) before the answer.

The numbers are distinct digits 1-9 written together, so each is one token of the demo tokenizer and "the number
after the one just added" is the next token after its only occurrence: one lookup, which a model of a few million
parameters learns in minutes. (Distinct two-digit numbers, one token of a digit each, left the tiny model matching
numbers by their last digit, and two-digit numbers as single tokens left it with a thousand rare tokens to learn:
0% after 150-200 SFT steps both ways.) The split is a stable hash of the list, as in `agent_demo.task`: one list in
ten is held out. This module knows the task, its text and its recipe; the scripted expert is
`agent_demo.running_total_expert`.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import msgspec

from agent_demo.task import SPLITS, Split
from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
from agent_runtime import BudgetPolicy, CompactionPolicy, Recipe, SamplingParams

__all__ = [
    "COMPACTION_INSTRUCTION",
    "COMPACT_AT_TOKENS",
    "MAX_CONTEXT_TOKENS",
    "QUESTION_PREFIX",
    "RESUME_TEMPLATE",
    "TotalProblem",
    "generate_totals",
    "make_recipe",
    "parse_numbers",
    "recipe",
    "summary_text",
    "total_rows",
]

QUESTION_PREFIX: Final = "Add up one at a time: "
COMPACTION_INSTRUCTION: Final = "Context full. Summarize: the total so far and the numbers left."
RESUME_TEMPLATE: Final = "So far: {summary}"
MAX_CONTEXT_TOKENS: Final = 160
COMPACT_AT_TOKENS: Final = 118
MAX_NEW_TOKENS: Final = 24
SUMMARY_MAX_NEW_TOKENS: Final = 40
MAX_COMPACTIONS: Final = 6
TRAIN_LENGTHS: Final = (4, 9)  # numbers per list, inclusive
HELD_OUT_LENGTHS: Final = (8, 9)
MIN_HELD_OUT_COMPACTIONS: Final = 2
TRAIN_SIZE: Final = 4000
HELD_OUT_SIZE: Final = 500
_HELD_OUT_BUCKETS: Final = 10
_DIGITS: Final = re.compile(r"[1-9]+")


class TotalProblem(msgspec.Struct, frozen=True, kw_only=True):
    """A list of distinct digits 1-9 to add up."""

    numbers: tuple[int, ...]

    @property
    def question(self) -> str:
        return QUESTION_PREFIX + "".join(map(str, self.numbers))

    @property
    def value(self) -> int:
        return sum(self.numbers)

    @property
    def answer(self) -> str:
        return str(self.value)

    @property
    def split(self) -> Split:
        digest = hashlib.blake2b("".join(map(str, self.numbers)).encode(), digest_size=8).digest()
        return "test" if int.from_bytes(digest, "little") % _HELD_OUT_BUCKETS == 0 else "train"

    def row(self) -> dict[str, Any]:
        return {"prompt": self.question, "answer": self.answer, "count": len(self.numbers)}


def summary_text(total: int, left: Iterable[int]) -> str:
    """The summary that carries an episode into its next context: the total so far and the numbers left."""
    rest = "".join(map(str, left))
    return f"Total {total}. Left: {rest or 'none'}."


def parse_numbers(question: str) -> tuple[int, ...] | None:
    """The list a question of this task states (whitespace-trimmed), else None."""
    text = question.strip()
    if not text.startswith(QUESTION_PREFIX):
        return None
    digits = text[len(QUESTION_PREFIX) :]
    if not _DIGITS.fullmatch(digits):
        return None
    return tuple(int(digit) for digit in digits)


def generate_totals(split: Split, count: int, *, seed: int = 0) -> list[TotalProblem]:
    """`count` distinct lists of `split`, reproducible from `seed` (training lists have 4 to 9 numbers, held-out
    ones 8 or 9: long enough for two compactions at least)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    low, high = TRAIN_LENGTHS if split == "train" else HELD_OUT_LENGTHS
    rng = random.Random(f"demo-running-total:{split}:{seed}")
    seen: set[tuple[int, ...]] = set()
    problems: list[TotalProblem] = []
    while len(problems) < count:
        problem = TotalProblem(numbers=tuple(rng.sample(range(1, 10), rng.randint(low, high))))
        if problem.split != split or problem.numbers in seen:
            continue
        seen.add(problem.numbers)
        problems.append(problem)
    return problems


def total_rows(split: str, count: int | None = None, *, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Dataset rows: ``"train"`` (`TRAIN_SIZE`) or ``"test"`` (`HELD_OUT_SIZE`; ``"heldout"``, ``"validation"``,
    ``"eval"`` read as ``"test"``)."""
    if split not in ("train", "test", "heldout", "validation", "eval"):
        raise ValueError(f"unknown split {split!r}: use 'train' or 'test'")
    name: Split = "train" if split == "train" else "test"
    size = count if count is not None else (TRAIN_SIZE if name == "train" else HELD_OUT_SIZE)
    for problem in generate_totals(name, size, seed=seed):
        yield problem.row()


def _dataset(split: str) -> Iterable[Mapping[str, Any]]:
    return total_rows(split)


def _environment() -> FunctionCallEnvironment:
    """One episode's environment: the calculator, and turns enough for the longest list (one call per number)."""
    return FunctionCallEnvironment(tools=[CalculatorTool(timeout_s=5.0)], max_steps=2 * HELD_OUT_LENGTHS[1])


def make_recipe(*, compaction: bool = True) -> Recipe:
    """The compaction demo's recipe; `compaction=False` is the same agent under a plain budget (the episode ends
    when the context is full), the baseline the demo measures against."""
    return Recipe(
        name="demo-running-total",
        protocol="qwen3-instruct-2507",
        environment=_environment,
        rewards=RewardPipeline(result=[MatchingReward(mode="normalized", extract="answer_line", name="correct")]),
        max_new_tokens=MAX_NEW_TOKENS,
        max_context_tokens=MAX_CONTEXT_TOKENS,
        context=CompactionPolicy(
            compact_at_tokens=COMPACT_AT_TOKENS,
            max_compactions=MAX_COMPACTIONS,
            summary_max_new_tokens=SUMMARY_MAX_NEW_TOKENS,
            instruction_text=COMPACTION_INSTRUCTION,
            resume_template=RESUME_TEMPLATE,
        )
        if compaction
        else BudgetPolicy(),
        # the sampling cap bounds every generation, the summary's too: the session sets each turn's own budget
        sampling=SamplingParams(max_new_tokens=SUMMARY_MAX_NEW_TOKENS, temperature=0.0),
        dataset=_dataset,
        metadata={"task": "a running total through the calculator, carried through summaries", "model": "demo"},
    )


recipe: Final = make_recipe()
