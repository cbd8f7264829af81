"""The registry: tools and verifiers by name, their descriptors, and named toolsets.

Entries are built once at start-up from the config: import the target, instantiate
classes with their ``args``, derive schemas and a validator, apply metadata
overrides. The executor then only does dictionary look-ups on the hot path.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocol import META_KEY, ToolMeta, VerifyRequest, get_tool_meta
from protocol.messages import verify_request_from_dict
from protocol.tool import with_overrides
from tool_server.config import ConfigError, ToolSpec
from tool_server.schema import Signature, derive_signature

if TYPE_CHECKING:
    from tool_server.upstream.tools import UpstreamTool

VERIFIER_PREFIX = "verify_"
VERIFIERS_TOOLSET = "verifiers"
ALL_TOOLSETS = "*"  # every tool (GET /v1/tools?toolset=*, tool-server tools --toolset '*')

_VERIFY_FIELD_NOTES = {
    "response": "The final model output to score.",
    "messages": "The chat, if any.",
    "ground_truth": "Reference answer(s) or task data (string, number, list, object).",
    "arguments": "Verifier options (weights, rubric, penalties).",
    "session": "Trajectory session id, for tool-verified rewards.",
    "request_id": "Echoed back in the result, to match results to requests.",
    "response_start": "Index in messages of the first message the rollout produced.",
}


def _verify_input_schema() -> dict[str, Any]:
    """A verifier's arguments on MCP: ``VerifyRequest`` minus its name, derived from the record."""
    from pydantic import TypeAdapter

    schema = TypeAdapter(VerifyRequest).json_schema()
    properties = schema["properties"]
    del properties["verifier"]
    for name, note in _VERIFY_FIELD_NOTES.items():
        properties[name]["description"] = note
    properties["response_start"]["minimum"] = 0
    return {"type": "object", "properties": properties, "additionalProperties": False}


VERIFY_INPUT_SCHEMA: dict[str, Any] = _verify_input_schema()
VERIFY_ARGUMENT_NAMES = frozenset(VERIFY_INPUT_SCHEMA["properties"])
VERIFY_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "components": {"type": "object", "additionalProperties": {"type": "number"}},
        "details": {"type": "object"},
    },
    "required": ["score"],
}


@dataclass(eq=False)
class ToolEntry:
    """A servable tool: how to validate, call and describe it."""

    name: str
    meta: ToolMeta
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    validate: Callable[[dict[str, Any]], dict[str, Any]]
    func: Callable[..., Any]
    is_async: bool
    context_param: str | None = None
    request_param: str | None = None
    toolsets: set[str] = field(default_factory=set)
    instance: Any = None  # the object whose startup()/shutdown() the server calls
    upstream: Any = None  # an UpstreamServer, for tools proxied from another MCP server
    # An upstream tool's MCP descriptor, built once where the tool is known (upstream.py):
    # served as is (title, annotations, upstream's _meta), with our toolsets added.
    published: dict[str, Any] | None = None
    # Refused without a session (an environment's tools act on the session's world), where
    # other stateful tools get a throwaway session.
    needs_session: bool = False
    # Called right where the call is admitted, without a task, thread or timer: sync,
    # marked non-blocking (bounded, microsecond-scale work), not proxied, and nothing that
    # needs a task's bookkeeping (a session's turn, a per-tool limit). Worked out once here:
    # the executor asks on every call.
    inline: bool = field(init=False)

    def __post_init__(self) -> None:
        self.inline = (
            not self.is_async
            and not self.meta.blocking
            and self.upstream is None
            and not self.meta.stateful
            and not self.meta.max_concurrency
        )

    @property
    def is_verifier(self) -> bool:
        return self.meta.kind == "verifier"

    def descriptor(self) -> dict[str, Any]:
        """The MCP ``Tool`` object (as JSON) with our metadata under ``_meta``."""
        if self.published is not None:
            meta = self.published["_meta"]
            ours = {**meta[META_KEY], "toolsets": sorted(self.toolsets)}
            return {**self.published, "_meta": {**meta, META_KEY: ours}}
        tool: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }
        if self.meta.title:
            tool["title"] = self.meta.title
        if self.output_schema:
            tool["outputSchema"] = self.output_schema
        # No readOnlyHint: ToolMeta does not say whether a tool changes the world, and a
        # wrong "read-only" would let clients re-run a tool with side effects.
        tool["annotations"] = {
            "idempotentHint": self.meta.idempotent,
            "openWorldHint": self.meta.kind in ("model", "upstream"),
        }
        tool["_meta"] = {META_KEY: {**self.meta.to_dict(), "toolsets": sorted(self.toolsets)}}
        return tool


