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
(``GuardedWebSocketProtocol``, passed to uvicorn as ``ws=``), as one with a request in progress:
it is never evicted (its client may be between two calls of an episode, waiting for its model),
so WebSockets cannot take fds past the cap either. The same protocol hands the stream its
frames by call (``FrameLink``), without an ASGI message, queue and task per frame.

uvicorn's ``limit_concurrency`` does not fit: it answers 503 only once the headers are
complete (a slow-loris never gets there, and the refused connection stays open until it
does), and it counts running requests as well, so a burst of in-flight batches would be
refused with 503 where the executor's queue answers 429 with per-call results.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import resource
import struct
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C extension
    from websockets.utils import apply_mask

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


@dataclass
class ConnectionGuard:
    """State shared by one server's connections."""

    limits: ConnectionLimits
    open: int = 0  # admitted connections
    lingering: int = 0  # refused connections not yet closed
    # Admitted connections with no request in progress, longest-waiting first: eviction order.
    waiting: dict[GuardedProtocol, None] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_EVENTS, 0))
    _logged_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_EVENTS, 0))
    _logged_at: float = 0.0

    def evict_one(self) -> bool:
        """Close the longest-waiting connection without a request in progress; False if none."""
        if not self.waiting:
            return False
        victim = next(iter(self.waiting))
        victim.evict()
        return True

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


class FrameReceiver(Protocol):
    """What takes a connection's frames by call (``FrameLink.attach``): ``/v1/stream``'s connection."""

    def frame(self, data: bytes, text: bool) -> None: ...


class FrameLink(Protocol):
    """A WebSocket's frames without ASGI messages, queues or tasks: the ``FRAMES_EXTENSION``
    of the scope (``GuardedWebSocketProtocol`` offers it).

    Once the app has accepted the WebSocket and attached a receiver, each data frame (a whole
    message) goes to ``receiver.frame`` as it is parsed, in the order it came; ``receive()``
    then gives only what was queued before (in order, first) and the disconnect.
    """

    def attach(self, receiver: FrameReceiver) -> None: ...

    def send_frame(self, data: bytes, text: bool) -> bool:
        """Send one message now; False (nothing sent) once the connection is closing or gone."""
        ...

    def pause_frames(self) -> None:
        """Deliver no further frame, and read none, until ``resume_frames``."""
        ...

    def resume_frames(self) -> None: ...


FRAMES_EXTENSION = "toolfactory.frames"
_FIN, _RSV, _MASKED = 0x80, 0x70, 0x80
_TEXT, _BINARY, _PING, _PONG = 1, 2, 9, 10  # opcodes (RFC 6455 5.2); others go to websockets
_READ_HERE = frozenset({_TEXT, _BINARY, _PING, _PONG})
_MAX_CONTROL = 125  # bytes of a ping's or pong's payload
_LENGTH_16, _LENGTH_64 = struct.Struct("!BBH"), struct.Struct("!BBQ")
_U16, _U64 = struct.Struct("!H"), struct.Struct("!Q")


def frame_header(data: bytes, text: bool) -> bytes:
    """An unmasked (server to client) frame's header for a whole message (RFC 6455 5.2)."""
    first, size = _FIN | (_TEXT if text else _BINARY), len(data)
    if size < 126:
        return bytes((first, size))
    if size < 1 << 16:
        return _LENGTH_16.pack(first, 126, size)
    return _LENGTH_64.pack(first, 127, size)


