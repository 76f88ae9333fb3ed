"""The calculator: exact arithmetic, refused syntax, bounds, output format."""

from __future__ import annotations

import ast
import asyncio
import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_env.tool_runner import ToolRunner
from agent_env.tools.calculator import (
    CalculatorError,
    CalculatorTool,
    _Evaluator,
    _read_plain,
    calculator,
    evaluate,
    format_number,
)
from agent_protocol.types import ToolCall


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", Fraction(7)),
        ("(1 + 2) * 3", Fraction(9)),
        ("7 / 2", Fraction(7, 2)),
        ("1/3 * 3", Fraction(1)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("-2 ** 2", Fraction(-4)),
        ("(-2) ** 3", Fraction(-8)),
        ("2 ** -2", Fraction(1, 4)),
        ("2 ** 3 ** 2", Fraction(512)),
        ("+5 - -5", Fraction(10)),
        ("1e3 / 8", Fraction(125)),
        ("1_000 * 3", Fraction(3000)),
        ("9 ** 0.5", Fraction(3)),
        ("(8/27) ** (1/3)", Fraction(2, 3)),
        ("(-8) ** (1/3)", Fraction(-2)),
        ("4 ** (3/2)", Fraction(8)),
        ("12 × 3 ÷ 4 − 1", Fraction(8)),
        ("123456789012345678901234567890 * 10", Fraction(1234567890123456789012345678900)),
    ],
)
def test_exact_values(expression: str, value: Fraction) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("1 / 0", "division by zero"),
        ("1 / (2 - 2)", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ^ 3", "write powers with **"),
        ("7 % 3", "'%' is not supported"),
        ("7 // 3", "'//' is not supported"),
        ("x + 1", "unknown name 'x'"),
        ("__import__('os')", "function calls are not supported"),
        ("(1).real", "is not supported"),
        ("'a' * 3", "is not a number"),
        ("True + 1", "is not a number"),
        ("1 +", "not a valid expression"),
        ("", "empty"),
        ("2 ** 100000", "exponent 100000 is too large"),
        ("10 ** 5000", "larger than 10000 bits"),
        ("(10 ** 1000) ** 5", "larger than 10000 bits"),
        ("2 ** 0.5", "irrational"),
        ("(-4) ** 0.5", "not a real number"),
        ("1e99999", "out of range"),
        ("1" + "+1" * 150, "the limit is 200"),
        ("[1, 2]", "is not supported"),
    ],
)
def test_errors_say_why(expression: str, fragment: str) -> None:
    with pytest.raises(CalculatorError) as caught:
        evaluate(expression)
    assert fragment in caught.value.message


def test_bounds_are_configurable() -> None:
    assert evaluate("2 ** 20000", max_exponent=20_000, max_bits=30_000) == 2**20000
    with pytest.raises(CalculatorError, match="limit is 10"):
        evaluate("1 + 2 + 3 + 4", max_length=10)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Fraction(42), "42"),
        (Fraction(-7), "-7"),
        (Fraction(3, 4), "0.75"),
        (Fraction(-1, 8), "-0.125"),
        (Fraction(1, 20), "0.05"),
        (Fraction(1, 3), "1/3 ≈ 0.333333333333333"),
        (Fraction(-2, 7), "-2/7 ≈ -0.285714285714286"),
    ],
)
def test_output_format(value: Fraction, text: str) -> None:
    assert format_number(value) == text


def test_through_the_runner_errors_are_tool_error_observations() -> None:
    runner = ToolRunner([calculator, CalculatorTool(name="calc_small", max_length=5)])
    calls = [
        ToolCall(id="a", name="calculator", arguments={"expression": "(3 + 4.5) * 2 / 7"}),
        ToolCall(id="b", name="calculator", arguments={"expression": "1/0"}),
        ToolCall(id="c", name="calculator", arguments={"expr": "1"}),
        ToolCall(id="d", name="calc_small", arguments={"expression": "1+1+1+1"}),
    ]
    ok, zero, bad_field, too_long = asyncio.run(runner.run(calls))
    assert ok.ok and ok.content == "15/7 ≈ 2.14285714285714"
    assert zero.code == "tool_error" and json.loads(zero.content)["error"]["message"] == "division by zero"
    assert bad_field.code == "invalid_arguments" and "`expr`" in json.loads(bad_field.content)["error"]["message"]
    assert too_long.code == "tool_error"
    assert calculator.spec.parameters["properties"]["expression"]["type"] == "string"


