"""Checking that a parsed call can travel to the tool server as JSON (``check_call``).

A set, bytes, NaN, an integer beyond 64 bits or a lone surrogate in a call's arguments is
that call's parse error, never a failure of the batch it would join.
"""

from __future__ import annotations

import math
from typing import Any

from trainer_client.parsers.types import ParsedCall

__all__ = ["MAX_NESTING", "check_call", "is_utf8", "printable"]

# Deepest nesting of brackets (or AST nodes) the parsers accept; real calls stay far below
# it, and it keeps json's and ast's recursion well inside Python's stack limit.
MAX_NESTING = 100
# JSON integers the tool server can decode (orjson: signed or unsigned 64-bit).
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_CLIP = 80


class _NotJson(ValueError):
    """A value that cannot be sent to the tool server as JSON: where it is, and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def printable(text: str) -> str:
    """``text`` safe to show the model: lone surrogates escaped, long text clipped."""
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return safe if len(safe) <= _CLIP else safe[: _CLIP - 3] + "..."


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_call(call: ParsedCall) -> ParsedCall | str:
    """The call with plain-JSON arguments, or an error message for the model.

    Everything that reaches the tool server must encode as JSON; checking each call on
    its own keeps one bad call from failing the others it would be batched with.
    """
    name = call.name
    if not isinstance(name, str) or not name.strip():
        return "the tool name must be a non-empty string"
    if not is_utf8(name):
        return f"the tool name '{printable(name)}' holds a lone surrogate (not valid UTF-8)"
    if not isinstance(call.arguments, dict):
        return f"{printable(name)}: the arguments must be an object, got {type(call.arguments).__name__}"
    arguments: dict[str, Any] = {}
    try:
        for key, value in _json_items(call.arguments, "arguments"):
            arguments[key] = _json_value(value, key, 1)
    except _NotJson as exc:
        return f"{printable(name)}: argument {printable(exc.path)} cannot be sent as JSON: {exc.reason}"
    return ParsedCall(name, arguments)


def _json_value(value: Any, path: str, depth: int) -> Any:
    """``value`` as plain JSON data (tuples become lists), or ``_NotJson``."""
    if depth > MAX_NESTING:
        raise _NotJson(path, f"nested deeper than {MAX_NESTING} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise _NotJson(path, "the integer does not fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson(path, f"{value} is not a JSON number")
        return value
    if isinstance(value, str):
        if not is_utf8(value):
            raise _NotJson(path, "the string holds a lone surrogate (not valid UTF-8)")
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _json_value(v, f"{path}[{k!r}]", depth + 1) for k, v in _json_items(value, path)}
    raise _NotJson(path, _not_json_reason(value))


def _json_items(value: dict[Any, Any], path: str) -> list[tuple[str, Any]]:
    for key in value:
        if not isinstance(key, str):
            raise _NotJson(path, f"object keys must be strings, got {type(key).__name__}")
        if not is_utf8(key):
            raise _NotJson(path, "an object key holds a lone surrogate (not valid UTF-8)")
    return list(value.items())


def _not_json_reason(value: Any) -> str:
    if isinstance(value, set | frozenset):
        return "a set is not JSON; use a list"
    if isinstance(value, bytes | bytearray):
        return "bytes are not JSON; use a string"
    if value is Ellipsis:
        return "... is not a JSON value"
    return f"a {type(value).__name__} is not a JSON value"
