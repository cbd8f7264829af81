"""Regular expressions that come from outside, run in time linear in their input.

JSON Schema ``pattern`` and ``patternProperties`` come from upstream MCP servers and from
model-built packs, and jsonschema runs them with Python's ``re``, which backtracks:
``^(a+)+$`` against 27 characters takes seconds, doubling with each more, and holds the
GIL all the while, so the whole server stalls. Here they run on RE2 (Google's engine,
``google-re2``), whose matching time is linear in the input whatever the pattern.

RE2 has no lookaround and no backreferences. A pattern that uses them (or one too large
for its memory bound, or longer than ``MAX_PATTERN_CHARS``) is refused with ``UnsafePattern``,
before any argument is checked, never run with the backtracking engine instead.

``check_schema`` checks a schema against its metaschema the way jsonschema's own does, but
its ``format: regex`` check (every ``pattern`` and ``patternProperties`` key) compiles with
RE2: jsonschema's compiles with ``re``, whose parser took 25 s for one 1.4 MB pattern, holding
the GIL. It is still CPU work on untrusted input: servers run it off the event loop.

``linear_validator`` is the jsonschema validator to check untrusted schemas with; it
refuses a schema up front (``check_patterns``) rather than fail at its first call, and it
resolves ``$ref`` only within the schema (and the metaschemas): jsonschema's default
fetches a remote ``$ref`` over HTTP, blocking, from wherever the schema's author points it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import re2
import referencing
from jsonschema.exceptions import ValidationError

__all__ = [
    "MAX_PATTERN_CHARS",
    "UnsafePattern",
    "check_patterns",
    "check_schema",
    "compile_pattern",
    "linear_validator",
]

# One compiled pattern's memory (program and DFA cache; past it RE2 matches slower, still
# linear). The cache below then holds at most _CACHED * _MAX_MEM.
_MAX_MEM = 1 << 20
_CACHED = 256
# The longest pattern accepted (characters): real schemas' patterns are far shorter, and
# every one is compiled when its schema is checked.
MAX_PATTERN_CHARS = 4096


class UnsafePattern(ValueError):
    """A pattern the linear-time engine cannot run: the schema using it is refused."""


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = _MAX_MEM
    options.log_errors = False  # the refusal says why; RE2 would also print it to stderr
    return options


def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (its ``search`` is linear-time); UnsafePattern if RE2 cannot
    run it or it is longer than ``MAX_PATTERN_CHARS``."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UnsafePattern(
            f"pattern {_shown(pattern)} is {len(pattern):,} characters long, over the "
            f"{MAX_PATTERN_CHARS:,} allowed for schema patterns; shorten it (or drop it: the tool "
            "can check its own arguments)"
        )
    return _compiled(pattern)


@functools.lru_cache(maxsize=_CACHED)
def _compiled(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        why = (
            exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        )
        raise UnsafePattern(
            f"pattern {_shown(pattern)} cannot run on RE2, the linear-time engine used for schema "
            f"patterns ({why}); rewrite it without lookaround (?=, ?!, ?<=) or backreferences (\\1), "
            "and use \\z rather than \\Z"
        ) from None


def _shown(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 120 else pattern[:120] + "…")


def _patterns(schema: Any) -> Iterator[str]:
    """Every ``pattern`` value and ``patternProperties`` key anywhere in the document.

    Anywhere, not only where a keyword is read: a ``$ref`` can point into any part of it.
    Iterative: a deeply nested schema must not overflow the stack here.
    """
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            if isinstance(node.get("pattern"), str):
                yield node["pattern"]
            if isinstance(node.get("patternProperties"), Mapping):
                yield from (key for key in node["patternProperties"] if isinstance(key, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _has_key(schema: Any, key: str) -> bool:
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            if key in node:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def check_patterns(schema: Any) -> None:
    """Raise UnsafePattern unless every pattern of ``schema`` runs on RE2."""
    patterns = list(_patterns(schema))
    for pattern in patterns:
        compile_pattern(pattern)
    if patterns and _has_key(schema, "patternProperties") and _has_key(schema, "unevaluatedProperties"):
        # jsonschema matches patternProperties with ``re`` itself when it looks for the
        # evaluated properties: that path cannot be given RE2 from outside.
        raise UnsafePattern(
            "the schema combines patternProperties with unevaluatedProperties, which the "
            "linear-time pattern check does not support; use additionalProperties instead"
        )


def _is_re2_pattern(instance: object) -> bool:
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


@functools.cache
def _formats(cls: type) -> jsonschema.FormatChecker:
    """``cls``'s format checks, ``regex`` on RE2 (bounded) instead of ``re``."""
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = {**cls.FORMAT_CHECKER.checkers, "regex": (_is_re2_pattern, UnsafePattern)}
    return checker


def check_schema(schema: Any, default: type = jsonschema.Draft202012Validator) -> None:
    """Check ``schema`` against its metaschema (its ``$schema``, else ``default``) without ever
    compiling its patterns with ``re``.

    Raises UnsafePattern for a pattern RE2 cannot run (or too long), before anything else, and
    jsonschema.SchemaError for a schema its metaschema refuses.
    """
    check_patterns(schema)
    cls = jsonschema.validators.validator_for(schema, default=default)
    cls.check_schema(schema, format_checker=_formats(cls))


# ------------------------------------------------------------------ jsonschema keywords
# jsonschema's own, with ``re.search`` replaced by RE2's search.


def _search(pattern: str, text: str) -> bool:
    return compile_pattern(pattern).search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [
        key
        for key in instance
        if key not in properties and not any(_search(pattern, key) for pattern in patterns)
    ]


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            listed = ", ".join(repr(extra) for extra in sorted(extras, key=str))
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({listed} {verb} unexpected)")


_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


@functools.cache
def _linear(cls: type) -> Any:
    keywords = {name: check for name, check in _KEYWORDS.items() if name in cls.VALIDATORS}
    return jsonschema.validators.extend(cls, keywords)


def linear_validator(
    schema: Mapping[str, Any] | bool, default: type = jsonschema.Draft202012Validator
) -> Any:
    """A jsonschema validator for ``schema`` (its ``$schema``, else ``default``) whose patterns run on RE2.

    Raises UnsafePattern for a pattern RE2 cannot run. The schema itself is not checked
    against its metaschema here: callers do that first (``check_schema``).
    """
    check_patterns(schema)
    cls = jsonschema.validators.validator_for(schema, default=default)
    return _linear(cls)(
        schema, registry=referencing.Registry()
    )  # no retrieval: a remote $ref is unresolvable
