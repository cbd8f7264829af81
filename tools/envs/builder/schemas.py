"""The JSON schema each stage's answer must match (checked before the stage's own checks), and
the *guide* sent to the endpoint for structured decoding (``--json-mode schema``).

A guide is the stage's schema plus what the earlier stages fixed and the stage's checks would
otherwise reject: records with exactly their entity's fields and types, tables named among
the entities, each task call's arguments in its tool's schema, a function named as its tool.
With ``small`` (``--small-model``) it also fixes sizes and forms a very small model cannot keep
to by itself: an ``id`` key and a ``name`` field, three capabilities with distinct prefixes,
three records with given keys, argument names taken from the fields, one-line functions,
short texts and bounded values. Every guide is narrower than its stage's schema (an answer
decoded under it passes that schema); the stage's checks still judge the content. A guide may
keep parts of the last rejected answer (``entities``, ``kept``): a retry then only redoes the
rest.
"""

from __future__ import annotations

from typing import Any

from tools.envs.pack import SCALING_OPERATIONS

__all__ = [
    "DECOMPOSITION",
    "DOCUMENTS",
    "FUNCTION",
    "TASKS",
    "decomposition_guide",
    "documents_guide",
    "function_guide",
    "tasks_guide",
]

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


# ------------------------------------------------------------------ guides for structured decoding

RECORDS = 3  # records per table in a small-model answer


