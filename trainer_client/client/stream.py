"""``StreamClient``: tool calls over the server's ``/v1/stream`` WebSocket.

For a caller that makes one call at a time (an agent framework, an environment's step loop):
each call is a frame on a connection kept open, not a whole POST. Any number of calls may be
in flight on the one connection; the server answers each frame when its calls are done, in
any order, and answers are matched to calls by call_id. (A trainer with many trajectories
gets more from ``ToolClient``, which batches their calls into few POSTs.)

Delivery. A call is only ever resent under its own call_id. When the connection drops, the
client reconnects (backoff capped at ``max_backoff_s``) and resends the calls not answered
yet: the server answers a call_id it has seen from its store, or joins the call still
running, so none runs twice. That store lives in one server process, and each process names
itself in the handshake: if the new connection reaches another one (the server restarted),
the calls that were on the wire end ``outcome_unknown`` (run at most once, maybe not at
all) instead of being resent, and calls of a session used on the old process end
``unknown_session`` (its state is gone with it). ``overloaded`` results are retried after a
short backoff until the call's deadline. A call not answered by its deadline ends
``timeout``. Calls of one session keep their order if the caller awaits each before sending
the next (an episode does); an overloaded call retried later may run after a call sent after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.protocol import Event, State

from protocol import Call, ErrorKind, Result, encode, new_call_id
from protocol.messages import call_from_dict, result_from_dict
from trainer_client.client.deadlines import Deadlines
from trainer_client.client.policies import backoff_delay
from trainer_client.client.routing import INSTANCE_HEADER
from trainer_client.client.tool_client import TOKEN_ENV

log = logging.getLogger("trainer_client.client")

STREAM_PATH = "/v1/stream"
SESSION_HEADER = "X-Toolfactory-Session"  # what compose/nginx/toolfactory.conf routes a session by
MESSAGE_TOO_BIG = 1009  # WebSocket close code: a frame over the server's size limit


class StreamClosed(RuntimeError):
    """The client is closed, or the server refused it for good (a bad token): the message says which."""


@dataclass(slots=True, eq=False)
class _Pending:
    call: Call
    future: asyncio.Future[Result]
    deadline: float  # time.monotonic()
    limit: float  # its timeout, in seconds (what a timeout's message says)
    frame: int  # the frame it was first sent in: resends keep a frame's calls together
    sent_on: int | None = None  # the connection it is on the wire on (None: not sent, or refused)
    retries: int = 0  # overloaded answers so far
    waiting: bool = False  # an overload retry will send it
    bucket: set[_Pending] | None = None  # its deadline's bucket while pending (``Deadlines``)


class _Connection(ClientConnection):
    """websockets' client connection, handing each whole message to ``on_message`` as it is
    parsed: no message queue, future or reader wake-up per answer. A fragmented message (the
    tool server sends none; WebSocket allows them) and everything else go websockets' usual
    way, to ``recv``."""

    on_message: Callable[[bytes], None] | None = None

    def process_event(self, event: Event) -> None:
        # A text or binary frame with FIN is a whole message (RFC 6455 5.4: no data frame
        # other than a continuation comes while a fragmented message is in progress).
        on_message = self.on_message
        if on_message is not None and type(event) is Frame and event.fin and event.opcode in _WHOLE:
            on_message(event.data)
        else:
            super().process_event(event)


_WHOLE = frozenset({Opcode.TEXT, Opcode.BINARY})


def stream_url(url: str) -> str:
    """``http://host:port`` (a server's base URL, as ToolClient takes) -> ``ws://host:port/v1/stream``;
    a ``ws://`` or ``wss://`` URL with a path is taken as it is."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(
            f"the server URL must be http(s)://host:port or ws(s)://host:port/v1/stream, got {url!r}"
        )
    path = parts.path.rstrip("/")
    if scheme == parts.scheme and path:  # a ws URL naming its path
        return url
    return urlunsplit((scheme, parts.netloc, path + STREAM_PATH, parts.query, ""))


