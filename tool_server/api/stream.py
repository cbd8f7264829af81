"""``GET /v1/stream``: tool calls over one WebSocket, for callers that make one call at a time.

An agent framework or an environment's step loop sends a call, waits for it, sends the next:
over HTTP each of those calls pays a whole POST. Here one connection carries them all.

* Client -> server, JSON in a text or binary frame: ``{"calls": [call, ...]}``, exactly a
  ``POST /v1/calls`` body (usually one call), or ``{"release": "<session id>"}``.
* Server -> client, in the type of frame the client used: for each calls frame one
  ``{"results": [...]}``, byte for byte what the POST would answer, sent when that frame's
  calls are done. Frames run concurrently, so answers may come out of order: match results
  by ``call_id``. A release is answered ``{"released": id}`` or
  ``{"error": {"kind": "unknown_session", ...}, "release": id}``; a frame that does not
  decode ``{"error": {"kind": "bad_request", ...}}``, and the connection stays open.

The rules are the POST's, because the code is (``HttpApi.run_calls``): the handshake's token
is the tenant of every frame and its ``X-Toolfactory-Instance`` header fences every frame's
sessions; calls of one session run in the order their frames arrived; a call_id already
answered for the tenant is answered from the store, or joins the call still running. Where the
POST would be refused whole (429 overloaded, 413 too many calls), each call of the frame gets
a failure result of that kind: clients retry ``overloaded`` ones, as after a 429.

Limits: a frame over ``limits.max_request_bytes`` closes the connection with 1009 (uvicorn's
``ws_max_size``, set to the same, refuses it before reading it whole; the check here holds
under any server). At most ``limits.max_calls_per_batch`` frames are in flight on one
connection: at that many the server reads no further frame, so TCP pushes back on the client;
the bytes of frames in flight count against ``limits.max_queued_bytes_per_connection`` and the
token's and server's bounds (api/queued_bytes.py; past one: an ``overloaded`` result per call).
The connection counts against ``server.max_connections``, one token holds at most
``server.max_streams_per_tenant`` of them (429 at the handshake), and one with no frame in flight
may be evicted at the cap (1013; api/connections.py). On shutdown (SIGTERM) the frames in flight
are answered, new ones get ``overloaded`` per call, then the connection closes with 1012.

A client going away cancels nothing: its calls run to the end and their results are kept
under their call ids, so the same calls resent on a new connection are answered from the
store and none runs twice in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Coroutine, Generator
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from protocol import ErrorKind, ProtocolError, Result, decode_calls, encode
from protocol.messages import MAX_ID_LENGTH
from tool_server.api.auth import refuse
from tool_server.api.internal_errors import internal_error_message, log_internal_error
from tool_server.api.queued_bytes import ConnectionBytes
from tool_server.api.routes import HttpApi, instance_expected
from tool_server.api.ws_frames import FRAMES_EXTENSION, FrameLink
from tool_server.executor.admission import Caller
from tool_server.sessions import INSTANCE_HEADER

log = logging.getLogger(__name__)

MESSAGE_TOO_BIG = 1009  # WebSocket close code
SHUTTING_DOWN = "the server is shutting down: this call was not run; resend it on a new connection"
_RELEASE_KEY = b'"release"'
_FRAMES = '{"calls": [{"call_id", "name", "arguments", "session"?}, ...]} or {"release": "<session id>"}'


class CallStream:
    """The ``/v1/stream`` endpoint as plain ASGI, running each frame through ``HttpApi``.

    Where the server offers its frames by call (``FRAMES_EXTENSION``: ``tool-server serve``'s
    protocol, api/ws_frames.py), they come that way, without an ASGI message, queue or task
    each; elsewhere through ``receive()``. Either way each frame goes to ``_Connection.frame``.
    """

    def __init__(self, api: HttpApi, *, max_frame_bytes: int, max_in_flight: int) -> None:
        self.api = api
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        # The handshake's answer names this process, as every HTTP answer does.
        instance = (INSTANCE_HEADER.encode(), api.executor.sessions.instance.encode())
        self._accept = {"type": "websocket.accept", "headers": [instance]}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        link: FrameLink | None = (scope.get("extensions") or {}).get(FRAMES_EXTENSION)
        if link is not None:  # counted as one of its token's streams (api/connections.py)
            refusal = link.admit(self.api.caller(scope).tenant)
            if refusal is not None:
                error = {"error": {"kind": str(ErrorKind.OVERLOADED), "message": refusal}}
                await refuse(scope, send, 429, error, [(b"retry-after", self.api.retry_after.encode())])
                return
        await send(self._accept)
        connection = _Connection(self, scope, _Peer(send, link))
        if link is not None:
            link.attach(connection)
        try:
            # With a link, receive() gives only frames that came before it was attached (in
            # order, before any of its own), then the disconnect.
            while True:
                await connection.room.wait()  # read nothing more until a frame is answered
                message = await receive()
                if message["type"] != "websocket.receive":
                    return  # websocket.disconnect
                text = message.get("text")
                data = text.encode() if text is not None else message.get("bytes") or b""
                connection.frame(data, text is not None)
        finally:
            await connection.finish()


class _Connection:
    """One connection's frames, run as they arrive and answered as they finish.

    A calls frame runs at once, in the call that delivers it, as far as it goes without waiting:
    a frame of calls answered right away (inline tools, kept results) is answered there, with no
    task; one that waits goes on in a task from where it stopped. So each frame's calls take
    their session's turn before the next frame is looked at: the calls of one session run in
    the order of their frames. A release frame runs in a task from the start (closing a
    session's world runs tools' cleanup code, which may need to run in a task), and the next
    frame is taken once that task has closed the session.
    """

    def __init__(self, stream: CallStream, scope: Scope, peer: _Peer) -> None:
        self.stream = stream
        self.api = stream.api
        self.scope = scope
        self.peer = peer
        self.in_flight: set[asyncio.Task[None]] = set()
        self.room = asyncio.Event()  # set while frames are taken (_room_or_not)
        self.room.set()
        self._releasing = 0  # release frames whose task has not taken its first step
        self._busy = False  # frames in flight (told to the link: an idle stream is evictable)
        self.draining = False  # the server is shutting down (drain)
        self._caller: Caller | None = None
        self._caller_version = -1
        self.expected_instance = instance_expected(scope)  # the handshake's: read once
        self.queued = ConnectionBytes()  # bytes of its frames admitted and not yet answered

    def frame(self, data: bytes, text: bool) -> None:
        if not self.peer.open:
            return  # closing: what came after the close is not run
        if self.draining:  # never run: each call is told so, to be resent elsewhere
            self.peer.send_now(_refused(data, ErrorKind.OVERLOADED, SHUTTING_DOWN), text)
            return
        if len(data) > self.stream.max_frame_bytes:
            reason = (
                f"frame of {len(data)} bytes over limits.max_request_bytes "
                f"({self.stream.max_frame_bytes}); send smaller frames"
            )
            self.peer.open = False  # nothing after it is run or answered
            self._track(asyncio.get_running_loop().create_task(self.peer.close(MESSAGE_TOO_BIG, reason)))
            return
        # find, not ``in``: see records.canonical_arguments. A calls frame that merely mentions
        # "release" is parsed once more here, then run as any other.
        if data.find(_RELEASE_KEY) != -1:
            frame = _parsed(data)
            if isinstance(frame, dict) and "release" in frame:
                release = self._release(frame["release"])
                loop = asyncio.get_running_loop()
                self._track(loop.create_task(self._answer(release, data, text)))
                # The next frame waits until the task's first step has closed the session (a
                # callback queued now runs after it): a call after a release finds it closed.
                self._releasing += 1
                self._room_or_not()
                loop.call_soon(self._released)
                return
        answer = self._answer(self._calls(data), data, text)
        context = contextvars.copy_context()  # what a task would run it in
        try:
            waiting = context.run(answer.send, None)
        except StopIteration:
            return  # answered
        task = asyncio.get_running_loop().create_task(_rest_of(answer, waiting), context=context)
        self._track(task)

    def _track(self, task: asyncio.Task[None]) -> None:
        self.in_flight.add(task)
        task.add_done_callback(self._finished)
        self._room_or_not()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._room_or_not()

    def _released(self) -> None:
        self._releasing -= 1
        self._room_or_not()

    def drain(self) -> None:
        """The server shuts down: new frames are refused, and once the frames in flight are
        answered the link closes the connection (1012)."""
        self.draining = True
        self._room_or_not()

    def _room_or_not(self) -> None:
        """Take no further frame while max_in_flight are in flight or a release is closing its
        session; take them again after. Tell the link whether any frame is in flight."""
        in_flight = len(self.in_flight)
        link = self.peer.link
        busy = in_flight > 0 or self._releasing > 0
        if busy != self._busy and link is not None:
            self._busy = busy
            link.set_busy(busy)
        if self.draining and not busy and link is not None:
            link.drained()
            return
        full = in_flight >= self.stream.max_in_flight or self._releasing > 0
        if full and self.room.is_set():
            self.room.clear()
            if link is not None:
                link.pause_frames()
        elif not full and not self.room.is_set():
            self.room.set()
            if link is not None:
                link.resume_frames()  # may deliver frames that waited, and come back here

    async def finish(self) -> None:
        if self.in_flight:  # let them finish, so that their results are kept (and uvicorn waits for them)
            await asyncio.gather(*self.in_flight, return_exceptions=True)

    def caller(self) -> Caller:
        """The handshake's caller: the same for every frame until a tool joins or leaves the
        registry (what a scoped token may call is worked out from it)."""
        version = self.api.registry.version
        if self._caller is None or version != self._caller_version:
            self._caller, self._caller_version = self.api.caller(self.scope), version
        return self._caller

    async def _answer(self, run: Coroutine[Any, Any, bytes], data: bytes, text: bool) -> None:
        try:
            answer = await run
        except Exception:  # a bug of ours: said in the answer, the connection goes on
            answer = _internal_error(data, log_internal_error(log, "a /v1/stream frame"))
        await self.peer.send(answer, text)

    async def _calls(self, data: bytes) -> bytes:
        outcome = await self.api.run_calls(
            data, self.scope, self.caller(), self.expected_instance, self.queued
        )
        if isinstance(outcome, bytes):
            return outcome
        if not outcome.calls:  # the frame did not decode
            return _error(outcome.kind, f"{outcome.message} (a frame is {_FRAMES})")
        # Refused whole (overloaded, too many calls): a result per call, so that the client
        # can tell which of its calls to retry.
        failures = [Result.failure(c.call_id, outcome.kind, outcome.message) for c in outcome.calls]
        return encode({"results": failures})

    async def _release(self, session: Any) -> bytes:
        if not isinstance(session, str) or not session or len(session) > MAX_ID_LENGTH:
            message = f"a release frame names a session id: a non-empty string of at most {MAX_ID_LENGTH} characters"
            return _error(ErrorKind.BAD_REQUEST, message)
        refused = await self.api.release(session, self.scope)
        if refused is None:
            return encode({"released": session})
        return encode({"error": {"kind": ErrorKind.UNKNOWN_SESSION, "message": refused}, "release": session})


async def _rest_of(coroutine: Coroutine[Any, None, None], waiting: Any) -> None:
    """Run the rest of a coroutine that was started outside a task and stopped at ``waiting``
    (what it yielded): the task running this waits for that, then resumes the coroutine, as
    if it had run it from the start (a cancellation is thrown into it likewise)."""
    await _Resume(coroutine, waiting)


class _Resume:
    __slots__ = ("coroutine", "waiting")

    def __init__(self, coroutine: Coroutine[Any, None, None], waiting: Any) -> None:
        self.coroutine = coroutine
        self.waiting = waiting

    def __await__(self) -> Generator[Any, None, None]:
        coroutine, waiting = self.coroutine, self.waiting
        while True:
            try:
                yield waiting
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # a cancellation: the coroutine decides what it does
                try:
                    waiting = coroutine.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting = coroutine.send(None)
                except StopIteration:
                    return


class _Peer:
    """One connection's client, until it is gone; answers for a gone client are dropped
    (their results are kept under their call ids for a resend)."""

    def __init__(self, send: Send, link: FrameLink | None) -> None:
        self._send = send
        self.link = link
        self.open = True

    def send_now(self, data: bytes, text: bool) -> None:
        """``send`` from a callback: at once over the link, else in a task."""
        if self.link is not None:
            if self.open:
                self.open = self.link.send_frame(data, text)
            return
        asyncio.get_running_loop().create_task(self.send(data, text))

    async def send(self, data: bytes, text: bool) -> None:
        if not self.open:
            return
        if self.link is not None:
            self.open = self.link.send_frame(data, text)
            return
        message = (
            {"type": "websocket.send", "text": data.decode()}
            if text
            else {"type": "websocket.send", "bytes": data}
        )
        try:
            await self._send(message)
        except (OSError, RuntimeError):
            # Gone: uvicorn raises ClientDisconnected (an OSError), or RuntimeError once it has
            # closed the connection itself (a keepalive ping unanswered).
            self.open = False

    async def close(self, code: int, reason: str) -> None:
        """Close the connection (the caller has marked it no longer ``open``)."""
        with contextlib.suppress(OSError, RuntimeError):
            await self._send({"type": "websocket.close", "code": code, "reason": reason})


def _parsed(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None  # run_calls says what is wrong with it


def _error(kind: str, message: str) -> bytes:
    return encode({"error": {"kind": str(kind), "message": message}})


def _internal_error(data: bytes, request_id: str) -> bytes:
    """What a frame that met a bug of ours is answered."""
    message = internal_error_message(request_id, " while running this call: it may or may not have run")
    return _refused(data, ErrorKind.OUTCOME_UNKNOWN, message, frame_kind="internal")


def _refused(data: bytes, kind: ErrorKind, message: str, frame_kind: str | None = None) -> bytes:
    """A frame's answer when none of it ran normally: a failure result per call, where its calls
    can be read (else the client could not tell which calls failed), or an error frame."""
    try:
        call_ids = [call.call_id for call in decode_calls(data)]
    except ProtocolError:
        return _error(frame_kind or kind, message)
    return encode({"results": [Result.failure(i, kind, message) for i in call_ids]})