def at_frame_boundary(conn: ServerProtocol) -> bool:
    """Whether websockets' parser of ``conn`` waits for the first byte of a frame, with nothing
    read ahead and no fragmented message begun: then the bytes that come next can be read by
    another parser, and given back to it at a frame's first byte."""
    try:
        if conn.reader.buffer or conn.current_size is not None:
            return False
        parser = conn.parser  # parse() -> ... -> reader.at_eof(): where it waits between frames
        while parser.gi_yieldfrom is not None:
            parser = parser.gi_yieldfrom
        return parser.__name__ == "at_eof"
    except AttributeError:  # another websockets than the one pinned: its parser reads every frame
        return False


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, counted in the guard from the upgrade until it closes, and
    offering its frames by call (``FrameLink``, under ``FRAMES_EXTENSION`` in the scope).

    ``GuardedProtocol.handle_websocket_upgrade`` stops counting the HTTP connection and hands
    its transport to this one, which counts it again: the count of open fds stays whole. Not
    evictable (module docstring). Use ``guarded_websocket_protocol(guard)``.

    Frames by call: uvicorn hands each message to the app as a dict through a queue, wakes the
    app's task for it and pauses and resumes reading around it, and websockets parses a frame
    through generators and Frame objects; for a stream of small calls that was most of a
    frame's cost beside the call itself (bench/stream_cost.py). Once a receiver is attached,
    the frames a client sends one message at a time (FIN set, text or binary, masked, reserved
    bits clear, within the size limit), and pings and pongs, are read here; at anything else
    (a fragment, a close, a protocol error, an oversized frame) the bytes from that frame on go
    to websockets' parser, which answers it as it always did, until it waits between frames
    again. Flow control: while the receiver has paused frames or the client does not read its
    answers (the transport's write buffer is full), frames already read wait here and no more
    are read, so TCP pushes back on the client.
    """

    guard: ClassVar[ConnectionGuard]
    _counted = False
    _receiver: FrameReceiver | None = None
    _own_frames = False  # the bytes after the handshake are read here, not by websockets
    _receiver_full = False  # pause_frames()
    _unwritable = False  # the transport's write buffer is over its high-water mark
    _reading_held = False
    _awaited = 0  # bytes of the frame begun in _partial, once its header is whole

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._counted = True
        self.guard.open += 1
        self._held: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._partial = bytearray()  # the start of a frame not yet whole (read here)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self.guard.open -= 1
        self._held.clear()
        self._receiver = None  # it holds this protocol (its sends): no cycle left behind
        super().connection_lost(exc)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        if self.response.status_code == 101:  # a scope was made (the app has not run yet)
            self.scope["extensions"][FRAMES_EXTENSION] = self

    # -- FrameLink ----------------------------------------------------------------------

    def attach(self, receiver: FrameReceiver) -> None:
        self._receiver = receiver
        self._own_frames = at_frame_boundary(self.conn)

    def send_frame(self, data: bytes, text: bool) -> bool:
        if self.close_sent or self.conn.state is not State.OPEN or self.transport.is_closing():
            return False
        # The frame as websockets would write it (a server does not mask), without its
        # Frame object and output buffer: uvicorn flushes that buffer after every use, so
        # nothing of it can be waiting to go before this.
        self.transport.write(frame_header(data, text) + data)
        return True

    def pause_frames(self) -> None:
        self._receiver_full = True
        self._hold_reading()

    def resume_frames(self) -> None:
        self._receiver_full = False
        self._deliver_held()

    # -- reading ----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self._own_frames:
            super().data_received(data)
            if self._receiver is not None and not self.close_sent:
                self._own_frames = at_frame_boundary(self.conn)  # read here again from now on
            return
        if self._partial:
            self._partial += data
            if len(self._partial) < self._awaited:
                return  # a large frame still coming: not copied again for each read
            data = bytes(self._partial)
            self._partial.clear()
        offset = self._read_frames(data)
        if offset is not None:  # websockets' parser takes it from that frame's first byte
            self._own_frames = False
            self.data_received(data[offset:])

    def _read_frames(self, data: bytes) -> int | None:
        """Read the whole frames of ``data`` that are read here and keep the start of one not
        yet whole; the offset of the first frame that is not read here, if any."""
        view, end, offset = memoryview(data), len(data), 0
        max_size = self.conn.max_message_size
        awaited = 0  # bytes of the frame at ``offset``, once its header is whole
        while offset < end:
            if self.close_sent:
                return offset  # the app has closed: websockets reads the peer's close
            first = data[offset]
            opcode = first & 0x0F
            if first & _RSV or not first & _FIN or opcode not in _READ_HERE:
                return offset  # a fragment, a close, or a protocol error
            if end - offset < 2:
                break
            second, head = data[offset + 1], offset + 2
            if not second & _MASKED:
                return offset
            size = second & 0x7F
            if size == 126:
                if end - head < 2:
                    break
                (size,) = _U16.unpack_from(data, head)
                head += 2
            elif size == 127:
                if end - head < 8:
                    break
                (size,) = _U64.unpack_from(data, head)
                head += 8
            limit = _MAX_CONTROL if opcode >= _PING else max_size
            if limit is not None and size > limit:
                return offset  # too long: websockets' parser refuses it (1009, or 1002)
            stop = head + 4 + size
            if stop > end:
                awaited = stop - offset
                break
            payload = apply_mask(view[head + 4 : stop], view[head : head + 4])
            offset = stop
            if opcode <= _BINARY:
                self._message(payload, opcode == _TEXT)
            elif opcode == _PING:  # RFC 6455 5.5.2: answered with a pong of its payload
                self.conn.send_pong(payload)
                self.transport.write(b"".join(self.conn.data_to_send()))
            else:
                self.handle_pong(Frame(Opcode.PONG, payload))
        if offset < end:
            self._partial += view[offset:]
            self._awaited = awaited
        return None

    def send_receive_event_to_app(self) -> None:
        if self._receiver is None or self.close_sent:  # not attached, or past the app's close
            super().send_receive_event_to_app()
            return
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        self._message(data, self.curr_msg_data_type == "text")

    def _message(self, data: bytes, text: bool) -> None:
        """A whole message for the receiver: now, or after those waiting."""
        if text and not data.isascii():
            try:
                data.decode()
            except UnicodeDecodeError:  # as uvicorn does: RFC 6455 8.1, fail with 1007
                self.logger.info("Invalid UTF-8 sequence received from client.")
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return
        if self._held or self._receiver_full or self._unwritable:
            self._held.append((data, text))
            self._hold_reading()
            return
        assert self._receiver is not None
        self._receiver.frame(data, text)

    # -- flow -----------------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self._unwritable = True
        self._hold_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._unwritable = False
        self._deliver_held()

    def _hold_reading(self) -> None:
        if not self._reading_held:
            self._reading_held = True
            self.transport.pause_reading()

    def _deliver_held(self) -> None:
        """Deliver the frames that waited, in order, while nothing holds them; then read again."""
        receiver = self._receiver
        while self._held and not (self._receiver_full or self._unwritable):
            if receiver is None or self.close_sent or self.disconnected:
                self._held.clear()
                break
            receiver.frame(*self._held.popleft())
        if self._reading_held and not (self._held or self._receiver_full or self._unwritable):
            self._reading_held = False
            if not self.transport.is_closing():
                self.transport.resume_reading()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A protocol class for ``uvicorn.run(http=...)`` with its own shared state."""
    return type("GuardedHttpToolsProtocol", (GuardedProtocol,), {"guard": ConnectionGuard(limits)})


def guarded_websocket_protocol(guard: ConnectionGuard) -> type[GuardedWebSocketProtocol]:
    """A protocol class for ``uvicorn.run(ws=...)`` counted in ``guard`` (the HTTP protocol's)."""
    return type("GuardedWebSocketsProtocol", (GuardedWebSocketProtocol,), {"guard": guard})


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
    return ConnectionLimits(
        header_timeout_s=server.header_timeout_s,
        body_timeout_s=server.body_timeout_s,
        max_connections=cap,
        retry_after_s=retry_after_s,
    )