def import_target(target: str) -> Any:
    """Import ``package.module:attribute`` with an error that says what to fix."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"tool target {target!r} must look like 'package.module:function_or_class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} for tool target {target!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"module {module_name!r} has no attribute {attr!r} (tool target {target!r})"
            ) from None
    return obj


def _is_async_callable(fn: Any) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 (callable instances)
    return inspect.iscoroutinefunction(call)


class Registry:
    def __init__(self) -> None:
        self.entries: dict[str, ToolEntry] = {}
        self.toolsets: dict[str, set[str]] = {}
        self.version = 0  # bumped on every change, so listings can be cached
        self.environments: Any = None  # the EnvHost serving environment packs (environments.py)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def get(self, name: str) -> ToolEntry | None:
        return self.entries.get(name)

    def add(self, entry: ToolEntry) -> ToolEntry:
        if entry.name in self.entries:
            raise ConfigError(
                f"two tools are named {entry.name!r}; give one a different 'name' in the config"
            )
        self.entries[entry.name] = entry
        self.version += 1
        for toolset in entry.toolsets:
            self.toolsets.setdefault(toolset, set()).add(entry.name)
        return entry

    def remove(self, name: str) -> None:
        """Forget a tool (an upstream stopped offering it); calls already running finish."""
        entry = self.entries.pop(name)
        self.version += 1
        for toolset in entry.toolsets:
            self.toolsets.get(toolset, set()).discard(name)

    def add_spec(
        self, spec: ToolSpec, *, verifier: bool = False, default_timeout_s: float = 30.0
    ) -> ToolEntry:
        """Register one config entry: import, instantiate a class, derive its schema."""
        target = import_target(spec.target)
        if isinstance(target, type):
            try:
                instance = target(**spec.args)
            except (TypeError, ValueError) as exc:  # a wrong name, or a value the tool refuses
                raise ConfigError(f"tool {spec.target}: bad 'args' {spec.args}: {exc}") from exc
        elif spec.args:
            raise ConfigError(f"tool {spec.target} is a function; 'args' only apply to classes")
        else:
            instance = None
        func = instance if instance is not None else target
        meta = get_tool_meta(target)
        if meta.timeout_s == ToolMeta.timeout_s and spec.timeout_s is None:
            meta = dataclasses.replace(meta, timeout_s=default_timeout_s)
        meta = with_overrides(
            meta,
            timeout_s=spec.timeout_s,
            max_concurrency=spec.max_concurrency,
            cacheable=spec.cacheable,
            description=spec.description,
        )
        base_name = spec.name or meta.name or getattr(target, "__name__", None) or spec.target
        toolsets = spec.toolsets or ()
        if verifier or meta.kind == "verifier":
            return self.add_verifier(base_name, func, meta, toolsets, instance)
        sig = _signature(func, base_name, meta.description, spec.target)
        return self.add(
            ToolEntry(
                name=base_name,
                meta=meta,
                description=sig.description,
                input_schema=sig.input_schema,
                output_schema=sig.output_schema,
                validate=sig.validate,
                func=func,
                is_async=_is_async_callable(func),
                context_param=sig.context_param,
                toolsets=set(toolsets),
                instance=instance,
            )
        )

    def add_verifier(
        self,
        name: str,
        func: Callable[..., Any],
        meta: ToolMeta,
        toolsets: Iterable[str],
        instance: Any = None,
    ) -> ToolEntry:
        sig = _signature(func, name, meta.description, name)
        if sig.request_param is None:
            raise ConfigError(f"verifier {name!r} must take a parameter annotated 'VerifyRequest'")
        meta = dataclasses.replace(meta, kind="verifier")
        return self.add(
            ToolEntry(
                name=VERIFIER_PREFIX + name,
                meta=meta,
                description=sig.description,
                input_schema=VERIFY_INPUT_SCHEMA,
                output_schema=VERIFY_OUTPUT_SCHEMA,
                validate=_validate_verify_arguments(name, sig.request_param),
                func=func,
                is_async=_is_async_callable(func),
                context_param=sig.context_param,
                request_param=sig.request_param,
                toolsets={VERIFIERS_TOOLSET, *toolsets},
                instance=instance,
            )
        )

    def add_upstream_tool(
        self,
        tool: UpstreamTool,
        upstream: Any,
        call: Callable[..., Awaitable[Any]],
        toolsets: Iterable[str] = (),
    ) -> ToolEntry:
        """Serve one upstream tool as ``tool_server.upstream`` described it (``UpstreamTool``)."""
        return self.add(
            ToolEntry(
                name=tool.name,
                meta=tool.meta,
                description=tool.description,
                input_schema=tool.input_schema,
                output_schema=tool.output_schema,
                validate=tool.validate,
                func=call,
                is_async=True,
                toolsets={"upstream", f"upstream:{upstream.name}", *toolsets},
                upstream=upstream,
                published=tool.descriptor,
            )
        )

    def define_toolsets(self, toolsets: dict[str, list[str]]) -> None:
        """Named subsets from the config's ``toolsets`` block (names must exist)."""
        for toolset, names in toolsets.items():
            for name in names:
                entry = self.entries.get(name) or self.entries.get(VERIFIER_PREFIX + name)
                if entry is None:
                    raise ConfigError(f"toolset {toolset!r} lists {name!r}, which is not a configured tool")
                entry.toolsets.add(toolset)
                self.toolsets.setdefault(toolset, set()).add(entry.name)

    def names_in(self, toolset: str | None) -> list[str]:
        if toolset is None or toolset == ALL_TOOLSETS:
            return list(self.entries)
        return [n for n in self.entries if n in self.toolsets.get(toolset, ())]

    def descriptors(self, toolset: str | None = None) -> list[dict[str, Any]]:
        return [self.entries[n].descriptor() for n in self.names_in(toolset)]


def _signature(func: Callable[..., Any], name: str, description: str | None, target: str) -> Signature:
    """``derive_signature``, its refusals (a parameter without a type) as configuration errors."""
    try:
        return derive_signature(func, name, description)
    except TypeError as exc:
        raise ConfigError(f"tool {target}: {exc}") from None


def _validate_verify_arguments(name: str, request_param: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """MCP arguments -> the verifier's keyword arguments, decoded as /v1/verify decodes them."""

    def validate(arguments: dict[str, Any]) -> dict[str, Any]:
        unknown = set(arguments) - VERIFY_ARGUMENT_NAMES
        if unknown:
            raise ValueError(f"unknown argument(s) {sorted(unknown)}; known: {sorted(VERIFY_ARGUMENT_NAMES)}")
        request = verify_request_from_dict({**arguments, "verifier": name}, where="arguments")
        return {request_param: request}

    return validate
