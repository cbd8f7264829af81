"""Keeps one upstream's connection alive: connect, list its tools, watch, reconnect with backoff.

A stdio process that dies shows itself by closing its stdout; a hung one, or an HTTP
server gone while idle, by failing the periodic ``tools/list`` probe. Either way the
connection is dropped and made again after a backoff that doubles on each failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol, TextIO

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client
from mcp_types import ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tool_server.upstream.config import HttpSpec, StdioSpec
from tool_server.upstream.stderr import StderrCapture
from tool_server.upstream.tools import output_validator
from tool_server.upstream.transport import HttpNotes, describe_failure, open_transport

__all__ = ["State", "Supervisor"]

logger = logging.getLogger("tool_server.upstream")

State = Literal["stopped", "starting", "ready", "restarting", "exited"]

_MAX_LIST_PAGES = 100
_STOP_TIMEOUT_S = 10.0  # the SDK's own shutdown (close stdin, SIGTERM, SIGKILL) fits in this


class Supervised(Protocol):
    """What the supervisor reads and calls back of its upstream (``server.UpstreamServer``)."""

    name: str
    spec: StdioSpec | HttpSpec
    restart: bool
    restart_backoff: tuple[float, float]
    connect_timeout_s: float
    call_timeout_s: float
    health_interval_s: float | None
    max_message_bytes: int
    errlog: TextIO | None
    catalog: list[Any]

    async def apply_tools(self, listed: list[dict[str, Any]]) -> bool: ...

    def tools_changed(self) -> None: ...


class Supervisor:
    """The connection of ``server`` (its settings, its tool list) and the task that keeps it up."""

    def __init__(self, server: Supervised) -> None:
        self.server = server
        self.state: State = "stopped"
        self.restarts = 0
        self.last_error: str | None = None
        self.connected_at: float | None = None
        self.protocol_version: str | None = None
        self.client: Client | None = None  # set while the connection is up
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._wake: anyio.Event | None = None  # set when the current connection (or backoff) should end
        self._attempted = asyncio.Event()
        self._cancel_scope: anyio.CancelScope | None = None  # made in start(): it needs the event loop
        self._stderr: StderrCapture | None = None
        self._http_notes: HttpNotes | None = None  # the current connection's HTTP refusals

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Launch the supervising task (once; again after ``stop``)."""
        if self._task is not None:
            return
        self._stopping = False
        self._attempted = asyncio.Event()
        self._cancel_scope = anyio.CancelScope()
        self.state = "starting"
        self._task = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"upstream:{self.server.name}"
        )

    async def wait_attempted(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the first connection attempt ended, either way."""
        with anyio.move_on_after(timeout_s):
            await self._attempted.wait()
        return self._attempted.is_set()

    async def stop(self) -> None:
        """End the task, the connection and the subprocess; prompt even mid-handshake."""
        task, self._task = self._task, None
        if task is not None:
            self._stopping = True
            if self._cancel_scope is not None:
                self._cancel_scope.cancel()
            await self._reap(task)
        self.state = "stopped"
        self.client = None

    def lost(self, reason: str) -> None:
        """The connection is gone (or unusable): stop taking calls and reconnect."""
        if self.state == "ready" and not self._stopping:
            self.state = "restarting" if self.server.restart else "exited"
            self.last_error = self._with_stderr(reason)
            logger.warning("upstream %s lost: %s", self.server.name, self.last_error)
        if self._wake is not None:
            self._wake.set()

    async def _reap(self, task: asyncio.Task[None]) -> None:
        done, _ = await asyncio.wait({task}, timeout=_STOP_TIMEOUT_S)
        if not done:  # a transport that ignores its own shutdown bounds: cut it off
            logger.warning(
                "upstream %s did not stop within %g s; cancelling it", self.server.name, _STOP_TIMEOUT_S
            )
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _supervise(self) -> None:
        shortest, longest = self.server.restart_backoff
        delay = shortest
        first = True
        try:
            with self._cancel_scope or anyio.CancelScope():
                while not self._stopping:
                    if not first:
                        self.restarts += 1
                    first = False
                    uptime = await self._connect_and_serve()
                    if self._stopping or not self.server.restart:
                        break
                    if uptime is not None and uptime >= longest:
                        delay = shortest
                    self.state = "restarting"
                    wake = self._wake = anyio.Event()
                    with anyio.move_on_after(delay):
                        await wake.wait()
                    delay = min(delay * 2, longest)
        finally:
            self.client = None
            self.state = "stopped" if self._stopping or self.server.restart else "exited"
            self._attempted.set()
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None

    async def _connect_and_serve(self) -> float | None:
        """One connection's life; returns how long it was up (None if it never came up)."""
        wake = self._wake = anyio.Event()
        try:
            await self._connect(wake)
        except Exception as exc:  # every failure becomes last_error; the loop retries
            if not self._stopping:
                self.last_error = self._describe(exc)
                logger.warning("upstream %s: %s", self.server.name, self.last_error)
        finally:
            up_since, self.connected_at = self.connected_at, None
            self.client = None
            if self.state == "ready":
                self.state = "restarting" if self.server.restart else "exited"
            self._attempted.set()
        return None if up_since is None else time.monotonic() - up_since

    async def _connect(self, wake: anyio.Event) -> None:
        """Connect, list the tools, serve calls until the connection ends (``wake``).

        ``connect_timeout_s`` bounds each request of the handshake and the listing, not
        their sum: a stdio server's start-up (``uvx``, ``npx`` fetching a package) counts
        against the first, which the SDK's ``server/discover`` probe gives 10 s at least.
        """
        server = self.server
        # A change of the tool list, announced: a handshake-era server sends the notification
        # unasked; a 2026-07-28 one sends it on a subscriptions/listen stream (_follow).
        notices, noticed = anyio.create_memory_object_stream[None](1)

        async def on_message(message: Any) -> None:
            if isinstance(message, ToolListChangedNotification):
                _notify(notices)

        transport = self._transport(lambda: self.lost("the connection ended (process exited?)"))
        async with (
            notices,
            noticed,
            Client(
                transport, read_timeout_seconds=server.connect_timeout_s, message_handler=on_message
            ) as client,
        ):
            _outputs_on_re2(client, self.server)
            changed = await self._load_tools(client)
            self.protocol_version = client.protocol_version
            self.client = client
            self.connected_at = time.monotonic()
            if self._stderr is not None:
                self._stderr.mark()  # what it said while starting is not news later
            self.state = "ready"
            self._attempted.set()
            logger.info("upstream %s ready (%d tools)", server.name, len(server.catalog))
            if changed:
                server.tools_changed()
            async with anyio.create_task_group() as followers:
                followers.start_soon(self._follow, client, notices)
                followers.start_soon(self._reread_on_notice, client, noticed)
                await self._watch(client, wake)
                followers.cancel_scope.cancel()

    async def _follow(self, client: Client, notices: MemoryObjectSendStream[None]) -> None:
        """Subscribe to tool-list changes (2026-07-28 servers); each event is a notice."""
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                _notify(notices)  # no replay: what changed before the subscription is read now
                async for _event in subscription:
                    _notify(notices)
        except Exception as exc:  # no subscriptions here: the periodic probe still sees changes
            logger.debug("upstream %s: no tools/list_changed subscription (%s)", self.server.name, exc)

    async def _reread_on_notice(self, client: Client, noticed: MemoryObjectReceiveStream[None]) -> None:
        async for _notice in noticed:
            await self._probe(client)

    async def _watch(self, client: Client, wake: anyio.Event) -> None:
        """Wait for the connection to end; meanwhile probe it now and then.

        A dead stdio process shows itself by closing its stdout, but a hung one or an HTTP
        server that went away while idle does not: a periodic ``tools/list`` finds both,
        and also picks up a changed tool list that was not announced.
        """
        interval = self.server.health_interval_s
        if interval is None:
            await wake.wait()
            return
        while not wake.is_set():
            with anyio.move_on_after(interval):
                await wake.wait()
            if not wake.is_set():
                await self._probe(client)

    async def _probe(self, client: Client) -> None:
        """Read the tool list again: the registry follows a change; a failure drops the connection."""
        probe_timeout = min(self.server.connect_timeout_s, self.server.call_timeout_s)
        try:
            with anyio.fail_after(probe_timeout):
                changed = await self._load_tools(client, refresh=True)
        except TimeoutError:
            self.lost(f"health check failed: no answer to tools/list within {probe_timeout:g} s")
        except Exception as exc:  # any failure of the probe means the connection is not usable
            self.lost(f"health check failed: {self._describe(exc)}")
        else:
            if changed:
                self.server.tools_changed()

    async def _load_tools(self, client: Client, *, refresh: bool = False) -> bool:
        """Fetch the tool list and hand it to the server; returns whether it changed."""
        listed: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(_MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
            listed += [tool.model_dump(by_alias=True, exclude_none=True) for tool in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                break
        return await self.server.apply_tools(listed)

    def _transport(self, on_end: Callable[[], None]) -> Any:
        server = self.server
        errlog = server.errlog
        if isinstance(server.spec, StdioSpec) and errlog is None:
            if self._stderr is not None:
                self._stderr.close()
            self._stderr = StderrCapture()
            errlog = self._stderr.file
        self._http_notes = HttpNotes() if isinstance(server.spec, HttpSpec) else None
        return open_transport(
            server.spec,
            on_end,
            errlog=errlog,
            connect_timeout_s=server.connect_timeout_s,
            call_timeout_s=server.call_timeout_s,
            max_message_bytes=server.max_message_bytes,
            notes=self._http_notes,
        )

    def _with_stderr(self, message: str) -> str:
        tail = self._stderr.excerpt() if self._stderr is not None else ""
        return f"{message}; stderr: {tail}" if tail else message

    def _describe(self, exc: BaseException) -> str:
        stderr = self._stderr.excerpt() if self._stderr is not None else ""
        return describe_failure(
            exc, self.server.name, self.server.spec, self.server.connect_timeout_s, stderr, self._http_notes
        )


def _outputs_on_re2(client: Client, server: Supervised) -> None:
    """The SDK checks each result against the tool's ``outputSchema`` with jsonschema and
    Python's backtracking ``re``; the upstream wrote both. Its hook (mcp 2.3.0, pinned) gets
    ours, which runs the patterns on RE2 (``tools.output_validator``): the one the catalog
    built off the event loop for the same schema, else one built here."""
    kept: dict[str, tuple[Any, Any]] = {}  # tool -> (schema, its validator): built once per schema

    def validator(name: str, schema: dict[str, Any]) -> Any:
        if name not in kept or kept[name][0] is not schema:
            built = next(
                (
                    tool.check_output
                    for tool in server.catalog
                    if tool.upstream_name == name
                    and tool.check_output is not None
                    and tool.output_schema == schema
                ),
                None,
            )
            if isinstance(built, RuntimeError):
                raise built
            kept[name] = (schema, built if built is not None else output_validator(name, schema))
        return kept[name][1]

    client.session._output_schema_validator = validator  # type: ignore[method-assign]


def _notify(notices: MemoryObjectSendStream[None]) -> None:
    """One pending notice is enough: the next read of the list sees every change so far."""
    with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
        notices.send_nowait(None)
