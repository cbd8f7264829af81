"""The messages each stage sends. The first line of every system prompt names the stage
(``[builder stage: <key>]``): a model ignores it, the scripted test server routes on it."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["LEVELS", "decomposition", "documents", "function", "tasks"]

LEVELS = {
    1: "single-hop: one tool call answers the request",
    2: "parallel single-hop: several independent calls (no call needs another's output)",
    3: "multi-hop: a chain, a later call needs a value that only an earlier call's output gives",
    4: "parallel multi-hop: independent calls and at least one chain (depends_on)",
}

_SCALING = """Scaling operations (list the ones you applied in "scaling"):
- functional_generalisation: the same need phrased for a different goal or user situation
- parameter_expansion: the call needs more of the tool's optional parameters
- parameter_type_generalisation: arguments of richer types (lists, numbers, filters) instead of one id
- toolset_extension: add 1-3 unrelated tools of the world as "distractors" (tools the task does not need)"""


def _system(stage: str, text: str) -> dict[str, str]:
    return {
        "role": "system",
        "content": f"[builder stage: {stage}]\n{text}\nAnswer with one JSON object only.",
    }


def _json(value: Any, limit: int = 12000) -> str:
    text = json.dumps(value, indent=1, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "\n... (cut)"


def decomposition(scenario: str) -> list[dict[str, str]]:
    return [
        _system(
            "decomposition",
            "You design a small simulated world in which an assistant uses tools. Decompose the "
            "scenario into its domain, the entities it keeps (tables of records, each with a key field "
            "and typed fields) and the capabilities a user needs (sub-goals, each reading or writing "
            'some entities). Shape: {"domain": "snake_case", "description": "...", "entities": '
            '[{"name": "orders", "key": "order_id", "fields": [{"name": "order_id", "type": "string", '
            '"description": "..."}]}], "capabilities": [{"name": "cancel_order", "description": "...", '
            '"kind": "write", "entities": ["orders"]}]}. Field types: string, integer, number, boolean, '
            "array, object. 2-4 entities, 3-8 capabilities.",
        ),
        {"role": "user", "content": f"Scenario: {scenario}"},
    ]


def documents(scenario: str, decomposition: dict[str, Any]) -> list[dict[str, str]]:
    return [
        _system(
            "documents",
            "Write the tool documents of the world and its initial data. One tool per capability: name "
            "(snake_case), description, parameters (a JSON Schema object with properties and required), "
            "output (what it returns), reads and writes (the entity tables it uses). Then initial_state: "
            "for every entity, 3-8 records as a list of objects with exactly the entity's fields, keys "
            "unique, values of the field's type. Optionally a short policy (rules the assistant must "
            'follow). Shape: {"tools": [...], "initial_state": {"orders": [{...}]}, "policy": "..."}.',
        ),
        {"role": "user", "content": f"Scenario: {scenario}\nDecomposition:\n{_json(decomposition)}"},
    ]


def function(
    tool: dict[str, Any], entities: list[dict[str, Any]], sample: dict[str, Any]
) -> list[dict[str, str]]:
    return [
        _system(
            f"function {tool['name']}",
            "Implement one tool as a Python function `def <name>(world, <parameters>)`, standard library "
            "only. `world['table']` is a dict of records (JSON dicts) by key (a string). A tool that writes "
            "changes records in place (`world['t'][key]['field'] = value`), adds (`world['t'][key] = {...}`) "
            "or deletes (`del world['t'][key]`), only in the tables it writes. Parameters: the schema's "
            "properties by name, optional ones with a default. Return a JSON value (dict, list, string, "
            "number) computed from the data and the arguments. "
            "Refuse impossible requests (unknown key, rule broken) with `raise ToolError('why')` "
            "(ToolError is predefined). Put helpers inside the function: the source must define exactly "
            'this one top-level function (imports allowed). Shape: {"name": "...", "source": "def ...:\\n    ..."}.',
        ),
        {
            "role": "user",
            "content": f"Tool document:\n{_json(tool)}\nEntities:\n{_json(entities)}\n"
            f"Sample records:\n{_json(sample, 4000)}",
        },
    ]


def tasks(level: int, count: int, tools: list[dict[str, Any]], state: dict[str, Any]) -> list[dict[str, str]]:
    return [
        _system(
            f"tasks level-{level}",
            f"Compose {count} user tasks of level {level} ({LEVELS[level]}) from the tools of this world. "
            "Each task: prompt (the user's request, with the ids or values the first calls need, never "
            "the answer), calls (the gold tool calls: id, name, arguments valid for the tool's schema and "
            "naming records that exist in the data; depends_on: the ids of the calls whose output gives "
            "one of this call's argument values; compare: the argument names a correct call must match, "
            "null for all), answer (a short value that appears verbatim in a call's output, e.g. a name "
            "or number, not a sentence; null for a pure action), distractors, scaling.\n"
            + _SCALING
            + '\nShape: {"tasks": [{"prompt": "...", "calls": [{"id": "c0", "name": "...", "arguments": '
            '{...}, "depends_on": [], "compare": null}], "answer": "...", "distractors": [], "scaling": []}]}',
        ),
        {"role": "user", "content": f"Tools:\n{_json(tools)}\nData:\n{_json(state)}"},
    ]
