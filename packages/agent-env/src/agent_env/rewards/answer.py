"""Answer extraction and comparison helpers shared by the result rewards.

Extraction (`extract_answer`), from a model's final text:

- ``boxed``: the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced, so ``\\boxed{\\frac{1}{2}}``
  gives ``\\frac{1}{2}``;
- ``answer_tag``: the last ``<answer>...</answer>``;
- ``answer_line``: the last "Answer: ..." / "Final answer: ..." / "the answer is ..." phrase;
- ``auto``: the first of those that finds something, else the whole text, stripped.

Comparison: `normalize_answer` (SQuAD-style: lower case, no punctuation, no articles, single spaces, with
``$``, ``\\text{}`` and thousands separators removed) and `token_f1` (bag-of-tokens F1 of two normalized
answers).

This module knows text; it knows nothing about episodes or strategies.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Final, Literal

__all__ = [
    "ExtractMethod",
    "extract_answer",
    "extract_answer_line",
    "extract_answer_tag",
    "extract_boxed",
    "normalize_answer",
    "token_f1",
]

ExtractMethod = Literal["auto", "boxed", "answer_tag", "answer_line", "none"]

_BOX_START: Final = re.compile(r"\\(?:boxed|fbox)\s*")
_ANSWER_TAG: Final = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE: Final = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is)?\s*[:：]\s*(?P<a>[^\n]+)|the\s+(?:final\s+)?answer\s+is\s+(?P<b>[^\n]+)",
    re.IGNORECASE,
)
_ARTICLES: Final = re.compile(r"\b(a|an|the)\b")
_TEXT_MACRO: Final = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_THOUSANDS: Final = re.compile(r"(?<=\d),(?=\d{3}\b)")
_PUNCTUATION: Final = str.maketrans("", "", string.punctuation)


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in `text`, or None."""
    found: str | None = None
    for match in _BOX_START.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            depth = 0
            for index in range(start, len(text)):
                if text[index] == "{":
                    depth += 1
                elif text[index] == "}":
                    depth -= 1
                    if depth == 0:
                        found = text[start + 1 : index].strip()
                        break
        else:  # "\boxed 5": a single token
            token = text[start:].split(maxsplit=1)
            if token:
                found = token[0].rstrip(".$")
    return found


def extract_answer_tag(text: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` in `text`, or None."""
    matches = _ANSWER_TAG.findall(text)
    return matches[-1].strip() if matches else None


def extract_answer_line(text: str) -> str | None:
    """What follows the last "Answer:" / "the answer is" in `text`, or None."""
    matches = list(_ANSWER_LINE.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    answer = (last.group("a") or last.group("b") or "").strip()
    return answer.rstrip(".").strip() or None


def extract_answer(text: str, method: ExtractMethod = "auto") -> str | None:
    """Extract the answer from `text` with `method` (see the module docstring). ``none`` returns the text."""
    if method == "none":
        return text.strip()
    if method == "boxed":
        return extract_boxed(text)
    if method == "answer_tag":
        return extract_answer_tag(text)
    if method == "answer_line":
        return extract_answer_line(text)
    for extractor in (extract_boxed, extract_answer_tag, extract_answer_line):
        found = extractor(text)
        if found is not None:
            return found
    return text.strip() or None


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization, plus a little LaTeX: ``$``, ``\\text{...}`` and ``1,000`` separators."""
    text = _TEXT_MACRO.sub(r"\1", text).replace("$", "")
    text = _THOUSANDS.sub("", text).lower()
    text = text.translate(_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    """Bag-of-tokens F1 between two answers, after `normalize_answer`."""
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(reference).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = Counter(predicted) & Counter(expected)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted)
    recall = overlap / len(expected)
    return 2 * precision * recall / (precision + recall)
