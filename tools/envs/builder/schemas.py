"""The JSON schema each stage's answer must match (checked before the stage's own checks)."""

from __future__ import annotations

from typing import Any

from tools.envs.pack import SCALING_OPERATIONS

__all__ = ["DECOMPOSITION", "DOCUMENTS", "FUNCTION", "TASKS"]

_SLUG = {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,47}$"}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 2000}
_FIELD_TYPES = ["string", "integer", "number", "boolean", "array", "object"]


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
    }


DECOMPOSITION: dict[str, Any] = _object(
    {
        "domain": _SLUG,
        "description": _TEXT,
        "entities": {
            "type": "array",
            "minItems": 1,
            "maxItems": 8,
            "items": _object(
                {
                    "name": _SLUG,
                    "key": _SLUG,
                    "fields": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 16,
                        "items": _object(
                            {
                                "name": _SLUG,
                                "type": {"enum": _FIELD_TYPES},
                                "description": {"type": "string"},
                            },
                            ["name", "type"],
                        ),
                    },
                }
            ),
        },
        "capabilities": {
            "type": "array",
            "minItems": 1,
            "maxItems": 16,
            "items": _object(
                {
                    "name": _SLUG,
                    "description": _TEXT,
                    "kind": {"enum": ["read", "write"]},
                    "entities": {"type": "array", "items": _SLUG},
                }
            ),
        },
    }
)

DOCUMENTS: dict[str, Any] = _object(
    {
        "tools": {
            "type": "array",
            "minItems": 1,
            "maxItems": 16,
            "items": _object(
                {
                    "name": _SLUG,
                    "description": _TEXT,
                    "parameters": {"type": "object"},
                    "output": _TEXT,
                    "reads": {"type": "array", "items": _SLUG},
                    "writes": {"type": "array", "items": _SLUG},
                }
            ),
        },
        "initial_state": {
            "type": "object",
            "additionalProperties": {"type": "array", "minItems": 1, "items": {"type": "object"}},
        },
        "policy": {"type": "string"},
    },
    ["tools", "initial_state"],
)

FUNCTION: dict[str, Any] = _object({"name": _SLUG, "source": {"type": "string", "minLength": 10}})

TASKS: dict[str, Any] = _object(
    {
        "tasks": {
            "type": "array",
            "minItems": 1,
            "maxItems": 20,
            "items": _object(
                {
                    "prompt": _TEXT,
                    "calls": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 8,
                        "items": _object(
                            {
                                "id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,16}$"},
                                "name": _SLUG,
                                "arguments": {"type": "object"},
                                "depends_on": {"type": "array", "items": {"type": "string"}},
                                "compare": {"type": ["array", "null"], "items": {"type": "string"}},
                            },
                            ["id", "name", "arguments"],
                        ),
                    },
                    "answer": {"type": ["string", "null"]},
                    "communicate": {"type": "array", "items": {"type": "string"}},
                    "distractors": {"type": "array", "items": _SLUG},
                    "scaling": {"type": "array", "items": {"enum": list(SCALING_OPERATIONS)}},
                },
                ["prompt", "calls"],
            ),
        }
    }
)
