"""Argument validation derived from a tool's signature (a TypedDict of the model's fields)."""

from __future__ import annotations

from typing import Annotated

import pydantic
import pytest

from tool_server.schema import derive_signature, format_validation_error


def tool_with_defaults(
    name: Annotated[str, "Who."],
    tags: Annotated[list[str], "Labels."] = [],  # noqa: B006 (a mutable default on purpose)
    count: int = 3,
    note: str | None = None,
) -> dict:
    """A tool with a required argument, a mutable default and optional ones."""
    return {}


def test_defaults_are_filled_and_mutable_ones_are_fresh_per_call() -> None:
    validate = derive_signature(tool_with_defaults, "t", None).validate
    first = validate({"name": "a"})
    assert first == {"name": "a", "tags": [], "count": 3, "note": None}
    first["tags"].append("x")
    first["extra"] = 1  # the dict is the caller's to add to
    assert validate({"name": "b"}) == {"name": "b", "tags": [], "count": 3, "note": None}


def test_coercion_and_errors_match_the_model_and_name_the_argument() -> None:
    signature = derive_signature(tool_with_defaults, "t", None)
    assert signature.validate({"name": "a", "count": "4"})["count"] == 4  # lax, like the model
    with pytest.raises(pydantic.ValidationError) as missing:
        signature.validate({"count": 1, "colour": "red"})
    message = format_validation_error(missing.value)
    assert "missing required argument 'name'" in message
    assert "unexpected argument 'colour'" in message
    with pytest.raises(pydantic.ValidationError) as wrong:
        signature.validate({"name": "a", "tags": "not a list"})
    assert "'tags'" in format_validation_error(wrong.value)
    # the schema the model gives MCP clients says the same
    schema = signature.input_schema
    assert schema["required"] == ["name"] and schema["additionalProperties"] is False
    assert schema["properties"]["count"]["default"] == 3