def _closed(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An object with exactly these properties (no others: a decoder then writes no extra keys)."""
    return {**_object(properties, required), "additionalProperties": False}


def _short(most: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": most}


def _word(least: int, most: int, start: str = "[a-z]") -> dict[str, Any]:
    """A short snake_case name: a decoder cannot loop in it (``book_id_id_id...``) for long."""
    return {"type": "string", "pattern": f"^{start}[a-z_]{{{least - 1},{most - 1}}}$"}


def _list(items: dict[str, Any], fewest: int, most: int) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": fewest, "maxItems": most}


def _tuple(items: list[dict[str, Any]], fewest: int | None = None) -> dict[str, Any]:
    """An array of these items in this order (``fewest`` of them at least; default all)."""
    least = len(items) if fewest is None else fewest
    return {"type": "array", "prefixItems": items, "items": False, "minItems": least, "maxItems": len(items)}


def decomposition_guide(
    entities: list[dict[str, Any]] | None = None, *, small: bool = False
) -> dict[str, Any]:
    """DECOMPOSITION, closed. ``entities``: those of an earlier answer that passed the rules,
    kept as they are; the capabilities may then name only them (a retry after a capability
    named an unknown table).

    ``small``: two entities whose fields are ``id`` (the key, a string), ``name`` and
    one more of at least five letters (so no name repeats); three capabilities, a look-up
    (``get_...``), a listing (``list_...``) and a change (a name that starts otherwise)."""
    known = {"enum": [e["name"] for e in entities]} if entities else _SLUG
    if not small:
        field_ = _closed({"name": _SLUG, "type": {"enum": _FIELD_TYPES}, "description": {"type": "string"}},
                         ["name", "type"])  # fmt: skip
        entity = _closed({"name": _SLUG, "key": _SLUG, "fields": _array(field_, 16)})
        capability = _closed({"name": _SLUG, "description": _TEXT, "kind": {"enum": ["read", "write"]},
                              "entities": {"type": "array", "items": known}})  # fmt: skip
        return _closed({"domain": _SLUG, "description": _TEXT,
                        "entities": {"const": entities} if entities else _array(entity, 8),
                        "capabilities": _array(capability, 16)})  # fmt: skip
    fields = {
        **_tuple(
            [
                _closed({"name": {"const": "id"}, "type": {"const": "string"}}),
                _closed({"name": {"const": "name"}, "type": {"const": "string"}}),
            ]
        ),
        "items": _closed({"name": _word(5, 24), "type": {"enum": _FIELD_TYPES}}),
        "minItems": 3,
        "maxItems": 3,
    }
    entity = _closed({"name": _word(3, 20), "key": {"const": "id"}, "fields": fields})
    tables = _list(known if entities else _word(3, 20), 1, 2)

    def capability(name: dict[str, Any], kind: str) -> dict[str, Any]:
        return _closed(
            {"name": name, "description": _short(100), "kind": {"const": kind}, "entities": tables}
        )

    return _closed(
        {
            "domain": _word(3, 24),
            "description": _short(120),
            "entities": {"const": entities} if entities else _list(entity, 2, 2),
            "capabilities": _tuple(
                [
                    capability(_word(5, 30, "get_"), "read"),
                    capability(_word(6, 30, "list_"), "read"),
                    capability(_word(3, 30, "[a-fh-km-z]"), "write"),
                ]
            ),
        }
    )


def record_ids(decomposition: dict[str, Any], count: int = RECORDS) -> dict[str, list[str]]:
    """Keys for a small model's records, per table: ``mem1``, ``mem2``, ... (prefixes differ between tables)."""
    ids, used = {}, set()
    for entity in decomposition["entities"]:
        name = entity["name"]
        prefix = next((name[:n] for n in range(3, len(name) + 1) if name[:n] not in used), name)
        used.add(prefix)
        ids[name] = [f"{prefix}{i}" for i in range(1, count + 1)]
    return ids


def _value(kind: str, small: bool) -> dict[str, Any]:
    """A value of a field's JSON type; for a small model bounded (left free, it writes digits or
    items until the token budget ends)."""
    if not small:
        return {"type": kind}
    return {
        "string": _short(40),
        "integer": {"type": "integer", "minimum": 0, "maximum": 9999},
        "number": {"type": "number", "minimum": 0, "maximum": 9999},
        "boolean": {"type": "boolean"},
        "array": _list(_short(20), 0, 3),
        "object": _closed({"note": _short(40)}, []),
    }[kind]


def _records(entity: dict[str, Any], ids: list[str] | None, small: bool) -> dict[str, Any]:
    """Records with exactly the entity's fields, of their types; with ``ids``, one per key given."""
    fields = {f["name"]: _value(f["type"], small) for f in entity["fields"]}
    if ids is None:
        return _array(_closed(fields), 200)
    numbered = fields[entity["key"]]["type"] == "integer"
    return _tuple(
        [
            _closed({**fields, entity["key"]: {"const": i + 1 if numbered else key}})
            for i, key in enumerate(ids)
        ]
    )


def _parameters(fields: dict[str, str] | None, kept: dict[str, Any] | None) -> dict[str, Any]:
    """A tool's argument schema: an object schema with properties; with ``fields`` (a small
    model) arguments named and typed like those fields, ``required`` some of them in their
    order (so none twice); with ``kept`` (an earlier answer's properties) those, all required."""
    if kept is not None:
        return _closed(
            {"type": {"const": "object"}, "properties": {"const": kept}, "required": {"const": list(kept)}}
        )
    if fields is None:
        properties = {"type": "object", "additionalProperties": {"type": "object"}}
        return _object({"type": {"const": "object"}, "properties": properties, "required": {"type": "array", "items": _SLUG}},
                       ["type", "properties"])  # fmt: skip
    arguments = {name: _closed({"type": {"const": kind}}) for name, kind in fields.items()}
    required = _tuple([{"const": name} for name in fields], 0)
    return _closed({"type": {"const": "object"}, "properties": _closed(arguments, []), "required": required})


def tool_fields(decomposition: dict[str, Any], capability: dict[str, Any]) -> dict[str, str]:
    """The fields (name: type) of the tables a capability uses: what its tool's arguments may be named."""
    entities = {e["name"]: e for e in decomposition["entities"]}
    tables = [t for t in capability["entities"] if t in entities] or list(entities)
    return {f["name"]: f["type"] for t in tables for f in entities[t]["fields"]}


def documents_guide(
    decomposition: dict[str, Any], kept: dict[str, dict[str, Any]] | None = None, *, small: bool = False
) -> dict[str, Any]:
    """DOCUMENTS for this decomposition: tools reading and writing its tables, initial records
    with exactly each entity's fields and types.

    ``small``: one tool per capability, in order, with its name and tables (a read capability
    writes none, a write one at least one), arguments named and typed like fields of those tables
    (no descriptions), three records per table with the keys of ``record_ids``, no policy: short
    enough for ``--max-tokens 850``, which a 2048-token context holds beside the ~1100-token
    tasks prompt. ``kept``: per tool, the argument
    properties of an earlier answer to keep (its ``required`` named others); all of them are
    then required."""
    entities = {e["name"]: e for e in decomposition["entities"]}
    kept = kept or {}
    text = _short(80) if small else _TEXT

    def tool(name: dict[str, Any], tables: list[str], writes: dict[str, Any] | None, fields: dict[str, str] | None,
             kept_properties: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
        table_names = _list({"enum": tables}, 0, len(tables))
        return _closed(
            {
                "name": name,
                "description": text,
                "parameters": _parameters(fields, kept_properties),
                "output": text,
                "reads": table_names,
                "writes": writes or table_names,
            }
        )

    if small:
        tools = []
        for capability in decomposition["capabilities"]:
            tables = [t for t in capability["entities"] if t in entities] or list(entities)
            writes = (
                _list({"enum": tables}, 1, len(tables)) if capability["kind"] == "write" else _list({}, 0, 0)
            )
            fields = tool_fields(decomposition, capability)
            tools.append(
                tool({"const": capability["name"]}, tables, writes, fields, kept.get(capability["name"]))
            )
        tool_list = _tuple(tools)
        ids = record_ids(decomposition)
    else:
        tool_list = _array(tool(_SLUG, list(entities), None, None, None), 16)
        ids = {}
    records = {name: _records(entity, ids.get(name), small) for name, entity in entities.items()}
    return _closed(
        {"tools": tool_list, "initial_state": _closed(records), **({} if small else {"policy": {"type": "string"}})},
        ["tools", "initial_state"],
    )  # fmt: skip


def function_guide(tool: dict[str, Any], *, small: bool = False) -> dict[str, Any]:
    """FUNCTION for this tool: its name, and its source.

    ``small``: a source with the signature the tool's schema asks for (``def name(world,
    required, optional=None):``) and a ``return`` of up to seven lines. Decoders put a pattern's characters
    into the JSON text as they are (xgrammar 0.2: a newline raw, a quote unescaped), so the
    pattern leaves out quotes and backslashes (strings in the code take single quotes) and
    ``parse_json`` reads raw newlines inside strings."""
    if not small:
        return _closed({"name": {"const": tool["name"]}, "source": FUNCTION["properties"]["source"]})
    parameters = tool["parameters"]
    required = set(parameters.get("required", []))
    signature = "".join(
        f", {p}" if p in required else f", {p}=None" for p in parameters.get("properties", {})
    )
    line = '[^\\n"\\\\]{1,72}'
    source = f"^def {tool['name']}\\(world{signature}\\):\\n    return {line}(\\n    {line}){{0,6}}$"
    return _closed({"name": {"const": tool["name"]}, "source": {"type": "string", "pattern": source}})


def tasks_guide(
    level: int, count: int, tools: list[dict[str, Any]], *, small: bool = False
) -> dict[str, Any]:
    """TASKS for these tools: each call names one of them and passes arguments of its schema;
    distractors are among them.

    ``small``: calls have the ids c0, c1, ... in order, as many as the level needs (one; two to
    four with no dependencies; chains at levels 3 and 4), a later call depending only on
    earlier ones; short texts."""
    names = [t["name"] for t in tools]

    def call(call_id: dict[str, Any], depends_on: dict[str, Any]) -> dict[str, Any]:
        variants = [
            _closed(
                {
                    "id": call_id,
                    "name": {"const": t["name"]},
                    "arguments": t["parameters"],
                    "depends_on": depends_on,
                    "compare": {"type": ["array", "null"], "items": {"type": "string"}},
                },
                ["id", "name", "arguments", "depends_on"],
            )  # fmt: skip
            for t in tools
        ]
        return variants[0] if len(variants) == 1 else {"anyOf": variants}

    if small:
        fewest, most = {1: (1, 1), 2: (2, 4), 3: (2, 4), 4: (3, 5)}[level]
        chains = level >= 3
        calls = _tuple(
            [call({"const": f"c{i}"}, _list({"enum": [f"c{j}" for j in range(i)]}, 0, i) if chains and i else _list({}, 0, 0))
             for i in range(most)],
            fewest,
        )  # fmt: skip
    else:
        calls = _array(call(_CALL["properties"]["id"], _STRINGS), 8)
    text = _short(300) if small else _TEXT
    task = _closed(
        {
            "prompt": text,
            "calls": calls,
            "answer": {"anyOf": [_short(60) if small else {"type": "string"}, {"type": "null"}]},
            "communicate": _list({"type": "string"}, 0, 3),
            "distractors": _list({"enum": names}, 0, 2 if small else len(names)),
            "scaling": _list({"enum": list(SCALING_OPERATIONS)}, 0, len(SCALING_OPERATIONS)),
        },
        ["prompt", "calls", "answer"] if small else ["prompt", "calls"],
    )
    return _closed({"tasks": {**_array(task, count if small else 20), "minItems": 1}})