def _trees(depth: int) -> st.SearchStrategy[tuple[str, Fraction | None]]:
    """Expressions with their exact value (None where a division by zero happens), computed here with
    Fraction arithmetic on the tree: independent of the calculator's int-while-integral path."""
    number = st.one_of(
        st.integers(-50, 50).map(lambda n: (f"({n})", Fraction(n))),
        st.decimals(-20, 20, places=2, allow_nan=False).map(lambda d: (f"({d})", Fraction(d))),
    )
    if depth == 0:
        return number

    def combine(
        left: tuple[str, Fraction | None], op: str, right: tuple[str, Fraction | None]
    ) -> tuple[str, Fraction | None]:
        (lt, lv), (rt, rv) = left, right
        text = f"({lt} {op} {rt})"
        if lv is None or rv is None:
            return text, None
        if op == "/":
            return text, None if rv == 0 else lv / rv
        return text, {"+": lv + rv, "-": lv - rv, "*": lv * rv}[op]

    sub = _trees(depth - 1)
    power = st.tuples(sub, st.integers(-3, 3)).map(
        lambda t: (
            f"({t[0][0]}) ** {t[1]}",
            None if t[0][1] is None or (t[0][1] == 0 and t[1] < 0) else t[0][1] ** t[1],
        )
    )
    return st.one_of(number, power, st.builds(combine, sub, st.sampled_from("+-*/"), sub))


@given(_trees(3))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_the_integer_path_gives_the_exact_value_of_any_expression(case: tuple[str, Fraction | None]) -> None:
    text, value = case
    if value is None:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(text, max_length=10_000)
        return
    got = evaluate(text, max_length=10_000)
    assert type(got) is Fraction
    assert got == value
    assert format_number(got) == format_number(value)


def _by_ast(text: str) -> Fraction | str:
    """What the `ast` reader makes of `text`: its value, or the calculator's message (the reference)."""
    evaluator = _Evaluator(text, max_exponent=10_000, max_bits=10_000)
    try:
        return Fraction(evaluator.visit(ast.parse(text, mode="eval").body))
    except SyntaxError:
        return "syntax error"
    except CalculatorError as e:
        return e.message


def _by_plain(text: str) -> Fraction | str | None:
    """What the plain reader makes of `text`: None when it leaves it to `ast`."""
    postfix = _read_plain(text)
    if postfix is None:
        return None
    try:
        return Fraction(_Evaluator(text, max_exponent=10_000, max_bits=10_000).run(postfix))
    except CalculatorError as e:
        return e.message


@given(st.text(alphabet="0123456789.+-*/() \t", max_size=24))
@settings(max_examples=3000, deadline=None, derandomize=True)
def test_the_plain_reader_agrees_with_ast_on_any_text_of_its_alphabet(text: str) -> None:
    """Any text of numbers, operators, parentheses and blanks: where the plain reader gives an answer it is the
    one `ast` gives (value, or the same error in the same order); where `ast` gives a value, the plain reader
    gives it too (it leaves to `ast` only what is malformed or refused, such as ``//`` and ``007``)."""
    text = text.strip()
    reference, plain = _by_ast(text), _by_plain(text)
    if plain is not None:
        assert plain == reference, text
    elif isinstance(reference, Fraction):
        raise AssertionError(f"{text!r} has the value {reference} and the plain reader refused it")


@given(_trees(3))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_the_plain_reader_reads_every_generated_expression(case: tuple[str, Fraction | None]) -> None:
    text, _ = case
    assert _read_plain(text) is not None, text
    assert _by_plain(text) == _by_ast(text)


@pytest.mark.parametrize(
    "text",
    ["-2 ** 2", "2 ** -3 * 4", "2 ** 3 ** 2", "--1", "+-+1", "-(2) ** 2", "2 * -3 ** 2", "(1 + 2) * 3 - 4 / 8",
     "1 - 2 - 3", "64 / 4 / 2", "2 ** -2 ** -1", "\t7 *\t(1.5 - .5) ", "00 + 0.50 + 5.", "1 / (2 - 2) + 1 / 0"],
)  # fmt: skip
def test_the_plain_reader_follows_pythons_precedence(text: str) -> None:
    assert _read_plain(text.strip()) is not None
    assert _by_plain(text.strip()) == _by_ast(text.strip())


@pytest.mark.parametrize("text", ["2 // 3", "007", "1.2.3", "2 3", "2(3)", "()", "(1", "1)", "1 +", "* 2", "2 * * 3"])
def test_the_plain_reader_leaves_what_it_does_not_accept_to_ast(text: str) -> None:
    assert _read_plain(text) is None
    with pytest.raises(CalculatorError):
        evaluate(text)
