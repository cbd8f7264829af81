"""Schema validity of calls for the ``tool_use`` reward: compiled checkers, cached per schema.

``jsonschema`` costs ~35 µs to validate one small call on this machine, which alone
would cap the reward at ~3k ten-call trajectories per second. Tool input schemas almost
always use a small subset of JSON Schema, so each schema is compiled once into a tree
of plain Python checks for that subset (``type``, ``properties``, ``required``,
``additionalProperties``, ``enum``, ``const``, ``items``, ``min/maxItems``,
``uniqueItems``, ``min/maxLength``, ``minimum``/``maximum`` and their exclusive forms),
with jsonschema's semantics (an integral float is an ``integer``; ``bool`` is neither
``integer`` nor ``number``; ``enum`` keeps ``true`` and ``1`` apart but ``1 == 1.0``).
A schema that uses any other validating keyword (``pattern``, ``anyOf``, ``$ref``,
``$schema``, …) is checked by ``jsonschema`` itself, its patterns run on RE2 in linear
time (``tools.patterns``: a schema's patterns are as untrusted as its arguments); a
pattern RE2 cannot run fails every call, and the message says why. ``jsonschema`` also
writes the message for an invalid call (the rare path), so messages read the same either way.
Annotations (``description``, ``title``, ``default``, ``format``, …) are ignored, as
jsonschema ignores them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

from tools.patterns import UnsafePattern, linear_validator

__all__ = ["compile_schema", "schema_problem"]

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset(
    ("description", "title", "default", "examples", "format", "$comment", "readOnly", "writeOnly",
     "deprecated", "$id", "contentMediaType", "contentEncoding", "nullable")
)  # fmt: skip
_SUPPORTED = frozenset(
    ("type", "properties", "required", "additionalProperties", "enum", "const", "items", "minItems",
     "maxItems", "uniqueItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
     "exclusiveMaximum")
)  # fmt: skip
# Keywords that validate something the subset does not: a schema using one goes to jsonschema.
_OTHER_VALIDATING = frozenset(
    ("$schema", "$ref", "$dynamicRef", "$defs", "definitions", "allOf", "anyOf", "oneOf", "not", "if",
     "then", "else", "pattern", "patternProperties", "propertyNames", "dependentRequired",
     "dependentSchemas", "dependencies", "prefixItems", "contains", "minContains", "maxContains",
     "additionalItems", "unevaluatedItems", "unevaluatedProperties", "multipleOf", "minProperties",
     "maxProperties")
)  # fmt: skip


class _Unsupported(Exception):
    """The schema needs jsonschema itself."""


def _is_type(value: Any, name: str) -> bool:
    kind = type(value)
    if name == "string":
        return kind is str
    if name == "integer":
        return kind is int or (kind is float and value.is_integer())
    if name == "number":
        return kind is int or kind is float
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "boolean":
        return kind is bool
    if name == "null":
        return value is None
    raise _Unsupported(name)


def json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality (``enum``/``const``/``uniqueItems``): bools apart from numbers."""
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    return bool(a == b) and (type(a) is type(b) or (type(a) in (int, float) and type(b) in (int, float)))


def _compile(schema: Any) -> Check:
    if schema is True or schema == {}:
        return lambda value: True
    if schema is False:
        return lambda value: False
    if not isinstance(schema, Mapping):
        raise _Unsupported("schema is not an object")
    keys = schema.keys()
    if keys & _OTHER_VALIDATING:
        raise _Unsupported(", ".join(sorted(keys & _OTHER_VALIDATING)))
    checks: list[Check] = []
    kind = schema.get("type")
    kinds: tuple[str, ...] = ()
    if kind is not None:
        kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        for name in kinds:
            _is_type(None, name)  # unknown type names go to jsonschema (it raises SchemaError)
        if kinds != ("object",):  # the object check below tests the type itself
            checks.append(
                (lambda v, k=kinds[0]: _is_type(v, k))
                if len(kinds) == 1
                else (lambda v, ks=kinds: any(_is_type(v, k) for k in ks))
            )
    if "enum" in keys:
        options = list(schema["enum"])
        checks.append(lambda v: any(json_equal(v, o) for o in options))
    if "const" in keys:
        const = schema["const"]
        checks.append(lambda v: json_equal(v, const))
    checks.extend(_number_checks(schema))
    checks.extend(_string_checks(schema))
    checks.extend(_array_checks(schema))
    checks.extend(_object_checks(schema, must_be_object=kinds == ("object",)))
    if len(checks) == 1:
        return checks[0]

    def check_all(value: Any) -> bool:
        for check in checks:  # noqa: SIM110 - a loop is ~2x faster than all() over a generator here
            if not check(value):
                return False
        return True

    return check_all


