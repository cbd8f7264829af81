"""The texts a rollout shows the model besides tool results' own content.

A result's text (``result_text``, valid UTF-8: ``valid_utf8``), the refusal of a tool
not available yet (``HIDDEN_TOOL``), the calls of a turn that did not parse
(``parse_errors_text``) or were over its limit (``not_run_text``), and the announcement of
tools a later user turn makes available (``announce_tools``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

import protocol
from trainer_client.templates.codec import valid_utf8

__all__ = ["HIDDEN_TOOL", "announce_tools", "not_run_text", "parse_errors_text", "result_text"]

HIDDEN_TOOL = "Error (unknown_tool): no tool named {name!r} is available to you"
# Parse errors (and names of calls not run) one observation lists; the rest are counted. A
# turn of 32k ``<tool_call>`` openers gives 32k errors (3.9 MB of text, which the
# observation budget would tokenize only to cut); a few tell the model what went wrong.
MAX_LISTED = 8


def announce_tools(schemas: Sequence[dict[str, Any]]) -> str:
    """The text that makes tools available mid-conversation, appended to the user's turn:
    the prompt's tool list was rendered once and cannot change without breaking the
    token prefix. One JSON schema a line, as chat templates list tools."""
    lines = "\n".join(orjson.dumps(schema).decode() for schema in schemas)
    return f"\n\nTools you can call from now on:\n<tools>\n{lines}\n</tools>"


def result_text(result: protocol.Result) -> str:
    """The observation a model sees for one result: its text, else its structured output.
    Valid UTF-8 (``valid_utf8``), so the messages, the splice and the rollout JSONL (orjson
    refuses a lone surrogate) all hold the same text."""
    text = result.text
    if not text and result.structured is not None:
        text = _json(result.structured)
    if result.is_error and not text and result.error is not None:
        text = f"Error ({result.error.kind.value}): {result.error.message}"
    return valid_utf8(text)


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, default=str).decode()
    except orjson.JSONEncodeError:  # a lone surrogate, which orjson refuses: valid_utf8 shows it
        return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


def parse_errors_text(errors: Sequence[str]) -> str:
    """The observation for a turn's calls that did not parse: the first ``MAX_LISTED``
    errors, one a line, and how many more there were."""
    lines = [f"Error: {message}" for message in errors[:MAX_LISTED]]
    if len(errors) > MAX_LISTED:
        lines.append(f"Error: {len(errors) - MAX_LISTED} more tool calls did not parse")
    return "\n".join(lines)


def not_run_text(names: Sequence[str], limit: int) -> str:
    """The observation for a turn's calls over ``max_calls_per_turn`` (``limit``): their
    names (the first ``MAX_LISTED``, then how many more)."""
    listed = ", ".join(names[:MAX_LISTED])
    if len(names) > MAX_LISTED:
        listed += f" and {len(names) - MAX_LISTED} more"
    return f"Error: not run ({listed}): at most {limit} tool calls per turn are allowed"
