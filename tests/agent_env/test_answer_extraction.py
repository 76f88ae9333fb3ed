"""Answer extraction, normalization and token F1."""

from __future__ import annotations

import pytest

from agent_env.rewards.answer import (
    extract_answer,
    extract_answer_line,
    extract_answer_tag,
    extract_boxed,
    normalize_answer,
    token_f1,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}} and later \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("$\\boxed{x^{2}+1}$", "x^{2}+1"),
        ("\\fbox{7}", "7"),
        ("\\boxed 5.", "5"),
        ("no box here", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_extract_tags_and_lines() -> None:
    assert extract_answer_tag("<answer> Paris </answer> ... <answer>Lyon</answer>") == "Lyon"
    assert extract_answer_tag("nothing") is None
    assert extract_answer_line("Work...\nFinal answer: 12 apples.") == "12 apples"
    assert extract_answer_line("I think the answer is Paris.") == "Paris"
    assert extract_answer_line("no marker") is None


def test_auto_tries_each_form_then_the_whole_text() -> None:
    assert extract_answer("Answer: 3 but \\boxed{4}") == "4"
    assert extract_answer("<answer>b</answer> Answer: a") == "b"
    assert extract_answer("Answer: a") == "a"
    assert extract_answer("  just text  ") == "just text"
    assert extract_answer("   ") is None
    assert extract_answer("\\boxed{1}", "none") == "\\boxed{1}"
    assert extract_answer("Answer: a", "boxed") is None


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("$\\text{Paris}$", "paris"),
        ("1,000,000", "1000000"),
        ("An apple, a pear", "apple pear"),
    ],
)
def test_normalize(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


def test_token_f1() -> None:
    assert token_f1("the Eiffel Tower", "Eiffel tower") == 1.0
    assert token_f1("Paris France", "Paris") == pytest.approx(2 / 3)
    assert token_f1("Lyon", "Paris") == 0.0
    assert token_f1("", "") == 1.0
    assert token_f1("a", "Paris") == 0.0
