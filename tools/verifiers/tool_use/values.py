"""Argument and output comparison for the ``tool_use`` reward (BFCL-style normalisation).

A model's call matches a gold call when the names are equal and every *compared*
argument agrees under these rules (``same_value``):

- **strings** agree after BFCL's standardisation: case-folded, with whitespace and the
  characters ``, . / - _ * ^`` removed and single quotes read as double quotes, so
  ``"April 1, 2024"``, ``"april 1,2024"`` and ``"April 1 2024"`` agree. Nothing else is
  dropped (``"$5"`` and ``"5"`` differ).
- **numbers**: ``int`` and ``float`` are interchangeable (``2 == 2.0``, as BFCL accepts an
  int for a float), within a relative tolerance of 1e-6 (absolute 1e-9 near zero) so
  ``0.1 + 0.2`` equals ``0.3``. ``bool`` is not a number (``True`` never equals ``1``),
  and a number never equals a numeric string (the schema says which it must be).
- **lists** are order-sensitive and compared element by element, unless the tool's
  input schema declares the array ``"uniqueItems": true`` (a set): then order is free.
- **objects** need the same keys with agreeing values (the property schemas recurse).
- ``None`` equals only ``None``.

Which arguments are compared: ``GoldCall.compare`` when set (everything else is
ignored); otherwise every gold argument, and an argument the call adds that the gold
lacks is tolerated only when it equals the schema's ``default`` for it (passing the
default explicitly changes nothing); likewise leaving out an argument whose gold value
is its default.

Outputs (``GoldCall.output``, when set) are compared with the same ``same_value``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

__all__ = ["argument_difference", "arguments_agree", "same_value", "standardize"]

_DROPPED = str.maketrans({c: None for c in " \t\n\r\f\v,./-_*^"} | {"'": '"'})
_REL_TOL = 1e-6
_ABS_TOL = 1e-9
_MISSING = object()


@lru_cache(maxsize=65536)  # gold values and a GRPO group's arguments repeat
def standardize(text: str) -> str:
    """BFCL's string form: no whitespace or ``,./-_*^``, case-folded, ``'`` read as ``"``."""
    return text.translate(_DROPPED).casefold()


def _is_number(value: Any) -> bool:
    return type(value) is int or type(value) is float


def same_value(model: Any, gold: Any, schema: Mapping[str, Any] | None = None) -> bool:
    """Whether a model's value agrees with the gold value (rules in the module docstring).

    ``schema`` is the JSON schema of this value in the tool's input schema, if known: it
    says whether an array is a set (``uniqueItems``) and how nested values are typed.
    """
    if type(model) is str and type(gold) is str:
        return model == gold or standardize(model) == standardize(gold)
    if model == gold and (type(model) is type(gold) or (_is_number(model) and _is_number(gold))):
        return (
            True  # equal in Python (containers compare in C; the schema check flags a nested bool/int mix-up)
        )
    if _is_number(model) and _is_number(gold):
        return model == gold or math.isclose(model, gold, rel_tol=_REL_TOL, abs_tol=_ABS_TOL)
    if isinstance(gold, list | tuple) and isinstance(model, list | tuple):
        if len(model) != len(gold):
            return False
        items = schema.get("items") if schema else None
        items = items if isinstance(items, Mapping) else None
        if schema and schema.get("uniqueItems") is True:
            return _same_unordered(list(model), list(gold), items)
        return all(same_value(m, g, items) for m, g in zip(model, gold, strict=True))
    if isinstance(gold, Mapping) and isinstance(model, Mapping):
        if model.keys() != gold.keys():
            return False
        properties = (schema or {}).get("properties") or {}
        return all(same_value(model[k], gold[k], properties.get(k)) for k in gold)
    if type(model) is bool or type(gold) is bool or model is None or gold is None:
        return model is gold
    return bool(model == gold) and type(model) is type(gold)


def _same_unordered(model: list[Any], gold: list[Any], items: Mapping[str, Any] | None) -> bool:
    """A perfect matching of agreeing elements (the lists are short; each gold used once)."""
    remaining = list(gold)
    for value in model:
        for index, candidate in enumerate(remaining):
            if same_value(value, candidate, items):
                del remaining[index]
                break
        else:
            return False
    return True


def arguments_agree(
    arguments: Mapping[str, Any],
    gold_arguments: Mapping[str, Any],
    compare: list[str] | None,
    properties: Mapping[str, Any],
) -> bool:
    """Whether ``arguments`` match the gold call's (the matching's hot path: no message built).

    ``properties`` is the tool's ``input_schema["properties"]`` (may be empty).
    """
    if compare is None and arguments == gold_arguments:
        return True  # the common case of a right call (values equal in Python agree)
    return _difference(arguments, gold_arguments, compare, properties) is None


def argument_difference(
    arguments: Mapping[str, Any],
    gold_arguments: Mapping[str, Any],
    compare: list[str] | None,
    properties: Mapping[str, Any],
) -> str | None:
    """Why ``arguments`` do not match the gold call's, in words, or None when they do."""
    found = _difference(arguments, gold_arguments, compare, properties)
    if found is None:
        return None
    name, problem = found
    mine, gold = arguments.get(name, _MISSING), gold_arguments.get(name, _MISSING)
    if problem == "missing":
        return f"argument {name!r} missing (gold {gold!r})"
    if problem == "unexpected":
        return f"argument {name!r} ({mine!r}) is not in the gold call"
    return f"argument {name!r} is {mine!r}, gold {gold!r}"


def _difference(
    arguments: Mapping[str, Any],
    gold_arguments: Mapping[str, Any],
    compare: list[str] | None,
    properties: Mapping[str, Any],
) -> tuple[str, str] | None:
    """The first argument that differs and how ("missing", "unexpected", "value"), or None."""
    names = gold_arguments.keys() if compare is None else compare
    for name in names:
        gold = gold_arguments.get(name, _MISSING)
        mine = arguments.get(name, _MISSING)
        if mine is _MISSING and gold is _MISSING:
            continue
        if mine is _MISSING:  # leaving out an argument whose gold value is the default is fine
            if not _is_default(gold, name, properties):
                return name, "missing"
        elif gold is _MISSING:
            return name, "unexpected"
        elif not same_value(mine, gold, properties.get(name)):
            return name, "value"
    if compare is None and not arguments.keys() <= gold_arguments.keys():
        for name in arguments.keys() - gold_arguments.keys():
            if not _is_default(arguments[name], name, properties):
                return name, "unexpected"
    return None


def _is_default(value: Any, name: str, properties: Mapping[str, Any]) -> bool:
    schema = properties.get(name) or {}
    default = schema.get("default", _MISSING)
    return default is not _MISSING and same_value(value, default, schema)
