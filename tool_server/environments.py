"""Environment packs as toolsets: each pack tool a stateful tool, plus the ``tool_use`` verifier.

A pack's tools are served with the pack's own input schemas (checked like an upstream
tool's, ``upstream.schema_validator``, but in the call's turn: a refused call is noted in the
session's world, ``EnvHost.refuse``) under the toolset named after the pack. They are
stateful: the executor runs a session's calls one at a time and in order, and each
call acts on the session's world (``tools.envs.host.EnvHost``), created at its first
call and dropped with the session. A call without a session is refused.

A session plays a task when it is bound to one: ``POST /v1/sessions`` with
``{"environment": {"pack": P, "task": T}}``, or ``_meta["toolfactory/environment"]`` on
an MCP call (``check_environment``, then ``EnvHost.bind``). Unbound, its world starts from the pack's initial state.
An MCP client that cannot set ``_meta`` plays the session in its URL (``/mcp/<pack>/s/<session>``,
bound the first way) or its MCP session's (``api/mcp.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol import ErrorKind, Result, ToolContext, ToolError, ToolMeta
from protocol.messages import is_user_call
from tool_server.config import ConfigError, EnvironmentSpec
from tool_server.registry import Registry, ToolEntry
from tool_server.upstream.tools import schema_validator
from tools.envs.host import AGENT, USER, EnvHost, load_directory, open_pack
from tools.envs.pack import EnvTool, Pack

__all__ = ["TOOL_USE", "add_environments", "check_environment", "load_environment"]

TOOL_USE = "tool_use"  # the environments' verifier
_CONTEXT_PARAM = "__toolfactory_context"  # never a tool argument's name


def load_environment(spec: EnvironmentSpec) -> Pack:
    """The pack of one ``environments`` entry; ConfigError says what is wrong with it."""
    ref = spec.ref()
    try:
        if spec.path is not None:
            if spec.arguments:
                raise ValueError("'arguments' apply to a 'source', not to a 'path'")
            return load_directory(ref)
        return open_pack(ref, spec.arguments)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"environments entry {ref!r}: {exc}") from exc


def add_environments(
    registry: Registry, specs: list[EnvironmentSpec], default_timeout_s: float
) -> EnvHost | None:
    """Load every enabled pack, register its tools and the ``tool_use`` verifier."""
    specs = [spec for spec in specs if spec.enabled]
    if not specs:
        return None
    host = EnvHost()
    for spec in specs:
        pack = load_environment(spec)
        try:
            host.add(pack, spec.prefix)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        toolset = spec.toolset or pack.id
        timeout_s = spec.timeout_s or default_timeout_s
        for tool in pack.tools:
            if spec.prefix + tool.name in registry:
                raise ConfigError(
                    f"environment {pack.id!r}: its tool {tool.name!r} has the name of a tool already served; "
                    "give this environments entry a 'prefix' (its training data then needs the same --env-prefix)"
                )
            registry.add(_tool_entry(host, pack, tool, spec.prefix, toolset, timeout_s))
    meta = ToolMeta(kind="verifier", timeout_s=default_timeout_s, idempotent=True)
    registry.add_verifier(TOOL_USE, host.verify, meta, (), instance=host)
    registry.environments = host
    return host


def _tool_entry(
    host: EnvHost, pack: Pack, tool: EnvTool, prefix: str, toolset: str, timeout_s: float
) -> ToolEntry:
    name = prefix + tool.name
    meta = ToolMeta(
        name=name,
        description=tool.description,
        timeout_s=timeout_s,
        idempotent=not tool.writes,  # a retried write could apply twice
        stateful=True,
        # Packaged tools are quick Python over the session's world: run on the event loop
        # after the session's turn (a thread hop cost several times the call). Generated
        # tools wait on a sandbox process, and some tools do milliseconds of work (drawing
        # an image): a worker thread.
        blocking=not pack.trusted or tool.blocking,
    )
    return ToolEntry(
        name=name,
        meta=meta,
        description=tool.description,
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        validate=dict,  # a copy (the executor adds the context); the schema is checked in the call's turn
        func=_pack_tool(host, pack, tool.name, name, schema_validator(name, tool.input_schema)),
        is_async=False,
        context_param=_CONTEXT_PARAM,
        toolsets={toolset},
        needs_session=True,
    )


def _pack_tool(
    host: EnvHost, pack: Pack, name: str, served: str, check: Callable[[dict[str, Any]], Any]
) -> Callable[..., Any]:
    def run(**arguments: Any) -> Any:
        context: ToolContext = arguments.pop(_CONTEXT_PARAM)
        # the simulated user's calls carry a user call id (the model never picks call ids)
        requestor = USER if is_user_call(context.call_id) else AGENT
        try:
            check(arguments)
        except (ValueError, TypeError) as exc:
            # Checked here, in the session's call order, rather than by the executor on arrival:
            # the world notes the refused call in its place (a benchmark that checks no schema,
            # τ², would have run it, and its verdict replays it).
            message = f"invalid arguments for {served}: {exc}"
            host.refuse(context.session, pack, name, arguments, message, requestor)
            return Result.failure(context.call_id, ErrorKind.INVALID_ARGUMENTS, message)
        try:
            return host.call(context.session, pack, name, arguments, requestor)
        except ToolError as exc:
            # Returned, not raised: an exception handed from the worker thread to the event
            # loop ends up in a reference cycle (its traceback holds this frame, and with it
            # the session's world), which kept released worlds alive until a full collection.
            return Result.failure(context.call_id, exc.kind, exc.message)

    return run


def check_environment(host: EnvHost | None, environment: Any) -> tuple[str, str]:
    """``(pack, task)`` of a binding request ``{"pack", "task"}``, both known to ``host``.

    ToolError (bad_request) for a malformed request or a server without environments;
    LookupError naming the unknown pack or task. Checked before a session is opened, so a
    bad binding never leaves a session behind.
    """
    if host is None:
        raise ToolError("this server serves no environments (config: environments)", ErrorKind.BAD_REQUEST)
    if (
        not isinstance(environment, dict)
        or set(environment) != {"pack", "task"}
        or not all(isinstance(v, str) and v for v in environment.values())
    ):
        raise ToolError(
            'environment must be {"pack": <pack id>, "task": <task id>}, got ' + str(environment)[:200],
            ErrorKind.BAD_REQUEST,
        )
    host.resolve(environment["pack"], environment["task"])
    return environment["pack"], environment["task"]
