"""The `calculator` tool: exact arithmetic on + - * / ** and parentheses, without `eval`.

The expression is parsed with `ast` and only numbers, the five operators, unary minus/plus and parentheses
are walked; anything else (names, calls, attributes, ``^``, ``%``, ``//``) is refused with a message naming
it. Numbers are integers or decimals (``0.1`` is exactly one tenth, never a binary float); values are exact
(`int` while integral, else `fractions.Fraction`), so ``1/3*3`` is ``1``. ``×``, ``÷`` and ``−`` are read as
``*``, ``/`` and ``-``.

Bounds: the expression's length (default 200 characters), a power's exponent (default |e| <= 10000) and the
size of every intermediate value (default 10000 bits, about 3000 digits), so no input can make the tool spin.
A fractional exponent is allowed only when the root is exact (``8**(1/3)`` is ``2``, ``2**(1/2)`` is refused:
an exact calculator cannot write an irrational number).

Output format (exact):

- an integer when the value is integral: ``42``, ``-7``;
- a decimal when the value has a finite decimal expansion: ``0.75``, ``-0.125``;
- otherwise the reduced fraction with a 15-significant-digit approximation: ``1/3 ≈ 0.333333333333333``.

Errors (division by zero, a bound exceeded, unsupported syntax) raise `CalculatorError`, a `ToolError`, so
the model reads them as ``tool_error`` observations. This module knows arithmetic; nothing about episodes.
"""

from __future__ import annotations

import ast
import math
from decimal import Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Annotated, Any, Final

import msgspec

from agent_env.errors import ToolError
from agent_env.schema import convert_arguments, struct_schema
from agent_env.tool import ToolBase, ToolContext

__all__ = ["CalculatorError", "CalculatorTool", "calculator", "evaluate", "format_number"]

_OPERATORS: Final[dict[type[ast.operator], str]] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.Pow: "**",
}
_REFUSED_OPERATORS: Final[dict[type[ast.operator], str]] = {
    ast.BitXor: "'^' is not supported; write powers with **",
    ast.Mod: "'%' is not supported",
    ast.FloorDiv: "'//' is not supported; use / (results are exact fractions)",
    ast.MatMult: "'@' is not supported",
}
_LOOKALIKES: Final = str.maketrans({"×": "*", "÷": "/", "−": "-"})
_MAX_ROOT_DEGREE: Final = 64

Exact = int | Fraction  # a value while it is computed (see `_Evaluator`)


class CalculatorError(ToolError):
    """The expression cannot be evaluated exactly within the calculator's bounds."""


