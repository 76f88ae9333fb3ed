"""The `calculator` tool: exact arithmetic on + - * / ** and parentheses, without `eval`.

The expression is read as Python reads it: only numbers, the five operators, unary minus/plus and parentheses
are evaluated; anything else (names, calls, attributes, ``^``, ``%``, ``//``) is refused with a message naming
it. Numbers are integers or decimals (``0.1`` is exactly one tenth, never a binary float); values are exact
(`int` while integral, else `fractions.Fraction`), so ``1/3*3`` is ``1``. ``×``, ``÷`` and ``−`` are read as
``*``, ``/`` and ``-``.

Two readers, one result. A plain expression (integers and decimals such as ``12``, ``0.5``, the five operators,
parentheses, spaces and tabs) is read by `_read_plain`, a shunting-yard parser with Python's precedences: about
2.7 us where `ast.parse` takes 6 and the walk of its tree 4 more (a call went from 14.6 to 6.9 us). Anything else,
or anything it does not accept (``007``, ``1.2.3``, ``2 3``), goes to `ast`, whose messages say what is wrong.
Both evaluate in the same order, so a plain expression gives the value or the error `ast` would (the tests
compare the two on every text of the plain alphabet that hypothesis draws, and on generated expressions).

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
import re
from decimal import Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Annotated, Any, Final

import msgspec

from agent_env.errors import ToolError
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
_PLAIN_MAX_CHARS: Final = 1000  # longer texts go to `ast` (which also bounds the nesting)
_PLAIN_TEXT: Final = re.compile(r"[-+*/()0-9. \t]*")
_PLAIN_TOKENS: Final = re.compile(r"\*\*|[-+*/()]|[0-9.]+")
_BINARY: Final[dict[str, tuple[int, type[ast.operator]]]] = {
    "+": (1, ast.Add),
    "-": (1, ast.Sub),
    "*": (2, ast.Mult),
    "/": (2, ast.Div),
    "**": (4, ast.Pow),  # right-associative, and above the unary signs: -2**2 is -(2**2), 2**-1 is 2**(-1)
}
_UNARY_PRECEDENCE: Final = 3
_DIGITS: Final = frozenset("0123456789.")

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
    text = (expression if expression.isascii() else expression.translate(_LOOKALIKES)).strip()
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > max_length:
        raise CalculatorError(f"the expression is {len(text)} characters long; the limit is {max_length}")
    evaluator = _Evaluator(text, max_exponent=max_exponent, max_bits=max_bits)
    plain = _read_plain(text) if len(text) <= _PLAIN_MAX_CHARS else None
    if plain is not None:
        return evaluator.run(plain)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"not a valid expression: {e.msg}") from e
    return evaluator.visit(tree.body)


# A plain expression in postfix order: (kind, text) with kind _INT or _DECIMAL (a number's literal), _NEGATE, or
# _BINARY_OP (the operator's symbol). A unary plus leaves its operand as it is, so it is not written down.
_INT, _DECIMAL, _NEGATE, _BINARY_OP = range(4)
_Postfix = list[tuple[int, str]]


def _read_plain(text: str) -> _Postfix | None:
    """`text` in postfix order when it is a well-formed plain expression (see the module docstring), else None:
    then `ast` reads it, and says what is wrong. Shunting-yard with Python's precedences."""
    if not _PLAIN_TEXT.fullmatch(text):
        return None
    out: _Postfix = []
    stack: list[str] = []  # "(", binary operators, and "-u"/"+u" for the unary signs
    want_operand = True
    for token in _PLAIN_TOKENS.findall(text):
        if want_operand:
            if token[0] in _DIGITS:
                if token.isdigit():  # ASCII digits only (the text matched `_PLAIN_TEXT`)
                    if token[0] == "0" and token.strip("0"):
                        return None  # Python refuses leading zeros (``007``), not ``00``: let `ast` say so
                    out.append((_INT, token))
                elif token.count(".") == 1 and token != ".":
                    out.append((_DECIMAL, token))
                else:
                    return None  # ``1.2.3``, ``.``
                want_operand = False
            elif token == "(":
                stack.append("(")
            elif token == "-" or token == "+":
                stack.append(token + "u")
            else:
                return None
        elif token == ")":
            while stack and stack[-1] != "(":
                _emit(stack.pop(), out)
            if not stack:
                return None
            stack.pop()
        elif token in _BINARY:
            precedence = _BINARY[token][0]
            while stack and stack[-1] != "(":
                top = stack[-1]
                above = _UNARY_PRECEDENCE if top[-1] == "u" else _BINARY[top][0]
                if above < precedence or (above == precedence and token == "**"):
                    break
                _emit(stack.pop(), out)
            stack.append(token)
            want_operand = True
        else:
            return None  # an operand right after an operand (``2 3``, ``2(3)``)
    if want_operand or "(" in stack:
        return None
    while stack:
        _emit(stack.pop(), out)
    return out


def _emit(operator: str, out: _Postfix) -> None:
    if operator == "-u":
        out.append((_NEGATE, operator))
    elif operator != "+u":
        out.append((_BINARY_OP, operator))


class _Evaluator:
    """Walks the parsed expression. Values are exact: an `int` while they are integers (the common case, and
    about five times cheaper than a `Fraction`), a `Fraction` once a division or a decimal makes them not."""

    def __init__(self, source: str, *, max_exponent: int, max_bits: int) -> None:
        self.source = source
        self.max_exponent = max_exponent
        self.max_bits = max_bits

    def run(self, postfix: _Postfix) -> Exact:
        """The value of a plain expression (`_read_plain`), in the order `visit` takes the same tree."""
        values: list[Exact] = []
        for kind, text in postfix:
            if kind == _INT:
                values.append(self._checked(int(text)))
            elif kind == _DECIMAL:
                values.append(self._decimal(text))
            elif kind == _NEGATE:
                values[-1] = -values[-1]
            else:
                right = values.pop()
                values[-1] = self._checked(self._apply(_BINARY[text][1], values[-1], right))
        return values[0]

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
        return self._decimal((ast.get_source_segment(self.source, node) or repr(value)).replace("_", ""))

    def _decimal(self, literal: str) -> Exact:
        """A decimal literal's exact value (``0.1`` is one tenth)."""
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
        if type(value) is int:
            if value.bit_length() > self.max_bits:
                raise CalculatorError(f"an intermediate value is larger than {self.max_bits} bits")
            return value
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

    It runs in place (``event_loop = "inline"``): its work is bounded by the limits (well under a millisecond at
    the defaults) and never awaits, so neither a thread and a loop per call nor a task is worth its cost.
    Measured: 128 concurrent calls while one other thread keeps the GIL busy, as the `hf` engine's does during
    rollouts, take 0.9-1.3 s isolated and 0.02-0.06 s on the caller's loop (`bench/bench_tool_isolation.py`);
    in place, a call through the runner takes 14.0 us where a shared one took 17.7 (see `tool_runner.py`)."""

    event_loop = "inline"
    arguments_type = CalculatorArguments

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
        self.timeout_s = timeout_s
        self.max_length = max_length
        self.max_exponent = max_exponent
        self.max_bits = max_bits

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
