"""The calculator: exact integers, readable floats, and a clear error for every bound."""

from __future__ import annotations

import math

import orjson
import pytest

from protocol import ErrorKind, ToolError, ToolOutput, get_tool_meta
from tools.calculator import LIMITS, calculator, evaluate


def run(expression: str) -> ToolOutput:
    return calculator(expression)


@pytest.mark.parametrize(
    ("expression", "text", "value"),
    [
        ("1 + 2 * 3", "7", 7),
        ("(1 + 2) * 3", "9", 9),
        ("7 / 2", "3.5", 3.5),
        ("7 // 2", "3", 3),
        ("-7 // 2", "-4", -4),
        ("7 % 3", "1", 1),
        ("-(3 - 5)", "2", 2),
        ("+4", "4", 4),
        ("2 ** 10", "1024", 1024),
        ("2 ** -1", "0.5", 0.5),
        ("0.1 + 0.2", "0.3", 0.1 + 0.2),
        ("1e3 * 2", "2000", 2000.0),
        ("sqrt(16)", "4", 4.0),
        ("sqrt(2)", "1.4142135623731", math.sqrt(2)),
        ("log(8, 2)", "3", 3.0),
        ("ln(e)", "1", 1.0),
        ("log10(1000)", "3", 3.0),
        ("exp(0)", "1", 1.0),
        ("cos(0) + sin(0)", "1", 1.0),
        ("abs(-3.5)", "3.5", 3.5),
        ("round(2.567, 2)", "2.57", 2.57),
        ("round(7.5)", "8", 8),
        ("floor(-2.5) + ceil(2.1)", "0", 0),
        ("min(4, 2, 8) + max(1, 9)", "11", 11),
        ("2 * pi", "6.28318530717959", 2 * math.pi),
        ("3 × 4 ÷ 2", "6", 6.0),
        ("  12  ", "12", 12),
    ],
)
def test_happy_paths(expression: str, text: str, value: float) -> None:
    out = run(expression)
    assert out.content == [{"type": "text", "text": text}]
    assert out.structured == {"expression": expression, "result": value}
    assert type(out.structured["result"]) is type(value)


def test_integers_stay_exact() -> None:
    assert evaluate("2 ** 200 + 1") == 2**200 + 1
    assert run("12345678901234567890 * 98765432109876543210").content[0]["text"] == str(
        12345678901234567890 * 98765432109876543210
    )
    assert evaluate("10 ** 999") == 10**999  # 1000 digits: exactly at the limit


def test_big_integers_travel_as_strings_in_structured_output() -> None:
    out = run("2 ** 100")
    assert out.structured["result"] == str(2**100)
    orjson.dumps(out.structured)  # the server can serialise it
    assert run("2 ** 62").structured["result"] == 2**62


def test_metadata() -> None:
    meta = get_tool_meta(calculator)
    assert meta.name == "calculator"
    assert meta.cacheable is True
    assert meta.timeout_s == 5


def error_of(expression: str) -> str:
    with pytest.raises(ToolError) as info:
        evaluate(expression)
    assert info.value.kind is ErrorKind.INVALID_ARGUMENTS
    return info.value.message


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 10000", "exponent 10000 exceeds the limit 1000"),
        ("2 ** -5000", "exponent -5000 exceeds the limit 1000"),
        ("99 ** 999", "over the limit 1000"),
        ("10 ** 1000", "1001 digits, over the limit 1000"),
        ("10 ** 600 * 10 ** 600", "digits, over the limit 1000"),
        ("1" * 1001, "expression has 1001 characters, over the limit 1000"),
        ("-" * 60 + "1", "nested more than 50 levels"),
        ("exp(1000)", "too large"),
        ("1e308 * 10", "not a finite number"),
        ("1e400", "not a finite number"),
        ("(-8) ** 0.5", "complex"),
        ("sqrt(-1)", "sqrt() is undefined for -1"),
        ("log(0)", "log() is undefined for 0"),
        ("round(2.5, 1000)", "round() digits"),
        ("x + 1", "unknown name 'x'"),
        ("__import__('os')", "unknown function '__import__'"),
        ("(1).real", "unsupported syntax: Attribute"),
        ("[1, 2]", "unsupported syntax: List"),
        ("1 < 2", "unsupported syntax: Compare"),
        ("lambda: 1", "unsupported syntax: Lambda"),
        ("'a' * 3", "unsupported literal of type str"),
        ("2j", "unsupported literal of type complex"),
        ("True + 1", "unsupported literal of type bool"),
        ("2 ^ 3", "use ** for powers"),
        ("~1", "bitwise '~' is not supported"),
        ("1 << 2", "shift '<<' is not supported"),
        ("sqrt()", "sqrt() takes 1 argument(s), got 0"),
        ("sqrt(x=4)", "takes no keyword arguments"),
        ("math.sqrt(4)", "only plain function calls"),
        ("1 +", "could not parse the expression"),
        ("", "expression is empty"),
        ("   ", "expression is empty"),
    ],
)
def test_errors_say_what_was_wrong(expression: str, message: str) -> None:
    assert message in error_of(expression)


def test_non_string_input_is_rejected() -> None:
    with pytest.raises(ToolError, match="must be a string"):
        evaluate(12)  # type: ignore[arg-type]


def test_limits_are_the_documented_ones() -> None:
    assert (LIMITS.max_length, LIMITS.max_depth, LIMITS.max_exponent, LIMITS.max_digits) == (
        1000,
        50,
        1000,
        1000,
    )
