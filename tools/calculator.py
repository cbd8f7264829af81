"""A safe arithmetic calculator: the expression is parsed and walked, never evaluated.

The model sends text such as ``"(12.5 * 4) ** 2 / 7"``. ``ast.parse`` turns it into a
tree and :func:`evaluate` walks only the node types listed here, so nothing but
arithmetic can run. Every way arithmetic can eat CPU or memory is bounded before the
work is done: expression length, nesting depth, exponent size, and the number of
digits an integer result may have. Violations raise ``ToolError(INVALID_ARGUMENTS)``
with a message that says what was wrong, which the model sees as its observation.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from protocol import ErrorKind, ToolError, ToolOutput, tool

Number = int | float


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that keep one evaluation cheap (microseconds, a few KB)."""

    max_length: int = 1000  # characters in the expression
    max_depth: int = 50  # nesting of operations and parentheses in the tree
    max_exponent: int = 1000  # |b| in an integer power a ** b
    max_digits: int = 1000  # decimal digits of any integer, intermediate or final


LIMITS = Limits()

# Integers that JSON consumers (orjson on the server) can carry as numbers.
_JSON_INT_MIN, _JSON_INT_MAX = -(2**63), 2**63 - 1

_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}

_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}

# Operators a model may write meaning something else; say what to use instead.
_HINTS: dict[type[ast.AST], str] = {
    ast.BitXor: "'^' is bitwise xor in Python and is not supported; use ** for powers",
    ast.MatMult: "'@' is not an arithmetic operator",
    ast.BitAnd: "bitwise '&' is not supported",
    ast.BitOr: "bitwise '|' is not supported",
    ast.LShift: "shift '<<' is not supported",
    ast.RShift: "shift '>>' is not supported",
    ast.Invert: "bitwise '~' is not supported",
    ast.Not: "'not' is not supported",
}


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int) or abs(ndigits) > 100:
        raise ToolError("round() digits must be an integer between -100 and 100", ErrorKind.INVALID_ARGUMENTS)
    return round(x, ndigits)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


# name -> (function, min args, max args)
_FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    "sqrt": (math.sqrt, 1, 1),
    "log": (_log, 1, 2),
    "ln": (math.log, 1, 1),
    "log10": (math.log10, 1, 1),
    "log2": (math.log2, 1, 1),
    "exp": (math.exp, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "min": (lambda *xs: min(xs), 1, 64),
    "max": (lambda *xs: max(xs), 1, 64),
}

# Unicode operators models copy from text.
_NORMALIZE = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-"})


def _invalid(message: str) -> ToolError:
    return ToolError(message, ErrorKind.INVALID_ARGUMENTS)


def _digits(n: int, limit: int) -> int:
    """Decimal digits of ``n``: exact near the limit, estimated from the bit length far above it.

    The estimate avoids converting a huge integer to text just to learn that it is too big.
    """
    if n.bit_length() > limit * 3.33 + 16:
        return int(n.bit_length() * 0.30103) + 1
    return len(str(abs(n)))


