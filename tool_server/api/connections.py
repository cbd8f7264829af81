"""Connection limits for uvicorn: header and body read timeouts, and a cap on open connections.

uvicorn's httptools protocol only times out *idle* keep-alive connections. A client that
connects and never finishes its request headers, or declares a body and never sends it,
keeps its socket (an fd and its buffers) forever; 20k such connections exhausted the fd
limit. ``GuardedProtocol``, passed to uvicorn as ``http=``, adds:

* a header timeout: a request's headers must be complete within ``header_timeout_s`` of
  the connection opening (first request) or of the request's first byte (later ones).
  Otherwise the client gets a 408 and the connection is closed (closed silently when it
  sent nothing at all).
* a body timeout: the whole body must arrive within ``body_timeout_s`` of the headers,
  otherwise 408 and close; the application sees a disconnect.
* a connection cap: with ``max_connections`` open, a new connection evicts the
  longest-waiting connection that has no request in progress (an idle keep-alive one, or
  one still sending its headers: what a slow-loris holds). Only when every connection
  has a request in progress is the new one refused: 503 with Retry-After, then closed.
  So slow clients can never lock out a client that sends its request promptly, and
  open fds stay below the cap plus a bounded number of refusals being answered.

Both timers count only while the server is reading: when uvicorn pauses reading (flow
control, pipelined requests), the wait is the server's, not the client's.

A connection upgraded to a WebSocket (``/v1/stream``) stays counted while it is open
(``ws_frames.GuardedWebSocketProtocol``, passed to uvicorn as ``ws=``), so WebSockets cannot
take fds past the cap either. A stream belongs to its handshake's tenant, which may hold at most
``max_streams_per_tenant`` of them (429 at the handshake beyond). While it has a frame in flight
it is not evictable; idle, it is, after the idle HTTP connections: the stream of the tenant
holding the most streams that has been idle longest is closed with 1013 (try again later; its
client may be between two calls of an episode, and reconnects for the next). So one token's
idle streams never lock another tenant out.

uvicorn's ``limit_concurrency`` does not fit: it answers 503 only once the headers are
complete (a slow-loris never gets there, and the refused connection stays open until it
does), and it counts running requests as well, so a burst of in-flight batches would be
refused with 503 where the executor's queue answers 429 with per-call results.
"""

from __future__ import annotations

import asyncio
import http
import logging
import resource
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tool_server.config import ConfigError
from tool_server.executor.admission import ANONYMOUS_TENANT

log = logging.getLogger("tool_server.api.connections")

_IDLE, _HEADERS, _BODY = 0, 1, 2  # what a connection is waiting for from its client

