"""The texts a rollout shows the model besides tool results' own content.

A result's text (``result_text``), the refusal of a tool not available yet
(``HIDDEN_TOOL``), and the announcement of tools a later user turn makes available
(``announce_tools``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

import protocol

__all__ = ["HIDDEN_TOOL", "announce_tools", "result_text"]

HIDDEN_TOOL = "Error (unknown_tool): no tool named {name!r} is available to you"


def announce_tools(schemas: Sequence[dict[str, Any]]) -> str:
    """The text that makes tools available mid-conversation, appended to the user's turn:
    the prompt's tool list was rendered once and cannot change without breaking the
    token prefix. One JSON schema a line, as chat templates list tools."""
    lines = "\n".join(orjson.dumps(schema).decode() for schema in schemas)
    return f"\n\nTools you can call from now on:\n<tools>\n{lines}\n</tools>"


def result_text(result: protocol.Result) -> str:
    """The observation a model sees for one result: its text, else its structured output."""
    text = result.text
    if not text and result.structured is not None:
        text = orjson.dumps(result.structured, default=str).decode()
    if result.is_error and not text and result.error is not None:
        text = f"Error ({result.error.kind.value}): {result.error.message}"
    return text
