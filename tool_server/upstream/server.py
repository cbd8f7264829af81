"""One upstream MCP server (stdio or streamable HTTP) as the rest of the server sees it.

``UpstreamServer`` holds its settings and tool catalog, and calls its tools. Its
connection is kept alive by a ``Supervisor`` (``supervisor``): calls made
while it is down fail fast with ``unavailable`` instead of queueing. ``call`` never
raises and never outlives its timeout, so one broken upstream cannot stall a batch.

The trajectory's session reaches the upstream in ``_meta``, in a named argument
(``session_arg``), or as a process of its own (``per_session``, ``sessions``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import anyio

from protocol import ErrorKind, Result, SessionState, ToolError
from tool_server.executor.admission import ANONYMOUS_TENANT
from tool_server.upstream.calls import call_error, call_outcome, failure, request_meta
from tool_server.upstream.config import (
    HttpSpec,
    StdioSpec,
    backoff,
    byte_limit,
    flag,
    for_session,
    interval,
    parse_spec,
    positive,
    session_placeholders,
    text,
)
from tool_server.upstream.sessions import SessionPool
from tool_server.upstream.supervisor import State, Supervisor
from tool_server.upstream.tools import MAX_NAME_LENGTH, UNSAFE_NAME, UpstreamTool, build_catalog
from tools.sandbox.uids import UIDS

__all__ = ["DEFAULT_SEPARATOR", "UpstreamServer"]

logger = logging.getLogger("tool_server.upstream")


DEFAULT_SEPARATOR = "__"
CATALOG_SESSION = "_catalog"  # ${session} of a per_session server's process that lists its tools
_SERVER_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")


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
        connect_timeout_s: deadline of each request of the handshake and tool listing, on
            each (re)connect (a stdio server's start-up counts against the first).
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
            Each runs with a private directory (its ``TMPDIR``; ``${session_dir}`` in ``args``,
            ``env`` and ``cwd``), removed when it stops, and ``${session}`` is its session's id:
            a server that keeps its world in files names them there.
        session_uid: run each of those processes (and its directory) as a uid of its own, drawn
            from the sandbox's (``tools.sandbox.uids``), so that no session's process can read
            another's files; None: when the tool server runs as root (it must, to change uids).
        max_sessions_per_tenant: how many of those one token (tenant) may hold; None: 3/4 of
            ``max_sessions`` (at least 1), so one tenant's sessions leave room for the others.
            A server without tokens has one tenant, which may hold all ``max_sessions``.
        max_message_bytes: the most one message from the server may take (stdio); a longer
            one is discarded as it arrives and the call it answers fails (``too_large``).
        disabled_tools: upstream tool names not to expose.
        restart: reconnect when the connection ends (per-session instances do not: their
            state would be gone).
        errlog: where a stdio server's stderr goes; by default a pipe whose last bytes
            are kept, and quoted in ``last_error`` when the process dies.
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
        session_uid: bool | None = None,
        max_sessions: int = 8,
        max_sessions_per_tenant: int | None = None,
        max_message_bytes: int = 32 * 1024 * 1024,
        disabled_tools: Iterable[str] = (),
        restart: bool = True,
        errlog: TextIO | None = None,
    ) -> None:
        if not name or _SERVER_NAME_BAD.search(name):
            raise ValueError(f"upstream server name {name!r} must match [A-Za-z0-9_.-]+")
        self.name = name
        self.label = f"upstream MCP server '{name}'"  # how messages name it
        self.spec = spec if isinstance(spec, StdioSpec | HttpSpec) else parse_spec(name, spec)
        where = f"mcpServers.{name}"
        self.namespace = (
            UNSAFE_NAME.sub("_", name) if namespace is None else text(namespace, f"{where}.namespace")
        )
        self.separator = text(separator, f"{where}.separator")
        self.prefix = f"{self.namespace}{separator}" if self.namespace else ""
        self._check_names()
        self.call_timeout_s = positive(call_timeout_s, f"{where}.call_timeout_s")
        self.connect_timeout_s = positive(connect_timeout_s, f"{where}.connect_timeout_s")
        self.restart_backoff = backoff(restart_backoff, f"{where}.restart_backoff")
        self.health_interval_s = interval(health_interval_s, f"{where}.health_interval_s")
        self.required = flag(required, f"{where}.required")
        self.session_meta = flag(session_meta, f"{where}.session_meta")
        self.per_session = flag(per_session, f"{where}.per_session")
        self._check_session_options(session_arg, max_sessions, max_sessions_per_tenant)
        self._session_uid_off: str | None = None  # why the default could not give each session a uid
        self.session_uid = self._check_session_uid(session_uid)
        self.session_arg = session_arg
        self.max_sessions = int(max_sessions)
        self.max_sessions_per_tenant = (
            max(1, self.max_sessions * 3 // 4)
            if max_sessions_per_tenant is None
            else min(int(max_sessions_per_tenant), self.max_sessions)
        )
        self.max_message_bytes = byte_limit(max_message_bytes, f"{where}.max_message_bytes")
        self.disabled_tools = frozenset(disabled_tools)
        self.restart = restart
        self.errlog = errlog
        # Called (on the event loop) whenever the tool list changes: Upstreams syncs the registry.
        self.on_tools_changed: Callable[[UpstreamServer], None] | None = None

        self._catalog: list[UpstreamTool] = []
        self._upstream_names: dict[str, str] = {}  # local (exported, no namespace) name -> upstream name
        self._refused: dict[str, str] = {}  # exported name -> why it is not served
        self._link = Supervisor(self)
        self._pool = (
            SessionPool(self, self.max_sessions, self.max_sessions_per_tenant) if self.per_session else None
        )
        # A per_session server's spec as configured, ${session} and ${session_dir} still in it:
        # each process gets it filled in (spawn_instance; start, for the one that lists the tools).
        self._template = self.spec if self.per_session and isinstance(self.spec, StdioSpec) else None
        self._private_dir: str | None = None  # this process's ${session_dir}, removed by stop()
        self._uid: int | None = None  # the uid this process runs as (session_uid), freed by stop()

    def _check_names(self) -> None:
        where = f"mcpServers.{self.name}"
        if UNSAFE_NAME.search(self.namespace):
            raise ValueError(f"{where}.namespace {self.namespace!r} must use only [A-Za-z0-9_-]")
        if _SERVER_NAME_BAD.search(self.separator):
            raise ValueError(f"{where}: separator {self.separator!r} must use only [A-Za-z0-9_.-]")
        if len(self.prefix) > MAX_NAME_LENGTH // 2:
            raise ValueError(f"{where}: namespace plus separator {self.prefix!r} is over 32 characters")

    def _check_session_options(self, session_arg: Any, max_sessions: Any, per_tenant: Any) -> None:
        where = f"mcpServers.{self.name}"
        if session_arg is not None and (not isinstance(session_arg, str) or not session_arg):
            raise ValueError(f"{where}.session_arg must be an argument name, got {session_arg!r}")
        if self.per_session and not isinstance(self.spec, StdioSpec):
            raise ValueError(f"{where}.per_session needs a stdio server (a command): a URL is one server")
        placeholders = session_placeholders(self.spec)
        if placeholders and (not self.per_session or "command" in placeholders):
            raise ValueError(
                f"{where}.{placeholders[0]} uses ${{session}} or ${{session_dir}}, which only the args, env "
                "and cwd of a per_session server have (one process per session); set per_session: true, "
                "or let one shared process tell sessions apart with session_arg"
            )
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"{where}.max_sessions must be a positive integer, got {max_sessions!r}")
        if per_tenant is not None and (
            isinstance(per_tenant, bool) or not isinstance(per_tenant, int) or per_tenant < 1
        ):
            raise ValueError(
                f"{where}.max_sessions_per_tenant must be a positive integer (or null), got {per_tenant!r}"
            )

    def _check_session_uid(self, session_uid: Any) -> bool:
        """Whether each session's process gets a uid of its own. Asked for (``true``) but not
        possible: ValueError saying why. Left to the default: yes when it is possible, else
        no, logged once and shown in ``status()`` (``session_uid_off``)."""
        where = f"mcpServers.{self.name}.session_uid"
        wanted = None if session_uid is None else flag(session_uid, where)
        if not self.per_session or wanted is False:
            return False
        why_not = _why_no_session_uid(self.spec)
        if why_not is None:
            return True
        if wanted:
            raise ValueError(f"{where}: {why_not}; or set session_uid: false")
        self._session_uid_off = why_not
        logger.warning(
            "upstream %s: its sessions' processes share the tool server's uid (they can read each "
            "other's files): %s; set session_uid: true to make this an error",
            self.name,
            why_not,
        )
        return False

    # ---------------------------------------------------------------- public view

    @property
    def transport(self) -> str:
        return "stdio" if isinstance(self.spec, StdioSpec) else "http"

    @property
    def healthy(self) -> bool:
        return self._link.state == "ready"

    @property
    def state(self) -> State:
        return self._link.state

    @property
    def last_error(self) -> str | None:
        return self._link.last_error

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
        up_since = self._link.connected_at
        status = {
            "name": self.name,
            "transport": self.transport,
            "state": self._link.state,
            "healthy": self.healthy,
            "required": self.required,
            "restarts": self._link.restarts,
            "last_error": self._link.last_error,
            "tools": len(self._catalog),
            "refused_tools": list(self._refused.values()),
            "protocol_version": self._link.protocol_version,
            "uptime_s": round(time.monotonic() - up_since, 3) if up_since is not None else None,
        }
        if self._pool is not None:
            status["session_uid"] = self.session_uid
            if self._session_uid_off is not None:
                status["session_uid_off"] = self._session_uid_off
            status["sessions"] = len(self._pool)
            status["max_sessions"] = self.max_sessions
            status["max_sessions_per_tenant"] = self.max_sessions_per_tenant
        return status

    # ------------------------------------------------------------------ lifecycle

    @property
    def started(self) -> bool:
        """Whether ``start`` ran and ``stop`` did not since."""
        return self._link.started

    async def start(self, *, wait: bool = True) -> None:
        """Launch the supervisor; with ``wait``, wait (bounded) for the first connection attempt.

        Returns even if the upstream could not be reached: ``healthy`` is then False,
        ``last_error`` says why, and the supervisor keeps retrying in the background.
        """
        if self._template is not None and self._private_dir is None:
            # The process that lists the tools serves no session: it gets a directory and an id of its own.
            self._private_dir = _new_private_dir(self.name)
            spec = for_session(self._template, CATALOG_SESSION, self._private_dir)
            self.spec, self._uid = self._own_user(spec, self._private_dir)
        self._link.start()
        if wait:
            await self.wait_attempted(self.connect_timeout_s + 5)

    async def wait_attempted(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the first connection attempt ended, either way."""
        return await self._link.wait_attempted(timeout_s)

    async def stop(self) -> None:
        """Close the connection (and the subprocess) and every per-session instance.

        Prompt even mid-handshake: the supervisor is cancelled, and the SDK's shielded
        shutdown still ends the process (close stdin, then SIGTERM, then SIGKILL).
        Idempotent.
        """
        waits = [self._link.stop()] + ([self._pool.stop()] if self._pool is not None else [])
        await asyncio.gather(*waits, return_exceptions=True)
        if self._private_dir is not None:  # after the process: it may write there until it ends
            directory, self._private_dir = self._private_dir, None
            await anyio.to_thread.run_sync(shutil.rmtree, directory, True)
        if self._uid is not None:  # its processes are gone (the reaper ends the tree), its files too
            UIDS.release(self._uid)
            self._uid = None

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
        tenant: str = ANONYMOUS_TENANT,
    ) -> Result:
        """Call one upstream tool by its name without the namespace; never raises.

        ``session`` (the trajectory's) travels as configured: in ``_meta``, in the
        ``session_arg`` argument, or by choosing the session's own instance, which counts
        against ``tenant``'s share (the token that owns the session).
        """
        started = time.perf_counter()
        deadline = self.call_timeout_s if timeout_s is None else float(timeout_s)
        arguments = dict(arguments or {})
        if self.session_arg is not None and session is not None:
            arguments[self.session_arg] = session.id  # the session decides the world, not the model
        meta = request_meta(call_id, session) if self.session_meta else None
        target = self
        if self._pool is not None and session is not None:
            # The session's instance may have to start first: that counts against the deadline.
            try:
                with anyio.fail_after(deadline):
                    target = await self._pool.instance_for(session, tenant)
            except TimeoutError:
                message = (
                    f"no instance of {self.label} was ready for this session within the call's "
                    f"{deadline:g} s (it may be still starting); retry"
                )
                return failure(call_id, ErrorKind.TIMEOUT, message, started)
            except ToolError as refused:
                return failure(call_id, refused.kind, refused.message, started)
            deadline = max(deadline - (time.perf_counter() - started), 0.001)
        return await target._forward(name, arguments, deadline, call_id, meta, started)

    async def _forward(
        self,
        name: str,
        arguments: dict[str, Any],
        deadline: float,
        call_id: str,
        meta: dict[str, Any] | None,
        started: float,
    ) -> Result:
        client = self._link.client
        if client is None or not self.healthy:
            why = f" (last error: {self.last_error})" if self.last_error else ""
            message = f"{self.label} is {self.state}{why}; retry later"
            return failure(call_id, ErrorKind.UNAVAILABLE, message, started)
        upstream_name = self._upstream_names.get(name)
        if upstream_name is None:
            return failure(
                call_id, ErrorKind.UNKNOWN_TOOL, f"{self.label} has no tool named {name!r}", started
            )
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
        except Exception as exc:
            error = call_error(
                exc,
                tool=self.qualified(name),
                upstream_tool=upstream_name,
                label=self.label,
                deadline=deadline,
            )
            if error.lost is not None:
                self._link.lost(error.lost)
            return failure(call_id, error.kind, error.message, started)
        return call_outcome(raw, call_id, started)

    # --------------------------------------------------------- per-session pool

    def _own_user(self, spec: StdioSpec, directory: str) -> tuple[StdioSpec, int | None]:
        """``spec`` run as a uid of its own (``session_uid``), which then owns its private
        ``directory`` (mode 0700: no other session's process may enter it) and has it as ``HOME``
        unless ``env`` sets one; and that uid, to free when the process has stopped."""
        if not self.session_uid:
            return spec, None
        uid = UIDS.acquire()
        try:
            os.chown(directory, uid, uid)
        except BaseException:
            UIDS.release(uid)
            raise
        return dataclasses.replace(spec, uid=uid, env={"HOME": directory, **spec.env}), uid

    def spawn_instance(self, session_id: str) -> UpstreamServer:
        """A new, unstarted instance of this server for one session (``per_session``), with a
        private directory of its own (removed by its ``stop``); ToolError if it cannot have one."""
        assert self._template is not None  # per_session is checked to be stdio
        try:
            directory = _new_private_dir(self.name)
        except OSError as exc:
            raise ToolError(
                f"cannot create this session's directory for {self.label}: {exc}; free space in "
                f"{tempfile.gettempdir()} (TMPDIR)",
                ErrorKind.UNAVAILABLE,
            ) from None
        try:
            spec = for_session(self._template, session_id, directory)
        except ValueError as exc:
            shutil.rmtree(directory, ignore_errors=True)
            raise ToolError(f"{self.label}: {exc}", ErrorKind.BAD_REQUEST) from None
        try:
            spec, uid = self._own_user(spec, directory)
        except Exception as exc:  # no uid left, or the directory could not be handed over
            shutil.rmtree(directory, ignore_errors=True)
            raise ToolError(
                f"{self.label}: cannot give this session a uid of its own: {exc}", ErrorKind.UNAVAILABLE
            ) from None
        instance = UpstreamServer(
            self.name,
            spec,
            namespace=self.namespace,
            separator=self.separator,
            call_timeout_s=self.call_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            max_message_bytes=self.max_message_bytes,
            health_interval_s=None,
            disabled_tools=self.disabled_tools,
            restart=False,  # a restarted process would be a fresh world: the session's state is gone
            errlog=self.errlog,
        )
        instance.session_meta = False  # the parent sets _meta and arguments
        instance._private_dir = directory
        instance._uid = uid
        instance._refused = dict(self._refused)  # already logged by the parent
        instance.label = f"this session's instance of {self.label}"
        return instance

    # ------------------------------------------------------------------ tool list

    async def apply_tools(self, listed: list[dict[str, Any]]) -> bool:
        """Take the upstream's ``tools/list`` (the supervisor's); returns whether the catalog changed.

        Its schemas are checked in a worker thread: that is CPU work on what the upstream sent
        (a metaschema walk, every pattern compiled), and the event loop serves everyone else.
        """
        refused: dict[str, str] = {}
        catalog = await anyio.to_thread.run_sync(build_catalog, self, listed, refused)
        for why in (why for name, why in refused.items() if self._refused.get(name) != why):
            logger.warning("upstream %s: %s", self.name, why)  # once, not on every probe
        self._refused = refused
        changed = catalog != self._catalog
        self._catalog = catalog
        self._upstream_names = {tool.local: tool.upstream_name for tool in catalog}
        return changed

    def tools_changed(self) -> None:
        """Tell ``on_tools_changed`` (Upstreams: the registry follows)."""
        if self.on_tools_changed is None:
            return
        try:
            self.on_tools_changed(self)
        except Exception:  # the registry's trouble must not take the connection down
            logger.exception("upstream %s: applying its new tool list failed", self.name)