class CalculatorArguments(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    expression: Annotated[str, msgspec.Meta(description="An arithmetic expression, e.g. (3 + 4.5) * 2 / 7 or 2**10.")]


def evaluate(expression: str, *, max_length: int = 200, max_exponent: int = 10_000, max_bits: int = 10_000) -> Fraction:
    """The exact value of `expression`, or `CalculatorError` saying why not."""
    value = _evaluate(expression, max_length=max_length, max_exponent=max_exponent, max_bits=max_bits)
    return value if isinstance(value, Fraction) else Fraction(value)


def _evaluate(expression: str, *, max_length: int, max_exponent: int, max_bits: int) -> Exact:
    text = expression.translate(_LOOKALIKES).strip()
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > max_length:
        raise CalculatorError(f"the expression is {len(text)} characters long; the limit is {max_length}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not a valid expression: {e.msg}") from e
    return _Evaluator(text, max_exponent=max_exponent, max_bits=max_bits).visit(tree.body)


class _Evaluator:
    """Walks the parsed expression. Values are exact: an `int` while they are integers (the common case, and
    about five times cheaper than a `Fraction`), a `Fraction` once a division or a decimal makes them not."""

    def __init__(self, source: str, *, max_exponent: int, max_bits: int) -> None:
        self.source = source
        self.max_exponent = max_exponent
        self.max_bits = max_bits

    def visit(self, node: ast.expr) -> Exact:
        if isinstance(node, ast.BinOp):
            op = type(node.op)
            if op not in _OPERATORS:
                raise CalculatorError(_REFUSED_OPERATORS.get(op, f"operator {op.__name__} is not supported"))
            return self._checked(self._apply(op, self.visit(node.left), self.visit(node.right)))
        if isinstance(node, ast.Constant):
            return self._number(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self.visit(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        raise CalculatorError(_describe_refused(node, self.source))

    def _number(self, node: ast.Constant) -> Exact:
        value: Any = node.value
        if type(value) is int:
            return self._checked(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError(f"{value!r} is not a number")
        literal = (ast.get_source_segment(self.source, node) or repr(value)).replace("_", "")
        try:
            exact = Decimal(literal)
        except InvalidOperation as e:
            raise CalculatorError(f"cannot read the number {literal!r}") from e
        if not exact.is_finite() or abs(exact.adjusted()) > self.max_exponent:
            raise CalculatorError(f"the number {literal!r} is out of range")
        return self._checked(_simplest(Fraction(exact)))

    def _apply(self, op: type[ast.operator], left: Exact, right: Exact) -> Exact:
        if op is ast.Add:
            return left + right
        if op is ast.Sub:
            return left - right
        if op is ast.Mult:
            return left * right
        if op is ast.Div:
            if right == 0:
                raise CalculatorError("division by zero", hint="The divisor evaluates to 0; check the expression.")
            return _simplest(Fraction(left) / right)
        return self._power(left, right)

    def _power(self, base: Exact, exponent: Exact) -> Exact:
        if exponent.denominator != 1:
            degree = exponent.denominator
            if degree > _MAX_ROOT_DEGREE:
                raise CalculatorError(f"a root of degree {degree} is not supported")
            return self._power(_exact_root(base, degree), exponent.numerator)
        power = exponent.numerator
        if abs(power) > self.max_exponent:
            raise CalculatorError(f"the exponent {power} is too large; the limit is {self.max_exponent}")
        if base == 0 and power < 0:
            raise CalculatorError("division by zero (0 raised to a negative power)")
        largest = max(abs(base.numerator), base.denominator)
        if largest > 1 and abs(power) * math.log2(largest) > self.max_bits:
            raise CalculatorError(f"the result would be larger than {self.max_bits} bits")
        if isinstance(base, int) and power >= 0:
            whole: int = base**power  # int ** non-negative int is an int (typeshed says Any)
            return whole
        return _simplest(Fraction(base) ** power)  # an int's negative power is a float; a Fraction's is exact

    def _checked(self, value: Exact) -> Exact:
        if max(value.numerator.bit_length(), value.denominator.bit_length()) > self.max_bits:
            raise CalculatorError(f"an intermediate value is larger than {self.max_bits} bits")
        return value


def _simplest(value: Fraction) -> Exact:
    """`value` as an int when it is one (so the integer path stays on ints)."""
    return value.numerator if value.denominator == 1 else value


def _describe_refused(node: ast.expr, source: str) -> str:
    segment = ast.get_source_segment(source, node) or type(node).__name__
    if isinstance(node, ast.Name):
        return f"unknown name {node.id!r}: only numbers, + - * / ** and parentheses are allowed"
    if isinstance(node, ast.Call):
        return f"function calls are not supported ({segment!r})"
    return f"{segment!r} is not supported: only numbers, + - * / ** and parentheses are allowed"


def _integer_root(n: int, k: int) -> int:
    """floor(n ** (1/k)) for n >= 0, by Newton's method on integers."""
    if n < 2:
        return n
    x = 1 << -(-n.bit_length() // k)
    while True:
        y = ((k - 1) * x + n // x ** (k - 1)) // k
        if y >= x:
            return x
        x = y


def _exact_root(value: Exact, degree: int) -> Fraction:
    if value < 0 and degree % 2 == 0:
        raise CalculatorError(f"an even root ({degree}) of a negative number is not a real number")
    sign = -1 if value < 0 else 1
    num, den = abs(value.numerator), value.denominator
    root_num, root_den = _integer_root(num, degree), _integer_root(den, degree)
    if root_num**degree != num or root_den**degree != den:
        raise CalculatorError(
            "the result is irrational and this calculator is exact",
            hint="Only exact roots are supported (e.g. 9**(1/2)); compute an approximation another way.",
        )
    return sign * Fraction(root_num, root_den)


def format_number(value: Fraction | int) -> str:
    """Exact text for `value` (see the module docstring for the format)."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den == 1:
        places = max(twos, fives)
        scaled = abs(value.numerator) * 10**places // value.denominator
        digits = str(scaled).rjust(places + 1, "0")
        sign = "-" if value < 0 else ""
        return f"{sign}{digits[:-places]}.{digits[-places:]}"
    with localcontext() as context:
        context.prec = 15
        approx = Decimal(value.numerator) / Decimal(value.denominator)
    return f"{value.numerator}/{value.denominator} ≈ {approx}"


class CalculatorTool(ToolBase):
    """The calculator as a tool; limits are configurable per instance.

    It runs on the caller's loop (``event_loop = "shared"``): its work is bounded by the limits (well under a
    millisecond at the defaults) and never blocks, so a thread and a loop per call would only add cost. Measured
    (`bench/bench_tool_isolation.py`): 128 concurrent calls while one other thread keeps the GIL busy, as the
    `hf` engine's does during rollouts, take 0.9-1.3 s isolated and 0.02-0.06 s shared (about 40x)."""

    event_loop = "shared"

    def __init__(
        self,
        *,
        name: str = "calculator",
        max_length: int = 200,
        max_exponent: int = 10_000,
        max_bits: int = 10_000,
        timeout_s: float | None = 5.0,
    ) -> None:
        self.name = name
        self.description = (
            "Evaluate an arithmetic expression exactly: integers and decimals with + - * / ** and "
            "parentheses. Returns an integer, an exact decimal, or a fraction p/q with an approximation."
        )
        self.parameters = struct_schema(CalculatorArguments)
        self.timeout_s = timeout_s
        self.max_length = max_length
        self.max_exponent = max_exponent
        self.max_bits = max_bits

    def parse_arguments(self, arguments: dict[str, Any]) -> CalculatorArguments:
        return convert_arguments(arguments, CalculatorArguments)

    async def call(self, arguments: CalculatorArguments, context: ToolContext) -> str:
        value = _evaluate(
            arguments.expression,
            max_length=self.max_length,
            max_exponent=self.max_exponent,
            max_bits=self.max_bits,
        )
        return format_number(value)


calculator: Final = CalculatorTool()
"""A ready calculator with the default limits (stateless, safe to share)."""