# A refused connection is answered when its request arrives and closed then (reading the
# request first avoids a TCP reset that could destroy the 503), or after this long.
REFUSAL_LINGER_S = 1.0
MAX_REFUSALS_LINGERING = 1024  # beyond this many at once, refusals are answered and closed at once
LOG_EVERY_S = 10.0
_EVENTS = ("refused", "evicted", "header timeouts", "body timeouts")


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 8192
    retry_after_s: int = 1
    max_streams_per_tenant: int | None = None  # None: 3/4 of max_connections

    def stream_share(self, tenant: str) -> int:
        """Open streams one tenant may hold (a server without tokens: as many as it may open)."""
        if tenant == ANONYMOUS_TENANT:
            return self.max_connections
        if self.max_streams_per_tenant is not None:
            return self.max_streams_per_tenant
        return max(1, self.max_connections * 3 // 4)


class Evictable(Protocol):
    def evict(self) -> None: ...


@dataclass
class ConnectionGuard:
    """State shared by one server's connections."""

    limits: ConnectionLimits
    open: int = 0  # admitted connections
    lingering: int = 0  # refused connections not yet closed
    # Admitted connections with no request in progress, longest-waiting first: eviction order.
    waiting: dict[GuardedProtocol, None] = field(default_factory=dict)
    # Open streams (ws_frames.GuardedWebSocketProtocol) by tenant, and those with no frame in
    # flight by tenant, longest-idle first: evicted after idle HTTP connections.
    streams: dict[str, int] = field(default_factory=dict)
    idle_streams: dict[str, dict[Evictable, None]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_EVENTS, 0))
    _logged_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_EVENTS, 0))
    _logged_at: float = 0.0

    def evict_one(self) -> bool:
        """Close the longest-waiting connection without a request in progress; False if none.

        An HTTP one first (idle keep-alive, or headers still coming), else an idle stream of the
        tenant holding the most streams: one tenant's idle streams cannot keep out another's
        requests, and the tenant that holds most gives way first.
        """
        if self.waiting:
            next(iter(self.waiting)).evict()
            return True
        if self.idle_streams:
            streams = self.streams
            tenant = max(self.idle_streams, key=lambda t: streams[t])
            next(iter(self.idle_streams[tenant])).evict()
            return True
        return False

    def add_stream(self, tenant: str) -> str | None:
        """Count an open stream of ``tenant``; or, without counting it, why it may not open."""
        held, share = self.streams.get(tenant, 0), self.limits.stream_share(tenant)
        if held >= share:
            return (
                f"your token holds {held} open /v1/stream connections; one token may hold {share} "
                "(server.max_streams_per_tenant): send more calls over the ones you have"
            )
        self.streams[tenant] = held + 1
        return None

    def remove_stream(self, tenant: str, stream: Evictable) -> None:
        self.stream_idle(tenant, stream, False)
        left = self.streams[tenant] - 1
        if left:
            self.streams[tenant] = left
        else:
            del self.streams[tenant]

    def stream_idle(self, tenant: str, stream: Evictable, idle: bool) -> None:
        """Mark a stream idle (evictable, now the newest) or busy (not evictable)."""
        idle_streams = self.idle_streams
        if idle:
            idle_streams.setdefault(tenant, {})[stream] = None
            return
        of_tenant = idle_streams.get(tenant)
        if of_tenant is not None:
            of_tenant.pop(stream, None)
            if not of_tenant:
                del idle_streams[tenant]

    def note(self, event: str) -> None:
        """Count an event; log a summary at most every LOG_EVERY_S (a flood must not flood the log)."""
        self.counts[event] += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            recent = {k: v - self._logged_counts[k] for k, v in self.counts.items()}
            log.warning(
                "slow or excess connections: %s (%d open, limit %d)",
                ", ".join(f"{v} {k}" for k, v in recent.items() if v),
                self.open,
                self.limits.max_connections,
            )
            self._logged_counts = dict(self.counts)
            self._logged_at = now


