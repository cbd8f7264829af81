"""Decoding model text as data: JSON, Python literals, Markdown fences. Nothing is run.

Model output is only ever read with ``json`` and ``ast.literal_eval``. Every failure, a
too deep or too large input included, is a ``json.JSONDecodeError`` or a ``SyntaxError``
/ ``ValueError`` that the formats turn into a message for the model. Each function is
linear in its input: a policy early in RL writes megabytes of brackets and backticks.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from typing import Any

from trainer_client.parsers.values import MAX_NESTING, is_utf8

__all__ = ["decode_json", "literal", "loads_json", "loads_tolerant", "parse_python", "strip_fences"]

_DECODER = json.JSONDecoder()
_FENCE_LANGUAGE = re.compile(r"[A-Za-z0-9_-]*")


def decode_json(text: str, start: int = 0) -> tuple[Any, int]:
    """The JSON value at ``start`` and where it ends (``raw_decode``).

    json's scanner counts its recursion: a value nested past Python's recursion limit
    fails with RecursionError, which like every other failure (an integer of more than
    4300 digits) becomes a ``JSONDecodeError``. Shallower values that still nest deeper
    than ``MAX_NESTING`` are ``check_call``'s error.
    """
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError(f"nesting deeper than {MAX_NESTING} levels", text, start) from None
    except ValueError as exc:
        raise json.JSONDecodeError(str(exc).split(";")[0], text, start) from None


def loads_json(text: str) -> Any:
    """``json.loads`` through ``decode_json``."""
    start = len(text) - len(text.lstrip())
    value, end = decode_json(text, start)
    if text[end:].strip():
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def parse_python(source: str) -> ast.expr:
    """One Python expression as an AST of bounded depth; ``SyntaxError`` otherwise.

    ``ast.parse`` itself fails on deep input with RecursionError or MemoryError (its
    parser stack); both, like a too deep tree, become a SyntaxError here.
    """
    if not is_utf8(source):
        raise SyntaxError("the text holds a lone surrogate (not valid UTF-8)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences in strings
            tree = ast.parse(source, mode="eval")
    except SyntaxError:
        raise
    except (MemoryError, RecursionError):
        raise SyntaxError("nested too deeply to parse") from None
    except ValueError as exc:
        raise SyntaxError(str(exc)) from None
    if _too_deep(tree):
        raise SyntaxError(f"nesting deeper than {MAX_NESTING} levels")
    return tree.body


def _too_deep(tree: ast.AST) -> bool:
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return False


def literal(node: ast.expr) -> Any:
    """``ast.literal_eval`` of a bounded-depth node; ValueError when not a literal."""
    try:
        return ast.literal_eval(node)
    except (TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(str(exc)) from None


def loads_tolerant(body: str) -> Any:
    """JSON, else a Python literal (single quotes, ``True``/``None``); raises the JSON error."""
    try:
        return loads_json(body)
    except json.JSONDecodeError as json_error:
        try:
            return literal(parse_python(body))
        except (SyntaxError, ValueError):
            raise json_error from None


def strip_fences(body: str) -> str:
    """The inside of a Markdown code fence (```` ```json ... ``` ````) without its language
    tag, else ``body``; stripped either way. (A regular expression with a lazy body here
    took quadratic time on long runs of whitespace.)"""
    body = body.strip()
    if len(body) < 6 or not body.startswith("```") or not body.endswith("```"):
        return body
    inside = body[3:-3]
    language = _FENCE_LANGUAGE.match(inside)
    return inside[language.end() if language else 0 :].strip()
