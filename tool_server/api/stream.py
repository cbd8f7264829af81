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
connection: at that many the server reads no further frame, so TCP pushes back on the client.
The connection counts against ``server.max_connections`` (api/connections.py).

A client going away cancels nothing: its calls run to the end and their results are kept
under their call ids, so the same calls resent on a new connection are answered from the
store and none runs twice in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from protocol import ErrorKind, ProtocolError, Result, decode_calls, encode
from protocol.messages import MAX_ID_LENGTH
from tool_server.api.routes import HttpApi
from tool_server.sessions import INSTANCE_HEADER

log = logging.getLogger(__name__)

MESSAGE_TOO_BIG = 1009  # WebSocket close code
_RELEASE_KEY = b'"release"'
_FRAMES = '{"calls": [{"call_id", "name", "arguments", "session"?}, ...]} or {"release": "<session id>"}'


class CallStream:
    """The ``/v1/stream`` endpoint as plain ASGI, running each frame through ``HttpApi``."""

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
        await send(self._accept)
        peer = _Peer(send)
        in_flight: set[asyncio.Task[None]] = set()
        room = asyncio.Event()

        def finished(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            room.set()

        try:
            while True:
                while len(in_flight) >= self.max_in_flight:  # read nothing more until one is answered
                    room.clear()
                    await room.wait()
                message = await receive()
                if message["type"] != "websocket.receive":
                    return  # websocket.disconnect
                text = message.get("text")
                data = text.encode() if text is not None else message.get("bytes") or b""
                if len(data) > self.max_frame_bytes:
                    await peer.close(
                        MESSAGE_TOO_BIG,
                        f"frame of {len(data)} bytes over limits.max_request_bytes "
                        f"({self.max_frame_bytes}); send smaller frames",
                    )
                    return
                # A task per frame, created in arrival order: each runs up to the point where
                # its calls take their session's turn before the next one starts, so the
                # calls of one session run in the order of their frames.
                task = asyncio.create_task(self._answer(data, text is not None, scope, peer))
                in_flight.add(task)
                task.add_done_callback(finished)
        finally:
            if in_flight:  # let them finish, so that their results are kept (and uvicorn waits for them)
                await asyncio.gather(*in_flight, return_exceptions=True)

    async def _answer(self, data: bytes, text: bool, scope: Scope, peer: _Peer) -> None:
        try:
            answer = await self._run(data, scope)
        except Exception:  # a bug of ours: said in the answer, the connection goes on
            request_id = uuid.uuid4().hex[:12]
            log.exception("unhandled error on a /v1/stream frame (request %s)", request_id)
            answer = _internal_error(data, request_id)
        await peer.send(answer, text)

    async def _run(self, data: bytes, scope: Scope) -> bytes:
        # find, not ``in``: see records.canonical_arguments. A calls frame that merely mentions
        # "release" is parsed once more here, then run as any other.
        if data.find(_RELEASE_KEY) != -1:
            frame = _parsed(data)
            if isinstance(frame, dict) and "release" in frame:
                return await self._release(frame["release"], scope)
        outcome = await self.api.run_calls(data, scope)
        if isinstance(outcome, bytes):
            return outcome
        if not outcome.calls:  # the frame did not decode
            return _error(outcome.kind, f"{outcome.message} (a frame is {_FRAMES})")
        # Refused whole (overloaded, too many calls): a result per call, so that the client
        # can tell which of its calls to retry.
        failures = [Result.failure(c.call_id, outcome.kind, outcome.message) for c in outcome.calls]
        return encode({"results": failures})

    async def _release(self, session: Any, scope: Scope) -> bytes:
        if not isinstance(session, str) or not session or len(session) > MAX_ID_LENGTH:
            message = f"a release frame names a session id: a non-empty string of at most {MAX_ID_LENGTH} characters"
            return _error(ErrorKind.BAD_REQUEST, message)
        refused = await self.api.release(session, scope)
        if refused is None:
            return encode({"released": session})
        return encode({"error": {"kind": ErrorKind.UNKNOWN_SESSION, "message": refused}, "release": session})


class _Peer:
    """One connection's client, until it is gone; answers for a gone client are dropped
    (their results are kept under their call ids for a resend)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.open = True

    async def send(self, data: bytes, text: bool) -> None:
        if not self.open:
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
        if self.open:
            self.open = False
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
    """What a frame that met a bug of ours is answered: a result per call, where its calls can
    be read (else the client could not tell which calls failed), or an error frame."""
    message = (
        f"internal server error (a bug in toolfactory) while running this call: it may or may not "
        f"have run; the server log has it under request {request_id}"
    )
    try:
        call_ids = [call.call_id for call in decode_calls(data)]
    except ProtocolError:
        return _error("internal", message)
    failures = [Result.failure(i, ErrorKind.OUTCOME_UNKNOWN, message) for i in call_ids]
    return encode({"results": failures})