def error_response_bytes(
    status: int, kind: str, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 response with our JSON error body."""
    body = orjson.dumps({"error": {"kind": kind, "message": message}})
    lines = [
        b"HTTP/1.1 %d %s" % (status, http.HTTPStatus(status).phrase.encode()),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    lines += [name + b": " + value for name, value in headers or []]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read timeouts and a connection cap (module docstring).

    Use ``guarded_protocol(limits)``: it binds a fresh ``guard`` (the shared state).
    """

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._admitted = False
        self._lingering = False
        self._phase = _HEADERS
        self._begun = False  # bytes of the current request have arrived
        self._completed = 0  # requests fully received
        self._body_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_for = (_IDLE, -1)  # (phase, request) the running timer measures

    # -- connection lifetime ------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self.guard
        if guard.open >= guard.limits.max_connections and not guard.evict_one():
            self._refuse(transport)
            return
        super().connection_made(transport)
        self._admitted = True
        guard.open += 1
        guard.waiting[self] = None
        self._sync_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lingering:
            self._lingering = False
            self.guard.lingering -= 1
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # a refused connection's request: answer it and close
            self._close_with(self._refusal())
            return
        super().data_received(data)
        self._sync_timer()

    def handle_websocket_upgrade(self) -> None:
        self._release()  # the websocket protocol takes the connection over
        super().handle_websocket_upgrade()

    def on_response_complete(self) -> None:
        idle = not self.pipeline
        super().on_response_complete()
        if idle and self._admitted and not self.transport.is_closing():
            self.guard.waiting[self] = None  # evictable again, now the newest

    # -- parser callbacks: track what the connection waits for ----------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEADERS
        self._begun = True

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._body_bytes = 0
        self.guard.waiting.pop(self, None)  # a request in progress: not evictable
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._begun = False
        self._completed += 1
        super().on_message_complete()

    # -- timers -----------------------------------------------------------------------

    def _sync_timer(self) -> None:
        """Run a timer for the current phase of the current request; none while idle.

        Called after each read: a whole request usually arrives in one read, and then no
        timer is started at all.
        """
        wanted = (self._phase, self._completed)
        if wanted == self._timer_for or not self._admitted:  # not ours: closing, or upgraded
            return
        self._cancel_timer()
        self._timer_for = wanted
        if self._phase != _IDLE and not self.transport.is_closing():
            self._arm()

    def _arm(self) -> None:
        limits = self.guard.limits
        timeout = limits.header_timeout_s if self._phase == _HEADERS else limits.body_timeout_s
        self._timer = self.loop.call_later(timeout, self._on_timeout)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # we stopped reading, not the client: give it a new period
            self._arm()
            return
        limits = self.guard.limits
        if self._phase == _HEADERS:
            self.guard.note("header timeouts")
            if not self._begun:  # never sent a byte: nothing to answer
                self._close_with(b"")
                return
            message = f"request headers not complete within {limits.header_timeout_s:g} s"
        else:
            self.guard.note("body timeouts")
            cycle = self.cycle
            if cycle is None or cycle.response_started:  # answered already (or answering)
                self._close_with(b"")
                return
            # The application waits in receive(): it now gets http.disconnect and its sends
            # become no-ops, so only our 408 reaches the client.
            cycle.disconnected = True
            cycle.message_event.set()
            message = (
                f"request body not received within {limits.body_timeout_s:g} s "
                f"(got {self._body_bytes} of {self._declared_length()} bytes)"
            )
        self._close_with(error_response_bytes(408, "timeout", message, self.server_state.default_headers))

    def _declared_length(self) -> str:
        for name, value in self.headers or []:
            if name == b"content-length":
                return value.decode("latin-1")
        return "?"

    # -- refusal and eviction -------------------------------------------------------------

    def _refusal(self, why: str = "all with requests in progress") -> bytes:
        limits = self.guard.limits
        return error_response_bytes(
            503,
            "overloaded",
            f"the server has its limit of {limits.max_connections} connections open, {why}; "
            f"retry after {limits.retry_after_s} s",
            [(b"retry-after", str(limits.retry_after_s).encode()), *self.server_state.default_headers],
        )

    def _refuse(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        guard = self.guard
        guard.note("refused")
        if guard.lingering >= MAX_REFUSALS_LINGERING:
            self._close_with(self._refusal())
            return
        guard.lingering += 1
        self._lingering = True
        self._timer = self.loop.call_later(REFUSAL_LINGER_S, self._close_with, self._refusal())

    def evict(self) -> None:
        """Make room for a new connection: answer a half-sent request with 503, then close."""
        self.guard.note("evicted")
        why = "and this one had the oldest incomplete request"
        self._close_with(self._refusal(why) if self._begun else b"")

    def _close_with(self, response: bytes) -> None:
        self._release()
        if not self.transport.is_closing():
            if response:
                self.transport.write(response)
            self.transport.close()

    def _release(self) -> None:
        """Stop counting this connection: it is closing (or no longer ours)."""
        self._cancel_timer()
        if self._admitted:
            self._admitted = False
            self.guard.open -= 1
            self.guard.waiting.pop(self, None)


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A protocol class for ``uvicorn.run(http=...)`` with its own shared state."""
    return type("GuardedHttpToolsProtocol", (GuardedProtocol,), {"guard": ConnectionGuard(limits)})


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one; returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = hard if hard != resource.RLIM_INFINITY else 1 << 20  # Linux's usual nr_open
    if soft == resource.RLIM_INFINITY:
        return ceiling
    if soft < ceiling:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            soft = ceiling
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(configured: int, fd_limit: int) -> int:
    """``configured``, lowered so that a quarter of the fds (256 at least) stay for the rest.

    Tools, sandboxes, session databases, upstream servers and refused connections being
    answered all need fds too.
    """
    return min(configured, max(16, fd_limit - max(256, fd_limit // 4)))


def limits_from_config(server: Any, retry_after_s: int) -> ConnectionLimits:
    """Build the limits from ``config.server``, raising the fd limit first; logs the result."""
    fd_limit = raise_fd_limit()
    cap = connection_cap(server.max_connections, fd_limit)
    if cap < server.max_connections:
        log.warning(
            "server.max_connections lowered from %d to %d to fit the open-files limit (%d)",
            server.max_connections,
            cap,
            fd_limit,
        )
    share = server.max_streams_per_tenant
    if share is not None and share < 1:
        raise ConfigError(f"server.max_streams_per_tenant must be at least 1 (or null), got {share}")
    return ConnectionLimits(
        header_timeout_s=server.header_timeout_s,
        body_timeout_s=server.body_timeout_s,
        max_connections=cap,
        retry_after_s=retry_after_s,
        max_streams_per_tenant=share,
    )
