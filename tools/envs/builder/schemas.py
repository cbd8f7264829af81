"""The JSON schema each stage's answer must match (checked before the stage's own checks)."""

from __future__ import annotations

from typing import Any

from tools.envs.pack import SCALING_OPERATIONS

__all__ = ["DECOMPOSITION", "DOCUMENTS", "FUNCTION", "TASKS"]

_SLUG = {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,47}$"}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 2000}
_SLUGS = {"type": "array", "items": _SLUG}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_FIELD_TYPES = ["string", "integer", "number", "boolean", "array", "object"]


def _array(items: dict[str, Any], most: int) -> dict[str, Any]:
    return {"type": "array", "minItems": 1, "maxItems": most, "items": items}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
    }


_FIELD = _object(
    {"name": _SLUG, "type": {"enum": _FIELD_TYPES}, "description": {"type": "string"}}, ["name", "type"]
)
_ENTITY = _object({"name": _SLUG, "key": _SLUG, "fields": _array(_FIELD, 16)})
_CAPABILITY = _object(
    {"name": _SLUG, "description": _TEXT, "kind": {"enum": ["read", "write"]}, "entities": _SLUGS}
)
DECOMPOSITION: dict[str, Any] = _object(
    {
        "domain": _SLUG,
        "description": _TEXT,
        "entities": _array(_ENTITY, 8),
        "capabilities": _array(_CAPABILITY, 16),
    }
)

_TOOL = _object(
    {
        "name": _SLUG,
        "description": _TEXT,
        "parameters": {"type": "object"},
        "output": _TEXT,
        "reads": _SLUGS,
        "writes": _SLUGS,
    }
)
DOCUMENTS: dict[str, Any] = _object(
    {
        "tools": _array(_TOOL, 16),
        "initial_state": {"type": "object", "additionalProperties": _array({"type": "object"}, 200)},
        "policy": {"type": "string"},
    },
    ["tools", "initial_state"],
)

FUNCTION: dict[str, Any] = _object({"name": _SLUG, "source": {"type": "string", "minLength": 10}})

_CALL = _object(
    {
        "id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,16}$"},
        "name": _SLUG,
        "arguments": {"type": "object"},
        "depends_on": _STRINGS,
        "compare": {"type": ["array", "null"], "items": {"type": "string"}},
    },
    ["id", "name", "arguments"],
)
_TASK = _object(
    {
        "prompt": _TEXT,
        "calls": _array(_CALL, 8),
        "answer": {"type": ["string", "null"]},
        "communicate": _STRINGS,
        "distractors": _SLUGS,
        "scaling": {"type": "array", "items": {"enum": list(SCALING_OPERATIONS)}},
    },
    ["prompt", "calls"],
)
TASKS: dict[str, Any] = _object({"tasks": _array(_TASK, 20)})
