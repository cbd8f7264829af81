"""BFCL multi-turn data, read from the installed ``bfcl-eval`` package (never copied here).

An entry of a multi-turn category has user turns (``question``), the initial
configuration of the API classes it involves, and, in ``possible_answer/``, one list of
ground-truth calls per turn written as Python call strings (``cd(folder='x')``,
``sort('a.pdf')``). ``parse_call`` reads those with ``ast``: literal arguments only,
nothing is evaluated, and positional arguments get their names from the function
doc's parameter order (BFCL's own executor ``eval``s the strings; we never do).
"""

from __future__ import annotations

import ast
import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bfcl_eval.constants.category_mapping import MULTI_TURN_CATEGORY, VERSION_PREFIX
from bfcl_eval.constants.eval_config import MULTI_TURN_FUNC_DOC_PATH, POSSIBLE_ANSWER_PATH, PROMPT_PATH
from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

__all__ = ["CATEGORIES", "CLASSES", "Entry", "entries", "function_docs", "parse_call", "to_json_schema"]

CATEGORIES = tuple(MULTI_TURN_CATEGORY)
# The API classes of the multi-turn categories (the package's mapping also lists the web
# search and memory backends of the agentic categories, which need network or models).
CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)


@dataclass
class Entry:
    """One multi-turn entry: its turns, per-turn ground truth strings and scenario."""

    id: str
    turns: list[list[dict[str, Any]]]
    ground_truth: list[list[str]]
    initial_config: dict[str, Any]
    involved_classes: list[str]
    excluded: list[str]
    missed: dict[int, list[str]]  # turn -> functions held out until that turn (miss_func)


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open(path) as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def entries(category: str) -> list[Entry]:
    """The entries of one multi-turn category, joined with their ground truth."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; known: {', '.join(CATEGORIES)}")
    name = f"{VERSION_PREFIX}_{category}.json"
    answers = {row["id"]: row["ground_truth"] for row in _jsonl(POSSIBLE_ANSWER_PATH / name)}
    out = []
    for row in _jsonl(PROMPT_PATH / name):
        out.append(
            Entry(
                id=row["id"],
                turns=row["question"],
                ground_truth=answers[row["id"]],
                initial_config=row.get("initial_config", {}),
                involved_classes=list(row["involved_classes"]),
                excluded=list(row.get("excluded_function", [])),
                missed={int(turn): list(names) for turn, names in row.get("missed_function", {}).items()},
            )
        )
    return out


def function_docs() -> dict[str, list[dict[str, Any]]]:
    """Each API class's function docs (name, description, parameters), in the package's order."""
    return {
        name: list(_jsonl(MULTI_TURN_FUNC_DOC_PATH / MULTI_TURN_FUNC_DOC_FILE_MAPPING[name]))
        for name in CLASSES
    }


def to_json_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """A function doc's ``parameters`` as the JSON Schema BFCL gives function-calling models.

    BFCL's own rules (``_cast_to_openai_type`` in its model handlers, with its type table):
    Python type names map through ``GORILLA_TO_OPENAPI`` (unknown or missing: string),
    and a float parameter says so in its description.
    """
    out = copy.deepcopy(parameters)
    out["type"] = "object"
    out["properties"] = _properties(out.get("properties", {}))
    return out


def _properties(properties: dict[str, Any]) -> dict[str, Any]:
    for schema in properties.values():
        kind = schema.get("type", "string")
        if kind == "float":
            schema["format"] = "float"
            schema["description"] = schema.get("description", "") + " This is a float type value."
        schema["type"] = GORILLA_TO_OPENAPI.get(kind, "string")
        if "properties" in schema:
            schema["properties"] = _properties(schema["properties"])
        elif isinstance(schema.get("items"), dict):
            schema["items"] = _items(schema["items"])
    return properties


def _items(items: dict[str, Any]) -> dict[str, Any]:
    if "type" in items:
        items["type"] = GORILLA_TO_OPENAPI.get(items["type"], "string")
    if "properties" in items:
        items["properties"] = _properties(items["properties"])
    elif isinstance(items.get("items"), dict):
        items["items"] = _items(items["items"])
    return items


def parse_call(source: str, parameters: Mapping[str, Sequence[str]]) -> tuple[str, dict[str, Any]]:
    """``"mv('a', destination='b')"`` -> ``("mv", {"source": "a", "destination": "b"})``.

    ``parameters`` maps a function name to its parameter names in the order its method
    takes them (what BFCL's ``eval`` binds positional arguments to). Raises
    ValueError for anything but a call of a known function with literal arguments.
    """
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"ground-truth call {source!r} is not Python syntax: {exc.msg}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"ground-truth call {source!r} is not a plain function call")
    name = node.func.id
    if name not in parameters:
        raise ValueError(f"ground-truth call {source!r} names no known function")
    order = parameters[name]
    if len(node.args) > len(order):
        raise ValueError(
            f"ground-truth call {source!r} has more positional arguments than {name} has parameters"
        )
    arguments = {order[i]: _literal(arg, source) for i, arg in enumerate(node.args)}
    for keyword in node.keywords:
        if keyword.arg is None or keyword.arg in arguments:
            raise ValueError(f"ground-truth call {source!r}: **kwargs or an argument given twice")
        arguments[keyword.arg] = _literal(keyword.value, source)
    return name, arguments


def _literal(node: ast.expr, source: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise ValueError(f"ground-truth call {source!r}: arguments must be literals") from None