def _number_checks(schema: Mapping[str, Any]) -> list[Check]:
    out: list[Check] = []
    for key, test in (
        ("minimum", lambda v, b: v >= b),
        ("maximum", lambda v, b: v <= b),
        ("exclusiveMinimum", lambda v, b: v > b),
        ("exclusiveMaximum", lambda v, b: v < b),
    ):
        if key in schema:
            bound = schema[key]
            if type(bound) not in (int, float):
                raise _Unsupported(f"{key} {bound!r}")  # draft-4 boolean forms
            out.append(lambda v, b=bound, t=test: type(v) not in (int, float) or t(v, b))
    return out


def _string_checks(schema: Mapping[str, Any]) -> list[Check]:
    out: list[Check] = []
    if "minLength" in schema:
        low = schema["minLength"]
        out.append(lambda v: type(v) is not str or len(v) >= low)
    if "maxLength" in schema:
        high = schema["maxLength"]
        out.append(lambda v: type(v) is not str or len(v) <= high)
    return out


def _array_checks(schema: Mapping[str, Any]) -> list[Check]:
    out: list[Check] = []
    if "items" in schema:
        if not isinstance(schema["items"], Mapping | bool):
            raise _Unsupported("items as a list")
        item = _compile(schema["items"])
        out.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
    if "minItems" in schema:
        low = schema["minItems"]
        out.append(lambda v: not isinstance(v, list) or len(v) >= low)
    if "maxItems" in schema:
        high = schema["maxItems"]
        out.append(lambda v: not isinstance(v, list) or len(v) <= high)
    if schema.get("uniqueItems") is True:
        out.append(
            lambda v: (
                not isinstance(v, list)
                or not any(json_equal(v[i], v[j]) for i in range(len(v)) for j in range(i + 1, len(v)))
            )
        )
    return out


def _object_checks(schema: Mapping[str, Any], *, must_be_object: bool) -> list[Check]:
    """One check for ``required``, ``properties`` and ``additionalProperties`` (and the type)."""
    required = tuple(schema.get("required") or ())
    properties = {name: _compile(sub) for name, sub in (schema.get("properties") or {}).items()}
    extra = schema.get("additionalProperties", True)
    extra_check = None if extra is True else _compile(extra)
    if not (must_be_object or required or properties or extra_check is not None):
        return []

    def check_object(value: Any) -> bool:
        if not isinstance(value, dict):
            return not must_be_object
        for name in required:
            if name not in value:
                return False
        for name, item in value.items():
            check = properties.get(name)
            if check is not None:
                if not check(item):
                    return False
            elif extra_check is not None and not extra_check(item):
                return False
        return True

    return [check_object]


def compile_schema(schema: Mapping[str, Any]) -> Check:
    """A fast ``is_valid`` for ``schema``: the compiled subset, else jsonschema's own."""
    try:
        return _compile(schema)
    except _Unsupported:
        pass
    try:
        validator = _validator(schema)
    except UnsafePattern:
        return lambda arguments: False  # schema_problem says why

    def is_valid(arguments: Any) -> bool:
        try:
            return validator.is_valid(arguments)
        except (jsonschema.SchemaError, jsonschema.exceptions.UnknownType):
            return False  # a broken schema fails every call; schema_problem says why

    return is_valid


def _validator(schema: Mapping[str, Any]) -> Any:
    return linear_validator(schema)


def schema_problem(schema: Mapping[str, Any], arguments: Any) -> str:
    """jsonschema's message for invalid ``arguments`` (only called once a check failed)."""
    try:
        error = jsonschema.exceptions.best_match(_validator(schema).iter_errors(arguments))
    except UnsafePattern as exc:
        return f"the tool's input schema cannot be checked: {exc}"
    except jsonschema.SchemaError as exc:
        return f"the tool's input schema is invalid: {exc.message}"
    except jsonschema.exceptions.UnknownType as exc:
        return f"the tool's input schema is invalid: unknown type {exc.type!r}"
    if error is None:
        return "arguments do not match the input schema"
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message}"