def _new_private_dir(server: str) -> str:
    """A new directory only this user may enter (``mkdtemp``), in the tool server's TMPDIR."""
    return tempfile.mkdtemp(prefix=f"toolfactory-{server}-")


def _why_no_session_uid(spec: StdioSpec | HttpSpec) -> str | None:
    """Why a process of ``spec`` cannot run as a uid of its own here, or None if it can: that
    needs root, a TMPDIR other users can reach (the process's directory is there), and a
    command they can run."""
    if os.geteuid() != 0:
        return "running each session's process as a uid of its own needs a tool server running as root"
    temp = tempfile.gettempdir()
    blocked = _not_traversable(temp)
    if blocked is not None:
        return (
            f"each session's process would run as a uid of its own and must reach its directory under "
            f"TMPDIR {temp!r}, but other users cannot enter {blocked!r} (chmod o+x it, or set TMPDIR)"
        )
    assert isinstance(spec, StdioSpec)  # per_session is checked to be stdio
    found = shutil.which(spec.command, path=spec.env.get("PATH") or os.environ.get("PATH", os.defpath))
    # The command, and the interpreter of a script (a venv's console script names its python).
    for command in [] if found is None else [found, *_interpreter(found)]:
        real = os.path.realpath(command)
        blocked = _not_traversable(os.path.dirname(real))
        if blocked is not None or not os.stat(real).st_mode & stat.S_IXOTH:
            return (
                f"each session's process would run as a uid of its own, but other users cannot run "
                f"its command {spec.command!r} ({real}: {blocked or 'not executable by others'} "
                "is closed to them); install it where they can"
            )
    return None


def _interpreter(path: str) -> list[str]:
    """The program a ``#!`` script names, if it is one (and the path exists)."""
    try:
        with open(path, "rb") as script:
            head = script.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    words = head[2:].split(b"\n", 1)[0].split()
    program = words[0].decode(errors="replace") if words else ""
    return [program] if os.path.isabs(program) and os.path.exists(program) else []


def _not_traversable(path: str) -> str | None:
    """The first directory on the way to ``path`` (itself included) that other users cannot enter."""
    current = os.path.abspath(path)
    while True:
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