class StreamClient:
    """Calls over one WebSocket to a tool server (module docstring)::

        async with StreamClient("http://127.0.0.1:8000") as tools:
            result = await tools.call("calculator", {"expression": "6*7"})

    Args:
        url: the server's base URL (``http://host:port``), or its ``ws://.../v1/stream``.
        token: bearer token; defaults to ``$TOOLFACTORY_TOKEN``. It decides the tenant of every
            call on the connection.
        timeout_s: default deadline of a call (and of a release), resends and retries included.
        open_timeout_s: limit for one connection's handshake.
        session: an episode's session, sent as ``X-Toolfactory-Session`` with the handshake so
            that a load balancer routing by it (compose/nginx/toolfactory.conf) puts the stream
            on the replica that holds the session.
        backoff_s / max_backoff_s: first and longest wait between reconnections, and between
            retries of an overloaded call (with jitter).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 120.0,
        open_timeout_s: float = 10.0,
        session: str | None = None,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
    ) -> None:
        self.url = stream_url(url)
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        if session is not None:
            self._headers[SESSION_HEADER] = session
        self.timeout_s = timeout_s
        self.open_timeout_s = open_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.instance: str | None = None  # the server process of the current connection
        self._ws: ClientConnection | None = None  # None while (re)connecting
        self._connection = 0  # counts connections: what ``_Pending.sent_on`` names
        self._frames = itertools.count()
        self._pending: dict[str, _Pending] = {}  # call_id -> its call; in the order sent
        # Deadlines by 10 ms bucket, one timer per bucket: a timer per call was a visible share
        # of the client's CPU per call.
        self._deadlines: Deadlines[_Pending] = Deadlines(self._time_out)
        # Frames for the wire, written together at the end of this turn of the event loop (one
        # write, one system call, for every frame the callers woken in one turn send).
        self._outbox: list[bytes] = []
        self._flush_due = False
        self._releases: dict[str, asyncio.Future[bool]] = {}
        # session -> the server process its calls went to: after a restart its state is gone.
        # Forgotten on release.
        self._sessions: dict[str, str | None] = {}
        self._reader: asyncio.Task[None] | None = None
        self._heard = False  # the current connection has answered something
        self._retries: set[asyncio.Task[None]] = set()
        self._closed: StreamClosed | None = None
        # The largest frame sent on this connection (bytes, its calls): the one a close with
        # 1009 (over the server's size limit) refused, as no smaller frame can be over it.
        self._largest: tuple[int, list[_Pending]] = (0, [])

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def __aenter__(self) -> StreamClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open the connection (``async with`` does): raises if the server cannot be reached or
        refuses the handshake. Later drops are reconnected in the background."""
        self._check_open()
        if self._reader is None:
            await self._open()
            self._reader = asyncio.create_task(self._read())

    # ----------------------------------------------------------------- calls

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout_s: float | None = None,
    ) -> Result:
        """One call with a fresh call_id; its result (failures are results, never raised)."""
        (result,) = await self.call_many(
            [Call(new_call_id(), tool, arguments or {}, session)], timeout_s=timeout_s
        )
        return result

    async def call_many(self, calls: Sequence[Call], *, timeout_s: float | None = None) -> list[Result]:
        """Calls sent in one frame (run concurrently, as a POST's batch); results in their order.

        Raises ``ValueError`` for a call the server would not decode (an empty name, an id over
        256 characters, an id already in flight here) before sending anything, and
        ``StreamClosed`` once the client is closed.
        """
        self._check_open()
        if not calls:
            return []
        for index, call in enumerate(calls):
            # The server's own check of each call, on the call's fields: a ProtocolError (a
            # ValueError) names the bad field, as the server's answer would.
            call_from_dict(vars(call), index)
        frame_bytes = encode({"calls": list(calls)})
        # One lookup per call (``set.isdisjoint(dict)`` walked every call in flight).
        ids = {call.call_id for call in calls}
        if len(ids) < len(calls) or any(call_id in self._pending for call_id in ids):
            raise ValueError("a call_id is used twice: each call in flight needs a call_id of its own")
        if self._reader is None:
            await self.connect()
        loop = asyncio.get_running_loop()
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        frame = next(self._frames)
        # Deadlines by bucket, not asyncio.timeout: cancelling the await would cancel the future.
        mine = [_Pending(call, loop.create_future(), deadline, limit, frame) for call in calls]
        for pending in mine:
            self._pending[pending.call.call_id] = pending
            self._deadlines.add(pending)
        try:
            if self._ws is not None:
                self._send(mine, frame_bytes)
            if len(mine) == 1:
                return [await mine[0].future]
            return [await p.future for p in mine]
        finally:
            for pending in mine:
                self._deadlines.discard(pending)
                if self._pending.get(pending.call.call_id) is pending:
                    del self._pending[pending.call.call_id]
                if pending.future.done() and not pending.future.cancelled():
                    pending.future.exception()  # seen: one raised error is enough for the caller

    async def release(self, session: str, *, timeout_s: float | None = None) -> bool:
        """Close a session on the server: True if it was open, False if the server held no open
        session of that id for this token (released, expired, never used)."""
        self._check_open()
        if self._reader is None:
            await self.connect()
        self._sessions.pop(session, None)
        answer = self._releases.get(session)
        if answer is None:
            answer = self._releases[session] = asyncio.get_running_loop().create_future()
            if self._ws is not None:
                self._send_release(session)
        try:
            async with asyncio.timeout(self.timeout_s if timeout_s is None else timeout_s):
                return await asyncio.shield(answer)
        except TimeoutError:
            raise TimeoutError(f"no answer from {self.url} to the release of session {session!r}") from None
        finally:
            if answer.done() and self._releases.get(session) is answer:
                del self._releases[session]

    async def aclose(self) -> None:
        """Close the connection; calls and releases still waiting raise ``StreamClosed``."""
        if self._closed is not None:
            return
        self._fail_all(StreamClosed(f"StreamClient for {self.url} was closed with this call in flight"))
        for _ in self._deadlines.drain():  # their timers
            pass
        self._outbox.clear()
        tasks = [task for task in (self._reader, *self._retries) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    # ----------------------------------------------------------------- the connection

    async def _open(self) -> None:
        """Connect, then resend what is not answered yet; new calls go out once that is done."""
        try:
            ws = await connect(
                self.url,
                additional_headers=self._headers,
                open_timeout=self.open_timeout_s,
                compression=None,  # JSON frames are small; deflate would cost CPU on both ends
                max_size=None,  # answers are bounded by the server's limits on calls and output
                create_connection=_Connection,
            )
        except InvalidStatus as exc:
            raise _refusal(self.url, exc) from None
        assert isinstance(ws, _Connection)
        ws.on_message = self._message
        self._heard = False
        self._connection += 1
        self._largest = (0, [])
        # Frames still waiting for the end of the turn were for the connection that is gone:
        # their calls are resent below (they name that connection), its releases too.
        self._outbox.clear()
        instance = ws.response.headers.get(INSTANCE_HEADER) if ws.response else None
        if self.instance is not None and instance != self.instance:
            self._restarted(instance)
        self.instance = instance
        # New calls wait (``_ws`` is None) until everything older is on the wire again: a
        # session's calls keep their order.
        unsent = [
            p
            for p in self._pending.values()
            if p.sent_on != self._connection and not p.waiting and not p.future.done()
        ]
        self._send(unsent)
        for session in [s for s, answer in self._releases.items() if not answer.done()]:
            self._send_release(session)
        self._write(ws)
        self._ws = ws

    async def _read(self) -> None:
        """Read answers; when the connection drops, reconnect with backoff (reset once a
        connection has answered something, so that one closed at once is not retried hot)."""
        attempt = 0
        while True:
            if self._ws is None:
                try:
                    await self._open()
                except StreamClosed as exc:  # refused for good: say so to every waiting call
                    log.error("%s", exc)
                    self._fail_all(exc)
                    return
                except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
                    attempt += 1
                    log.info("cannot reconnect to %s (%s); retrying", self.url, exc)
                    await asyncio.sleep(self._backoff(attempt))
                    continue
            ws = self._ws
            if ws is None:  # not after _open: it sets one
                continue
            with contextlib.suppress(ConnectionClosed):
                async for message in ws:  # whole messages go to _message as they are parsed
                    self._message(message)
            if self._heard:
                attempt = 0
            self._ws = None
            if ws.close_code == MESSAGE_TOO_BIG:
                self._too_big(ws.close_reason or "")
            attempt += 1
            log.info("connection to %s lost (%s); reconnecting", self.url, ws.close_code)
            await asyncio.sleep(self._backoff(attempt))

    def _send(self, pendings: list[_Pending], frame_bytes: bytes | None = None) -> None:
        """Queue calls for the current connection, one frame per frame they were first sent in
        (``frame_bytes``: that frame already encoded, when ``pendings`` are one frame's calls)."""
        if frame_bytes is not None and all(p.call.session is None for p in pendings):
            # A new frame of calls outside sessions (the usual case): nothing to look up.
            for pending in pendings:
                pending.sent_on = self._connection
            if len(frame_bytes) > self._largest[0]:
                self._largest = (len(frame_bytes), pendings)
            self._queue(frame_bytes)
            return
        sendable = [p for p in pendings if not self._lost_session(p)]
        reuse = frame_bytes is not None and len(sendable) == len(pendings)
        for _, group in itertools.groupby(sendable, key=lambda p: p.frame):
            batch = list(group)
            for pending in batch:
                pending.sent_on = self._connection
                if pending.call.session is not None:
                    self._sessions.setdefault(pending.call.session, self.instance)
            data = (
                frame_bytes
                if reuse and frame_bytes is not None
                else encode({"calls": [p.call for p in batch]})
            )
            if len(data) > self._largest[0]:
                self._largest = (len(data), batch)
            self._queue(data)

    def _send_release(self, session: str) -> None:
        self._queue(orjson.dumps({"release": session}))  # resent once reconnected if lost

    def _queue(self, data: bytes) -> None:
        self._outbox.append(data)
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self._ws is not None:
            self._write(self._ws)
        else:  # the connection is gone: its calls and releases are resent once reconnected
            self._outbox.clear()

    def _write(self, ws: ClientConnection) -> None:
        """The frames queued, as binary messages in one write (what ``ws.send`` does for one,
        through the same websockets protocol object). Nothing is written on a connection that
        is closing: the reader reconnects and resends what it did not answer."""
        frames, self._outbox = self._outbox, []
        protocol = ws.protocol
        if not frames or protocol.state is not State.OPEN or ws.transport.is_closing():
            return
        for data in frames:
            protocol.send_binary(data)
        ws.transport.write(b"".join(protocol.data_to_send()))

    def _message(self, message: str | bytes) -> None:
        self._heard = True
        try:
            self._answered(message)
        except Exception:  # a malformed answer: said, and the connection goes on
            log.exception("%s sent an answer that could not be read: %r", self.url, message[:200])

    def _answered(self, message: str | bytes) -> None:
        try:
            data = orjson.loads(message)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            log.warning("%s sent a frame that is not a JSON object: %r", self.url, message[:200])
            return
        results = data.get("results")
        if results is not None:
            retry = []
            for item in results:
                pending = self._pending.get(item.get("call_id"))
                if pending is None or pending.future.done():
                    continue  # answered already, or given up on (a timeout)
                result = result_from_dict(item)
                if (
                    result.error is not None
                    and result.error.kind == ErrorKind.OVERLOADED
                    and self._may_retry(pending)
                ):
                    retry.append(pending)
                else:
                    pending.future.set_result(result)
            if retry:
                self._retry_later(retry)
            return
        session = data.get("released", data.get("release"))
        answer = self._releases.get(session) if isinstance(session, str) else None
        if answer is not None and not answer.done():
            answer.set_result("released" in data)
        elif answer is None:
            log.warning("%s answered a frame with %s", self.url, data.get("error", data))

    # ----------------------------------------------------------------- retries and failures

    def _may_retry(self, pending: _Pending) -> bool:
        pending.retries += 1
        wait = self._backoff(pending.retries)
        return time.monotonic() + wait < pending.deadline

    def _retry_later(self, pendings: list[_Pending]) -> None:
        """Resend overloaded calls after a backoff (nothing of them ran: the server refused them)."""
        for pending in pendings:
            pending.waiting, pending.sent_on = True, None

        async def resend() -> None:
            await asyncio.sleep(self._backoff(max(p.retries for p in pendings)))
            for pending in pendings:
                pending.waiting = False  # from here, a reconnection resends it too
            live = [p for p in pendings if self._pending.get(p.call.call_id) is p and p.sent_on is None]
            if live and self._ws is not None:
                self._send(live)

        task = asyncio.create_task(resend())
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, self.backoff_s, self.max_backoff_s)

    def _restarted(self, instance: str | None) -> None:
        """The server process changed: what was on the wire may have run there; it is not resent."""
        log.warning(
            "%s is another server process now (instance %s, was %s)", self.url, instance, self.instance
        )
        for pending in self._pending.values():
            if pending.sent_on is not None and not pending.future.done():
                message = (
                    f"the server process at {self.url} changed (instance {self.instance} -> {instance}) "
                    "while this call was in flight: it may or may not have run, and is not sent again"
                )
                pending.future.set_result(
                    Result.failure(pending.call.call_id, ErrorKind.OUTCOME_UNKNOWN, message)
                )

    def _lost_session(self, pending: _Pending) -> bool:
        """End a call whose session lived in a server process that is gone (its state is lost)."""
        session = pending.call.session
        if session is None or session not in self._sessions or self._sessions[session] == self.instance:
            return False
        if not pending.future.done():
            message = (
                f"session {session!r} lived in server process {self._sessions[session]}, which is gone "
                f"(now {self.instance}): its state is lost. Start the episode again with a new session"
            )
            pending.future.set_result(
                Result.failure(pending.call.call_id, ErrorKind.UNKNOWN_SESSION, message)
            )
        return True

    def _too_big(self, reason: str) -> None:
        """The server closed the connection on a frame over its size limit: end that frame's
        calls (resent, they would close every connection again); the others are resent."""
        size, pendings = self._largest
        message = (
            f"{self.url} refused a frame of {size} bytes ({reason}); send fewer or smaller calls per frame"
        )
        for pending in pendings:
            if not pending.future.done():
                pending.future.set_result(Result.failure(pending.call.call_id, ErrorKind.TOO_LARGE, message))

    def _time_out(self, pending: _Pending) -> None:
        """``Deadlines`` calls this for a call still unanswered at its deadline."""
        message = f"no answer from {self.url} within {pending.limit:g} s (the call may still run there)"
        pending.future.set_result(Result.failure(pending.call.call_id, ErrorKind.TIMEOUT, message))

    def _fail_all(self, error: StreamClosed) -> None:
        self._closed = error
        for waiting in [*(p.future for p in self._pending.values()), *self._releases.values()]:
            if not waiting.done():
                waiting.set_exception(error)

    def _check_open(self) -> None:
        if self._closed is not None:
            raise StreamClosed(f"StreamClient for {self.url} is closed") from self._closed


def _refusal(url: str, exc: InvalidStatus) -> Exception:
    """A refused handshake: for good (StreamClosed) unless the server is only busy (503, 429)."""
    response = exc.response
    try:
        message = orjson.loads(response.body or b"")["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = (response.body or b"").decode(errors="replace")[:200] or response.reason_phrase
    text = f"{url} refused the connection: HTTP {response.status_code}: {message}"
    if response.status_code in (429, 503):
        return ConnectionError(text)  # the reader retries it
    return StreamClosed(text)
