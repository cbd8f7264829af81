"""What an upstream's tools become here: OpenAI-safe names, checked arguments, one ``UpstreamTool`` each.

``build_catalog`` turns a server's ``tools/list`` into ``UpstreamTool``s: the exported
name (namespace included), the upstream's own descriptor (title, annotations, output
schema), and a validator for its ``inputSchema``, so a bad call is ``invalid_arguments``
before it reaches the upstream. The schema's patterns run on RE2 (``tools.patterns``): a
tool whose schema has a pattern RE2 cannot run (or one over ``MAX_PATTERN_CHARS``) is not
served, and its server's status says why. Building a catalog checks every schema, CPU work on
what the upstream sent: callers run ``build_catalog`` in a worker thread, off the event loop.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import jsonschema

from protocol import META_KEY, ToolMeta
from tool_server.config import ConfigError
from tools.patterns import UnsafePattern, check_patterns, check_schema, linear_validator

__all__ = [
    "MAX_NAME_LENGTH",
    "UNSAFE_NAME",
    "UpstreamTool",
    "build_catalog",
    "export_names",
    "output_validator",
    "schema_validator",
]

logger = logging.getLogger("tool_server.upstream")

MAX_NAME_LENGTH = 64  # OpenAI function names: ^[a-zA-Z0-9_-]{1,64}$
UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _digest_name(candidate: str, upstream_name: str, taken: set[str]) -> str:
    """``candidate`` cut to fit, with a digest of the upstream name that keeps it unique."""
    digest = hashlib.sha256(upstream_name.encode()).hexdigest()
    for width in (8, 16, 64):
        suffix = "_" + digest[:width]
        name = candidate[: MAX_NAME_LENGTH - len(suffix)] + suffix
        if name not in taken:
            return name
    raise ValueError(f"cannot find a free name for upstream tool {upstream_name!r}")  # pragma: no cover


def export_names(prefix: str, upstream_names: Iterable[str]) -> dict[str, str]:
    """The exported name of each upstream tool: ``prefix`` + the name made OpenAI-safe.

    Names that need no change keep it and are placed first, so a sanitised name
    (``get weather!`` -> ``get_weather_``) never shadows a real one: on a collision, or
    past 64 characters, the sanitised name gets a digest of the original instead.
    Repeated upstream names keep their first entry.
    """
    names = list(dict.fromkeys(upstream_names))
    exported: dict[str, str] = {}
    for name in names:
        if not UNSAFE_NAME.search(name) and len(prefix) + len(name) <= MAX_NAME_LENGTH:
            exported[name] = prefix + name
    taken = set(exported.values())
    for name in names:
        if name in exported:
            continue
        candidate = prefix + UNSAFE_NAME.sub("_", name)
        if len(candidate) > MAX_NAME_LENGTH or candidate in taken:
            candidate = _digest_name(candidate, name, taken)
        exported[name] = candidate
        taken.add(candidate)
    return exported


# ----------------------------------------------------------------- argument checks


def _problem(error: jsonschema.ValidationError) -> str:
    """One schema violation, worded like the built-in tools' argument errors."""
    where = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        return f"missing required argument '{'.'.join(filter(None, [where, *missing[:1]]))}'"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(error.schema.get("properties") or {})
        extra = [k for k in error.instance if k not in known]
        if extra:
            return f"unexpected argument '{'.'.join(filter(None, [where, extra[0]]))}'"
    return f"'{where or 'arguments'}': {error.message}"


