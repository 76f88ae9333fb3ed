"""The demo task: multi-step arithmetic (`a * b + c`, `a * b - c`) that a tiny model must hand to the
`calculator` tool, with a seeded problem generator, a fixed train / held-out split and the reference answers.

A problem is a product of a 3-4 digit and a 2-3 digit number, plus or minus a 1-3 digit number, asked in one of
eight templates: four *plain* phrasings ("What is 347 * 829 + 56?", "Compute 347 times 829, then subtract 56.")
and four *word* problems ("A baker bakes 347 trays of 829 rolls and sells 56 rolls. How many rolls are left?"),
where the verb before the third number says whether to add or subtract. The answer has 4 to 8 digits: far
beyond what a model of a million parameters computes in its head, easy for the tool. A solved episode is one tool
call with the canonical expression, then ``The answer is N.``. (The scripted expert reads only plain phrasings, so
supervised data never shows a word problem: the model learns those from the reward, in RL. See `expert.py`.)

The split is a property of the problem, not of the generator's seed: a stable hash of the operands puts one
problem in ten into the held-out split, so held-out problems never appear in training whatever the seeds.

This module knows arithmetic and text; it knows nothing about tokens, models or sessions.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from typing import Any, Final, Literal

import msgspec

__all__ = [
    "SPLITS",
    "Phrasing",
    "Problem",
    "Split",
    "generate_problems",
    "parse_question",
    "problem_rows",
    "split_of",
    "template_count",
]

Split = Literal["train", "test"]
SPLITS: Final[tuple[Split, ...]] = ("train", "test")

_HELD_OUT_BUCKETS: Final = 10  # one problem in ten is held out

Phrasing = Literal["plain", "word"]

# (template, operator, phrasing): the question text for `a * b <op> c`
_TEMPLATES: Final[tuple[tuple[str, str, Phrasing], ...]] = (
    ("What is {a} * {b} + {c}?", "+", "plain"),
    ("What is {a} * {b} - {c}?", "-", "plain"),
    ("Compute {a} times {b}, then add {c}.", "+", "plain"),
    ("Compute {a} times {b}, then subtract {c}.", "-", "plain"),
    ("A shop has {a} boxes of {b} pens and gets {c} more pens. How many pens does it have?", "+", "word"),
    ("A farm packs {a} crates of {b} eggs and drops {c} eggs. How many eggs are left?", "-", "word"),
    (
        "A school orders {a} packs of {b} pencils and buys {c} extra pencils. How many pencils does it have?",
        "+",
        "word",
    ),
    ("A baker bakes {a} trays of {b} rolls and sells {c} rolls. How many rolls are left?", "-", "word"),
)


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One arithmetic problem: the question as asked, the canonical calculator expression and the answer."""

    a: int
    b: int
    c: int
    op: str  # "+" or "-"
    template: int

    @property
    def phrasing(self) -> Phrasing:
        """``plain`` (an expression or an instruction) or ``word`` (a word problem)."""
        return _TEMPLATES[self.template][2]

    @property
    def question(self) -> str:
        return _TEMPLATES[self.template][0].format(a=self.a, b=self.b, c=self.c)

    @property
    def expression(self) -> str:
        return f"{self.a} * {self.b} {self.op} {self.c}"

    @property
    def value(self) -> int:
        product = self.a * self.b
        return product + self.c if self.op == "+" else product - self.c

    @property
    def answer(self) -> str:
        return str(self.value)

    @property
    def split(self) -> Split:
        return split_of(self.a, self.b, self.c, self.op)

    def row(self) -> dict[str, Any]:
        """The dataset row a recipe yields: the prompt, the reference answer (for the reward) and metadata."""
        return {
            "prompt": self.question,
            "answer": self.answer,
            "expression": self.expression,
            "phrasing": self.phrasing,
        }


def _pattern(template: str) -> re.Pattern[str]:
    escaped = re.escape(template)
    for name in ("a", "b", "c"):
        escaped = escaped.replace(re.escape("{" + name + "}"), f"(?P<{name}>[0-9]+)")
    return re.compile(escaped)


_PATTERNS: Final = tuple(_pattern(template) for template, _, _ in _TEMPLATES)


def parse_question(text: str, *, phrasings: tuple[Phrasing, ...] = ("plain", "word")) -> Problem | None:
    """The problem a question states, when it is one of the task's templates of the given `phrasings`
    (whitespace-trimmed), else None."""
    text = text.strip()
    for index, pattern in enumerate(_PATTERNS):
        if _TEMPLATES[index][2] not in phrasings:
            continue
        match = pattern.fullmatch(text)
        if match is not None:
            a, b, c = (int(match[name]) for name in ("a", "b", "c"))
            return Problem(a=a, b=b, c=c, op=_TEMPLATES[index][1], template=index)
    return None


def split_of(a: int, b: int, c: int, op: str) -> Split:
    """The split a problem belongs to, from a stable hash of its operands (not Python's salted `hash`)."""
    digest = hashlib.blake2b(f"{a}{op}{b}{op}{c}".encode(), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "little") % _HELD_OUT_BUCKETS == 0 else "train"


def _draw(rng: random.Random) -> Problem:
    template = rng.randrange(len(_TEMPLATES))
    a = rng.randint(100, 9999)
    b = rng.randint(10, 999)
    c = rng.randint(1, 999)
    return Problem(a=a, b=b, c=c, op=_TEMPLATES[template][1], template=template)


def template_count() -> int:
    """How many question templates the task has."""
    return len(_TEMPLATES)


def generate_problems(split: Split, count: int, *, seed: int = 0) -> list[Problem]:
    """`count` distinct problems of `split`, reproducible from `seed`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(f"demo-arithmetic:{split}:{seed}")
    seen: set[tuple[int, int, int, str]] = set()
    problems: list[Problem] = []
    while len(problems) < count:
        problem = _draw(rng)
        key = (problem.a, problem.b, problem.c, problem.op)
        if problem.split != split or key in seen:
            continue
        seen.add(key)
        problems.append(problem)
    return problems


def problem_rows(split: str, count: int = 2000, *, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Dataset rows for a recipe: ``"train"`` or ``"test"`` (``"heldout"``, ``"validation"`` and ``"eval"`` are
    read as ``"test"``)."""
    name: Split = "train" if split == "train" else "test"
    if split not in ("train", "test", "heldout", "validation", "eval"):
        raise ValueError(f"unknown split {split!r}: use 'train' or 'test'")
    for problem in generate_problems(name, count, seed=seed):
        yield problem.row()
