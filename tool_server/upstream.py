"""Upstream MCP servers: third-party tool servers re-exported under a namespace.

The server config names them in the JSON shape MCP desktop clients use::

    mcpServers:
      time: {command: mcp-server-time, args: [--local-timezone, UTC], env: {}}
      docs: {url: "http://127.0.0.1:9000/mcp", headers: {Authorization: "Bearer ${DOCS_TOKEN}"}}

One ``UpstreamServer`` owns one connection through the official MCP SDK client. A
supervisor task keeps it alive: a stdio subprocess that dies (or an HTTP upstream
that stops answering) is reconnected with exponential backoff, and calls made while
it is down fail fast with ``unavailable`` instead of queueing. ``call`` never raises
and never outlives its timeout, so one broken upstream cannot stall a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import anyio
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT, CallToolResult

from protocol import META_KEY, ErrorKind, Result, ToolMeta
from protocol.messages import ErrorInfo

logger = logging.getLogger(__name__)

State = Literal["stopped", "starting", "ready", "restarting"]

_TOOL_NAME_OK = re.compile(r"[^A-Za-z0-9_.-]")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_STDIO_KEYS = {"command", "args", "env", "cwd", "type", "transport"}
_HTTP_KEYS = {"url", "headers", "type", "transport"}
_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamableHttp"}
_MAX_LIST_PAGES = 100
_STDERR_TAIL = 600
_STDERR_MAX_BYTES = 1 << 20  # the captured stderr file is trimmed past this size


# --------------------------------------------------------------------------- config


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
    """Replace ``${NAME}`` with the environment variable, so secrets stay out of config files."""

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


def parse_spec(name: str, spec: Any) -> StdioSpec | HttpSpec:
    """Validate one ``mcpServers`` entry; the error names the server and the bad key."""
    where = f"mcpServers.{name}"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be an object with 'command' (stdio) or 'url' (HTTP)")
    kind = spec.get("type", spec.get("transport"))
    if kind == "sse":
        raise ValueError(f"{where}: the legacy SSE transport is not supported; use a streamable HTTP url")
    if "url" in spec or kind in _HTTP_TYPES:
        unknown = set(spec) - _HTTP_KEYS
        if unknown:
            raise ValueError(f"{where} has unknown keys {sorted(unknown)} (HTTP entries take url, headers)")
        url = spec.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"{where}.url must be an http(s) URL, got {url!r}")
        return HttpSpec(_expand(url, f"{where}.url"), _str_map(spec.get("headers"), f"{where}.headers"))
    if "command" in spec:
        unknown = set(spec) - _STDIO_KEYS
        if unknown:
            raise ValueError(
                f"{where} has unknown keys {sorted(unknown)} (stdio entries take command, args, env, cwd)"
            )
        command = spec["command"]
        if not isinstance(command, str) or not command:
            raise ValueError(f"{where}.command must be a non-empty string")
        args = spec.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
            raise ValueError(f"{where}.args must be a list of strings")
        cwd = spec.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError(f"{where}.cwd must be a string")
        return StdioSpec(
            command=_expand(command, f"{where}.command"),
            args=[_expand(str(a), f"{where}.args") for a in args],
            env=_str_map(spec.get("env"), f"{where}.env"),
            cwd=cwd,
        )
    raise ValueError(f"{where} needs 'command' (a stdio server) or 'url' (a streamable HTTP server)")


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


# --------------------------------------------------------------------------- server


class UpstreamServer:
    """One supervised connection to an upstream MCP server (stdio or streamable HTTP).

    Args:
        name: the ``mcpServers`` key; used in messages, metrics and (by default) the namespace.
        spec: ``{"command", "args", "env", "cwd"}`` or ``{"url", "headers"}``.
        namespace: prefix of the re-exported tool names (default: ``name``; ``""`` for none).
        separator: between namespace and tool name (MCP names allow ``[A-Za-z0-9_.-]``).
        call_timeout_s: default deadline of one call.
        connect_timeout_s: deadline of the handshake and tool listing on each (re)connect.
        restart_backoff: (first, max) delay in seconds between reconnect attempts; it
            doubles after each failure and resets once a connection stayed up ``max`` seconds.
        health_interval_s: how often the connection is probed with ``tools/list`` (None:
            never); a probe that fails or takes longer than ``call_timeout_s`` reconnects.
        errlog: where a stdio server's stderr goes; by default a temporary file whose
            tail is quoted in ``last_error`` when the process dies.
    """

    def __init__(
        self,
        name: str,
        spec: dict[str, Any],
        *,
        namespace: str | None = None,
        separator: str = ".",
        call_timeout_s: float = 30.0,
        connect_timeout_s: float = 20.0,
        restart_backoff: tuple[float, float] = (0.5, 30.0),
        health_interval_s: float | None = 30.0,
        errlog: TextIO | None = None,
    ) -> None:
        if not name or _TOOL_NAME_OK.search(name):
            raise ValueError(f"upstream server name {name!r} must match [A-Za-z0-9_.-]+")
        self.name = name
        self.spec = parse_spec(name, spec)
        self.namespace = name if namespace is None else namespace
        if _TOOL_NAME_OK.search(self.namespace) or _TOOL_NAME_OK.search(separator):
            raise ValueError(
                f"namespace {self.namespace!r} and separator {separator!r} must use [A-Za-z0-9_.-]"
            )
        self.separator = separator
        self.call_timeout_s = float(call_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        first, most = restart_backoff
        if not 0 < first <= most:
            raise ValueError(
                f"restart_backoff must be (first, max) with 0 < first <= max, got {restart_backoff}"
            )
        self.restart_backoff = (float(first), float(most))
        if health_interval_s is not None and health_interval_s <= 0:
            raise ValueError(f"health_interval_s must be > 0 or None, got {health_interval_s}")
        self.health_interval_s = health_interval_s
        self._errlog = errlog

        self._state: State = "stopped"
        self._restarts = 0
        self._last_error: str | None = None
        self._connected_at: float | None = None
        self._protocol_version: str | None = None
        self._client: Client | None = None
        self._tools: list[dict[str, Any]] = []
        self._upstream_names: dict[str, str] = {}  # local (sanitized) name -> upstream name
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._wake: anyio.Event | None = None
        self._attempted: anyio.Event | None = None
        self._stderr: Any = None

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
    def tools(self) -> list[dict[str, Any]]:
        """MCP tool descriptors (dicts), names prefixed with the namespace."""
        return list(self._tools)

    def qualified(self, local_name: str) -> str:
        return f"{self.namespace}{self.separator}{local_name}" if self.namespace else local_name

    def local_name(self, qualified_name: str) -> str | None:
        """The name to pass to ``call`` for a re-exported name, or None if it is not ours."""
        prefix = self.qualified("")
        if not qualified_name.startswith(prefix):
            return None
        local = qualified_name[len(prefix) :]
        return local if local in self._upstream_names else None

    def status(self) -> dict[str, Any]:
        """For /readyz and /metrics."""
        return {
            "name": self.name,
            "transport": self.transport,
            "state": self._state,
            "healthy": self.healthy,
            "restarts": self._restarts,
            "last_error": self._last_error,
            "tools": len(self._tools),
            "protocol_version": self._protocol_version,
            "uptime_s": round(time.monotonic() - self._connected_at, 3) if self._connected_at else None,
        }

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Launch the supervisor and wait (bounded) for the first connection attempt.

        Returns even if the upstream could not be reached: ``healthy`` is then False,
        ``last_error`` says why, and the supervisor keeps retrying in the background.
        """
        if self._task is not None:
            return
        self._stopping = False
        self._attempted = anyio.Event()
        self._state = "starting"
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name=f"upstream:{self.name}")
        with anyio.move_on_after(self.connect_timeout_s + 5):
            await self._attempted.wait()

    async def stop(self) -> None:
        """Close the connection (and the subprocess); idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        done, _ = await asyncio.wait({task}, timeout=15)
        if not done:  # a transport that ignores its own shutdown bounds: cut it off
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._state = "stopped"
        self._client = None

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
    ) -> Result:
        """Call one upstream tool by its name without the namespace; never raises."""
        started = time.perf_counter()

        def fail(kind: ErrorKind, message: str) -> Result:
            return Result.failure(call_id, kind, message, (time.perf_counter() - started) * 1000)

        client = self._client
        if client is None or self._state != "ready":
            why = f" (last error: {self._last_error})" if self._last_error else ""
            return fail(
                ErrorKind.UNAVAILABLE,
                f"upstream MCP server '{self.name}' is {self._state}{why}; retry later",
            )
        upstream_name = self._upstream_names.get(name)
        if upstream_name is None:
            return fail(
                ErrorKind.UNKNOWN_TOOL, f"upstream MCP server '{self.name}' has no tool named {name!r}"
            )
        deadline = self.call_timeout_s if timeout_s is None else float(timeout_s)
        try:
            # The SDK's own read timeout cancels the request upstream; the outer
            # deadline is the guarantee that nothing (a stuck write) outlives it.
            with anyio.fail_after(deadline + 1.0):
                raw = await client.call_tool(upstream_name, arguments or {}, read_timeout_seconds=deadline)
        except TimeoutError:
            return fail(ErrorKind.TIMEOUT, f"{self.qualified(name)} did not answer within {deadline:g} s")
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return fail(ErrorKind.TIMEOUT, f"{self.qualified(name)} did not answer within {deadline:g} s")
            if exc.code == CONNECTION_CLOSED:
                self._lost(f"connection closed during a call to {upstream_name!r}")
                return fail(ErrorKind.UNAVAILABLE, f"upstream MCP server '{self.name}' closed the connection")
            if exc.code == INVALID_PARAMS:
                return fail(ErrorKind.INVALID_ARGUMENTS, f"{self.qualified(name)}: {exc}")
            return fail(ErrorKind.TOOL_ERROR, f"{self.qualified(name)}: {exc} (code {exc.code})")
        except (httpx2.TransportError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._lost(f"{type(exc).__name__}: {exc}")
            return fail(ErrorKind.UNAVAILABLE, f"upstream MCP server '{self.name}' is unreachable: {exc}")
        except RuntimeError as exc:  # the client was closed under us by a reconnect
            return fail(ErrorKind.UNAVAILABLE, f"upstream MCP server '{self.name}' is reconnecting: {exc}")
        except Exception as exc:  # e.g. output that fails the tool's own outputSchema
            return fail(ErrorKind.TOOL_ERROR, f"{self.qualified(name)}: {type(exc).__name__}: {exc}")
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

    # ----------------------------------------------------------------- supervisor

    def _lost(self, reason: str) -> None:
        """The connection is gone (or unusable): stop taking calls and let the supervisor reconnect."""
        if self._state == "ready" and not self._stopping:
            self._state = "restarting"
            self._last_error = self._with_stderr(reason)
            logger.warning("upstream %s lost: %s", self.name, self._last_error)
        if self._wake is not None:
            self._wake.set()

    def _with_stderr(self, message: str) -> str:
        tail = self._stderr_tail()
        return f"{message}; stderr: {tail}" if tail else message

    def _stderr_tail(self) -> str:
        handle = self._stderr
        if handle is None:
            return ""
        try:
            handle.flush()
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - _STDERR_TAIL))
            return " ".join(handle.read().split())[-_STDERR_TAIL:]
        except (OSError, ValueError):
            return ""

    def _trim_stderr(self) -> None:
        """Keep a chatty upstream's captured stderr from growing without bound over a long run."""
        handle = self._stderr
        if handle is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if handle.seek(0, os.SEEK_END) > _STDERR_MAX_BYTES:
                handle.seek(0)  # the child shares this file offset, so it writes from 0 again
                handle.truncate()

    def _transport(self, on_end: Callable[[], None]) -> Any:
        if isinstance(self.spec, StdioSpec):
            params = StdioServerParameters(
                command=self.spec.command, args=self.spec.args, env=self.spec.env or None, cwd=self.spec.cwd
            )
            if self._errlog is None:
                if self._stderr is not None:
                    self._stderr.close()
                self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
            return _watched(stdio_client(params, errlog=self._errlog or self._stderr), on_end)
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
        if isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT:
            return self._with_stderr(
                f"upstream '{self.name}' did not complete the MCP handshake within {self.connect_timeout_s:g} s"
            )
        if isinstance(exc, httpx2.TransportError) and isinstance(self.spec, HttpSpec):
            return f"cannot reach upstream '{self.name}' at {self.spec.url}: {type(exc).__name__}: {exc}"
        if isinstance(exc, BaseExceptionGroup):
            return "; ".join(self._describe(e) for e in exc.exceptions)
        return self._with_stderr(f"upstream '{self.name}' failed: {type(exc).__name__}: {exc}")

    async def _supervise(self) -> None:
        delay = self.restart_backoff[0]
        first = True
        try:
            while not self._stopping:
                if not first:
                    self._restarts += 1
                first = False
                uptime = await self._connect_and_serve()
                if self._stopping:
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
            self._state = "stopped"
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
                await self._load_tools(client)
                self._protocol_version = client.protocol_version
                self._client = client
                self._connected_at = up_since = time.monotonic()
                self._state = "ready"
                self._signal_attempted()
                logger.info("upstream %s ready (%d tools)", self.name, len(self._tools))
                await self._watch(client, wake)
        except Exception as exc:  # every failure becomes last_error; the loop retries
            if not self._stopping:
                self._last_error = self._describe(exc)
                logger.warning("upstream %s: %s", self.name, self._last_error)
        finally:
            self._client = None
            self._connected_at = None
            if self._state == "ready":
                self._state = "restarting"
            self._signal_attempted()
        return None if up_since is None else time.monotonic() - up_since

    async def _watch(self, client: Client, wake: anyio.Event) -> None:
        """Wait for the connection to end; meanwhile probe it now and then.

        A dead stdio process shows itself by closing its stdout, but a hung one or an HTTP
        server that went away while idle does not: a periodic ``tools/list`` finds both,
        and also picks up a changed tool list.
        """
        while not wake.is_set():
            with anyio.move_on_after(self.health_interval_s or 30.0):
                await wake.wait()
            if wake.is_set():
                return
            self._trim_stderr()
            if self.health_interval_s is None:
                continue
            try:
                with anyio.fail_after(min(self.connect_timeout_s, self.call_timeout_s)):
                    await self._load_tools(client, refresh=True)
            except Exception as exc:  # any failure of the probe means the connection is not usable
                self._lost(f"health check failed: {self._describe(exc)}")

    def _signal_attempted(self) -> None:
        if self._attempted is not None:
            self._attempted.set()

    async def _load_tools(self, client: Client, *, refresh: bool = False) -> None:
        descriptors: list[dict[str, Any]] = []
        names: dict[str, str] = {}
        cursor: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
            for tool in page.tools:
                local = _TOOL_NAME_OK.sub("_", tool.name)
                if local in names:
                    logger.warning("upstream %s: duplicate tool name %r skipped", self.name, tool.name)
                    continue
                names[local] = tool.name
                descriptors.append(self._descriptor(local, tool.model_dump(by_alias=True, exclude_none=True)))
            cursor = page.next_cursor
            if cursor is None:
                break
        self._tools = descriptors
        self._upstream_names = names

    def _descriptor(self, local: str, raw: dict[str, Any]) -> dict[str, Any]:
        annotations = raw.get("annotations") or {}
        meta = ToolMeta(
            name=self.qualified(local),
            kind="upstream",
            timeout_s=self.call_timeout_s,
            idempotent=bool(annotations.get("idempotentHint", False)),
        ).to_dict()
        meta.update(upstream=self.name, upstream_tool=raw["name"])
        descriptor: dict[str, Any] = {
            "name": self.qualified(local),
            "description": raw.get("description")
            or f"{raw['name']} (from upstream MCP server '{self.name}')",
            "inputSchema": raw.get("inputSchema") or {"type": "object"},
        }
        for key in ("title", "outputSchema", "annotations"):
            if key in raw:
                descriptor[key] = raw[key]
        descriptor["_meta"] = {**(raw.get("_meta") or {}), META_KEY: meta}
        return descriptor


def load_upstreams(config: dict[str, Any] | None, **defaults: Any) -> list[UpstreamServer]:
    """Build one UpstreamServer per ``mcpServers`` entry (not started); config errors raise ValueError.

    An entry may carry ``"disabled": true`` (skipped) and, besides the desktop-client
    keys, per-server overrides of ``namespace``, ``separator``, ``call_timeout_s``,
    ``connect_timeout_s``, ``restart_backoff`` and ``health_interval_s``.
    """
    servers: list[UpstreamServer] = []
    for name, entry in (config or {}).items():
        if not isinstance(entry, dict):
            raise ValueError(f"mcpServers.{name} must be an object, got {type(entry).__name__}")
        spec = dict(entry)
        if spec.pop("disabled", False):
            continue
        options = dict(defaults)
        for key in (
            "namespace",
            "separator",
            "call_timeout_s",
            "connect_timeout_s",
            "restart_backoff",
            "health_interval_s",
        ):
            if key in spec:
                options[key] = spec.pop(key)
        if "restart_backoff" in options:
            options["restart_backoff"] = tuple(options["restart_backoff"])
        servers.append(UpstreamServer(name, spec, **options))
    return servers