def schema_validator(tool: str, schema: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Check arguments against a tool's ``inputSchema`` (its ``$schema``, else draft 2020-12).

    The validator raises ValueError naming each bad argument, so a bad call is
    ``invalid_arguments`` before it reaches the upstream. An invalid schema is not enforced
    (and logged), nor one that fails while checking (a ``$ref`` to nowhere): the upstream
    checks its own. Patterns run on RE2, in time linear in the argument: a schema with a
    pattern RE2 cannot run raises ConfigError here (the tool is not served).
    """
    try:
        check_schema(schema)  # never compiles a pattern with ``re``
        validator = linear_validator(schema)
    except UnsafePattern as exc:
        raise ConfigError(f"tool {tool!r}: its inputSchema: {exc}") from None
    except jsonschema.SchemaError as exc:
        logger.warning(
            "upstream tool %s has an invalid inputSchema (%s); arguments pass unchecked", tool, exc.message
        )
        return _any_object
    broken: list[str] = []  # why the schema cannot be checked, once found

    def validate(arguments: dict[str, Any]) -> dict[str, Any]:
        if broken:
            return arguments
        try:
            errors = sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path)))
        except Exception as exc:  # the schema's fault (an unresolvable $ref), not the arguments'
            broken.append(f"{type(exc).__name__}: {exc}")
            logger.warning(
                "upstream tool %s: its inputSchema cannot be checked (%s); arguments pass unchecked",
                tool,
                broken[0],
            )
            return arguments
        if errors:
            raise ValueError("; ".join(dict.fromkeys(_problem(e) for e in errors[:10])))
        return arguments

    return validate


def output_validator(tool: str, schema: dict[str, Any]) -> Any:
    """What the SDK checks a result's ``structuredContent`` with: the tool's ``outputSchema``,
    its patterns on RE2 (the upstream wrote both the schema and the result).

    Raises RuntimeError as the SDK's own check does for a schema it cannot use.
    """
    try:
        check_schema(schema, jsonschema.validators.validator_for(schema))
        return linear_validator(schema)
    except jsonschema.SchemaError as exc:
        raise RuntimeError(f"Invalid schema for tool {tool}: {exc.message}") from None
    except UnsafePattern as exc:
        raise RuntimeError(f"Invalid schema for tool {tool}: {exc}") from None


def _any_object(arguments: dict[str, Any]) -> dict[str, Any]:
    return arguments


def _without_argument(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """The schema less one property: an argument the server fills in is not the model's."""
    properties = schema.get("properties")
    if not isinstance(properties, dict) or name not in properties:
        return schema
    trimmed = {**schema, "properties": {k: v for k, v in properties.items() if k != name}}
    if isinstance(schema.get("required"), list):
        trimmed["required"] = [k for k in schema["required"] if k != name]
    return trimmed


@dataclass(frozen=True, slots=True)
class UpstreamTool:
    """One re-exported tool, described once: what the registry serves and how to reach it."""

    name: str  # exported name, namespace included
    local: str  # exported name without the namespace (what ``UpstreamServer.call`` takes)
    upstream_name: str  # the upstream's own name
    meta: ToolMeta
    description: str
    input_schema: dict[str, Any]  # as the model sees it (a session_arg is ours, not the model's)
    output_schema: dict[str, Any] | None
    descriptor: dict[str, Any]  # the MCP Tool JSON we publish; the registry adds toolsets to _meta
    validate: Callable[[dict[str, Any]], dict[str, Any]] = field(compare=False)
    # What the MCP client checks a result of this tool with (``output_validator``), built with
    # the catalog (off the event loop): a validator, the RuntimeError its schema gives, or None.
    check_output: Any = field(compare=False, default=None)


class CatalogSource(Protocol):
    """What a catalog is built from: the settings of one upstream (``server.UpstreamServer``)."""

    name: str
    prefix: str  # namespace and separator, prepended to exported names
    disabled_tools: frozenset[str]
    session_arg: str | None
    call_timeout_s: float
    stateful: bool


def build_catalog(
    server: CatalogSource, listed: list[dict[str, Any]], refused: dict[str, str] | None = None
) -> list[UpstreamTool]:
    """The tools ``server`` exposes from its ``tools/list``: disabled ones and repeats left out,
    and those whose schema cannot be checked safely (why, by exported name, into ``refused``)."""
    offered: dict[str, dict[str, Any]] = {}
    for raw in listed:
        if raw["name"] in offered:
            logger.warning("upstream %s: duplicate tool name %r skipped", server.name, raw["name"])
        elif raw["name"] not in server.disabled_tools:
            offered[raw["name"]] = raw
    names = export_names(server.prefix, offered)
    catalog = []
    for name, raw in offered.items():
        try:
            catalog.append(_tool(server, names[name], raw))
        except ConfigError as exc:
            if refused is not None:
                refused[names[name]] = (
                    f"{exc}; not exposed: fix the server's schema, or list {name!r} in "
                    f"mcpServers.{server.name}.disabledTools"
                )
    return catalog


def _tool(server: CatalogSource, exported: str, raw: dict[str, Any]) -> UpstreamTool:
    """Describe one upstream tool once: name, schemas, metadata and validator."""
    annotations = raw.get("annotations") or {}
    schema = raw.get("inputSchema") or {"type": "object"}
    if server.session_arg is not None:
        schema = _without_argument(schema, server.session_arg)
    description = raw.get("description") or f"{raw['name']} (from upstream MCP server '{server.name}')"
    output_schema = raw.get("outputSchema")
    try:
        check_patterns(output_schema)  # the SDK checks its results against it
    except UnsafePattern as exc:
        raise ConfigError(f"tool {exported!r}: its outputSchema: {exc}") from None
    check_output: Any = None
    if isinstance(output_schema, dict):
        try:
            check_output = output_validator(raw["name"], output_schema)
        except RuntimeError as exc:  # the SDK raises it at each call, as its own check would
            check_output = exc
    meta = ToolMeta(
        name=exported,
        description=description,
        kind="upstream",
        timeout_s=server.call_timeout_s,
        idempotent=bool(annotations.get("idempotentHint", False)),
        stateful=server.stateful,
        title=raw.get("title") or annotations.get("title"),
    )
    descriptor: dict[str, Any] = {"name": exported, "description": description, "inputSchema": schema}
    for key in ("title", "outputSchema", "annotations", "icons"):
        if key in raw:
            descriptor[key] = raw[key]
    descriptor["_meta"] = {
        **(raw.get("_meta") or {}),
        META_KEY: {**meta.to_dict(), "upstream": server.name, "upstream_tool": raw["name"]},
    }
    return UpstreamTool(
        name=exported,
        local=exported[len(server.prefix) :],
        upstream_name=raw["name"],
        meta=meta,
        description=description,
        input_schema=schema,
        output_schema=raw.get("outputSchema"),
        descriptor=descriptor,
        validate=schema_validator(exported, schema),
        check_output=check_output,
    )