def _check(value: Number, limits: Limits) -> Number:
    if isinstance(value, bool):  # comparisons are not parsed, but keep the type honest
        return int(value)
    if isinstance(value, int):
        digits = _digits(value, limits.max_digits)
        if digits > limits.max_digits:
            raise _invalid(f"integer result has about {digits} digits, over the limit {limits.max_digits}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _invalid("result is not a finite number (overflow or undefined operation)")
        return value
    if isinstance(value, complex):
        raise _invalid("result is a complex number; only real arithmetic is supported")
    raise _invalid(f"unsupported value type {type(value).__name__}")


class _Evaluator:
    """Walks an expression tree, accepting only numbers, arithmetic and the functions above."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def eval(self, node: ast.AST, depth: int = 0) -> Number:
        if depth > self.limits.max_depth:
            raise _invalid(f"expression is nested more than {self.limits.max_depth} levels deep")
        if isinstance(node, ast.Expression):
            return self.eval(node.body, depth + 1)
        if isinstance(node, ast.Constant):
            return _check(self._constant(node.value), self.limits)
        if isinstance(node, ast.Name):
            if node.id in _CONSTANTS:
                return _CONSTANTS[node.id]
            known = ", ".join(sorted(_CONSTANTS))
            raise _invalid(f"unknown name '{node.id}'; the known constants are {known}")
        if isinstance(node, ast.UnaryOp):
            op = _UNARY.get(type(node.op))
            if op is None:
                raise _invalid(_HINTS.get(type(node.op), f"unsupported operator {type(node.op).__name__}"))
            return _check(op(self.eval(node.operand, depth + 1)), self.limits)
        if isinstance(node, ast.BinOp):
            return self._binary(node, depth)
        if isinstance(node, ast.Call):
            return self._call(node, depth)
        raise _invalid(
            f"unsupported syntax: {type(node).__name__} (only numbers, + - * / // % **, and functions)"
        )

    @staticmethod
    def _constant(value: object) -> Number:
        if isinstance(value, bool) or not isinstance(value, int | float):
            kind = "complex" if isinstance(value, complex) else type(value).__name__
            raise _invalid(f"unsupported literal of type {kind}; only integers and decimals are allowed")
        return value

    def _binary(self, node: ast.BinOp, depth: int) -> Number:
        left = self.eval(node.left, depth + 1)
        right = self.eval(node.right, depth + 1)
        try:
            if isinstance(node.op, ast.Pow):
                return _check(self._power(left, right), self.limits)
            op = _BINARY.get(type(node.op))
            if op is None:
                raise _invalid(_HINTS.get(type(node.op), f"unsupported operator {type(node.op).__name__}"))
            return _check(op(left, right), self.limits)
        except ZeroDivisionError:
            raise _invalid("division by zero") from None
        except OverflowError:
            raise _invalid("result is too large for a floating-point number") from None

    def _power(self, base: Number, exponent: Number) -> Number:
        limits = self.limits
        if isinstance(exponent, int) and isinstance(base, int):
            if abs(exponent) > limits.max_exponent and abs(base) > 1:
                raise _invalid(f"exponent {exponent} exceeds the limit {limits.max_exponent}")
            if exponent > 0 and abs(base) > 1:
                digits = exponent * math.log10(abs(base))
                if digits > limits.max_digits:
                    raise _invalid(
                        f"{base} ** {exponent} would have about {int(digits) + 1} digits, "
                        f"over the limit {limits.max_digits}"
                    )
        return base**exponent  # float overflow raises OverflowError, handled by the caller

    def _call(self, node: ast.Call, depth: int) -> Number:
        if not isinstance(node.func, ast.Name):
            raise _invalid("only plain function calls such as sqrt(2) are supported")
        name = node.func.id
        entry = _FUNCTIONS.get(name)
        if entry is None:
            known = ", ".join(sorted(_FUNCTIONS))
            raise _invalid(f"unknown function '{name}'; the known functions are {known}")
        if node.keywords:
            raise _invalid(f"{name}() takes no keyword arguments")
        fn, low, high = entry
        if not low <= len(node.args) <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            raise _invalid(f"{name}() takes {expected} argument(s), got {len(node.args)}")
        args = [self.eval(arg, depth + 1) for arg in node.args]
        try:
            return _check(fn(*args), self.limits)
        except ValueError as exc:  # math domain errors: sqrt(-1), log(0)
            raise _invalid(f"{name}() is undefined for {', '.join(map(_format, args))} ({exc})") from None
        except ZeroDivisionError:
            raise _invalid("division by zero") from None
        except OverflowError:
            raise _invalid(f"{name}() result is too large for a floating-point number") from None


def evaluate(expression: str, limits: Limits = LIMITS) -> Number:
    """The value of an arithmetic expression; raises ToolError(INVALID_ARGUMENTS) on bad input."""
    if not isinstance(expression, str):
        raise _invalid(f"expression must be a string, got {type(expression).__name__}")
    text = expression.translate(_NORMALIZE).strip()
    if not text:
        raise _invalid("expression is empty")
    if len(text) > limits.max_length:
        raise _invalid(f"expression has {len(text)} characters, over the limit {limits.max_length}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        raise _invalid(f"could not parse the expression{where}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise _invalid(f"could not parse the expression: {exc}") from None
    return _Evaluator(limits).eval(tree)


def _format(value: Number) -> str:
    """Integers exactly; floats with up to 15 significant digits (0.1 + 0.2 -> 0.3, 4.0 -> 4)."""
    if isinstance(value, int):
        return str(value)
    return f"{value:.15g}"


def _structured_value(value: Number) -> Number | str:
    """A JSON-safe number: integers beyond 64 bits travel as exact decimal strings."""
    if isinstance(value, int) and not _JSON_INT_MIN <= value <= _JSON_INT_MAX:
        return str(value)
    return value


@tool(name="calculator", cacheable=True, timeout_s=5, blocking=False)  # bounded: microseconds
def calculator(
    expression: Annotated[
        str,
        "Arithmetic expression, e.g. '(3 + 4) * 2 ** 10 / 7'. Supports + - * / // % **, parentheses, "
        "pi, e, and sqrt, log, ln, log10, log2, exp, sin, cos, tan, floor, ceil, abs, round, min, max.",
    ],
) -> ToolOutput:
    """Evaluate an arithmetic expression exactly (integers) or to 15 significant digits (decimals)."""
    value = evaluate(expression)
    structured = {"expression": expression, "result": _structured_value(value)}
    return ToolOutput.text(_format(value), structured)
