"""``/v1/stream``'s WebSocket protocol: uvicorn's, counted in the connection guard, handing the
stream its frames by call (``FrameLink``) and reading the usual frames itself.

Pins: this module subclasses uvicorn's ``WebSocketsSansIOProtocol`` and reads websockets'
``ServerProtocol`` state (``reader.buffer``, ``current_size``, the parser generator's
``gi_yieldfrom`` chain, ``max_message_size``). pyproject.toml bounds both packages to the
versions this was written and tested against; tests/server/api/test_stream_frames.py checks
the internals it uses, so a new version that changes them fails there first.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from typing import ClassVar, Protocol

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from tool_server.api.connections import ConnectionGuard

try:
    from websockets.speedups import apply_mask
except ImportError:  # websockets built without its C extension
    from websockets.utils import apply_mask


class FrameReceiver(Protocol):
    """What takes a connection's frames by call (``FrameLink.attach``): ``/v1/stream``'s connection."""

    def frame(self, data: bytes, text: bool) -> None: ...

    def drain(self) -> None:
        """The server is shutting down: answer what is in flight, then call ``FrameLink.drained``."""
        ...


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

    def admit(self, tenant: str) -> str | None:
        """Count the connection as one of ``tenant``'s streams (before the handshake is
        accepted); or, counting nothing, why the tenant may not open another."""
        ...

    def set_busy(self, busy: bool) -> None:
        """Frames in flight (not evictable) or none (evictable at the connection cap)."""
        ...

    def drained(self) -> None:
        """Every frame of a draining connection is answered: close it (1012)."""
        ...


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
    its transport to this one, which counts it again: the count of open fds stays whole. It is
    one of its token's streams (``admit``), evictable while no frame is in flight (``set_busy``,
    api/connections.py), and drained on shutdown (``shutdown``). Use
    ``guarded_websocket_protocol(guard)``.

    Frames by call: uvicorn hands each message to the app as a dict through a queue, wakes the
    app's task for it and pauses and resumes reading around it, and websockets parses a frame
    through generators and Frame objects; for a stream of small calls that was most of a
    frame's cost beside the call itself (bench/server/stream_cost.py). Once a receiver is attached,
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
    _tenant: str | None = None  # whose stream it is, once admitted (ConnectionGuard.streams)
    _drain_timer: asyncio.TimerHandle | None = None
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
        self._uncount()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        # What was read and not delivered goes now, not when the protocol is collected (the
        # scope, the app's task and the transport hold it in cycles: a half-sent 16 MiB frame
        # stayed until a full collection).
        self._held.clear()
        self._partial = bytearray()
        self.frames = []
        reader = getattr(self.conn, "reader", None)  # websockets' parser: a frame it was reading
        buffer = getattr(reader, "buffer", None)
        if isinstance(buffer, bytearray):
            buffer.clear()
        self._receiver = None  # it holds this protocol (its sends): no cycle left behind
        super().connection_lost(exc)

    def _uncount(self) -> None:
        """Stop counting the connection: it is closing."""
        guard = self.guard
        if self._counted:
            self._counted = False
            guard.open -= 1
        if self._tenant is not None:
            guard.remove_stream(self._tenant, self)
            self._tenant = None

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        if self.response.status_code == 101:  # a scope was made (the app has not run yet)
            self.scope["extensions"][FRAMES_EXTENSION] = self

    # -- FrameLink ----------------------------------------------------------------------

    def attach(self, receiver: FrameReceiver) -> None:
        self._receiver = receiver
        if self._tenant is not None:  # accepted, nothing in flight: evictable from now on
            self.guard.stream_idle(self._tenant, self, True)
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

    def admit(self, tenant: str) -> str | None:
        refusal = self.guard.add_stream(tenant)
        if refusal is None:
            self._tenant = tenant
        return refusal

    def set_busy(self, busy: bool) -> None:
        if self._tenant is not None:
            self.guard.stream_idle(self._tenant, self, not busy)

    # -- eviction and shutdown ------------------------------------------------------------

    def evict(self) -> None:
        """Make room for a new connection: close this idle stream with 1013 (try again later)."""
        self.guard.note("evicted")
        self._close(1013, "idle stream closed: the server is at its connection limit; reconnect")

    def shutdown(self) -> None:
        """uvicorn's shutdown (SIGTERM): a stream with frames is drained as a POST is, its calls
        answered on it as they finish, then closed with 1012; frames that come meanwhile get an
        ``overloaded`` result per call (never run: resend them elsewhere). Past the graceful
        shutdown timeout it is closed all the same."""
        receiver = self._receiver
        if receiver is None or self.close_sent or self.transport.is_closing() or self._drain_timer:
            super().shutdown()
            return
        grace = self.config.timeout_graceful_shutdown
        if grace is not None:
            self._drain_timer = self.loop.call_later(grace, self.drained)
        receiver.drain()  # may call drained() now

    def drained(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        self._drain_timer = None
        self._close(1012, "")

    def _close(self, code: int, reason: str) -> None:
        self._uncount()
        if self.close_sent or self.transport.is_closing():
            return
        self.stop_keepalive()
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code})
        self.conn.send_close(code, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.transport.close()

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


def guarded_websocket_protocol(guard: ConnectionGuard) -> type[GuardedWebSocketProtocol]:
    """A protocol class for ``uvicorn.run(ws=...)`` counted in ``guard`` (the HTTP protocol's)."""
    return type("GuardedWebSocketsProtocol", (GuardedWebSocketProtocol,), {"guard": guard})
