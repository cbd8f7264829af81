"""HTTP/1.1 for the batched hot path: keep-alive connections of our own, parsed by httptools.

Why not httpx here: a trainer's client sends thousands of POSTs a second, and httpx spent
most of the client's CPU on them (its pool re-checks every pooled connection whenever a
request starts or ends; bench/README.md). ``Pool`` does only what the batch API needs: a
POST with a JSON body on a keep-alive connection, the answer read by httptools' C parser
(uvicorn's, already a dependency), O(1) work per request however many connections are open.
Plain requests (tool lists, sessions, health probes, leases) still go through httpx.

What the dispatcher must know of a failed POST is whether it may have reached a server, so
the failures are three exceptions: ``ConnectFailed`` (no connection, so nothing was sent),
``AnswerTimeout`` (sent on an intact connection, no answer in time) and ``ConnectionBroken``
(sent, then the connection broke). ``HttpxTransport`` maps an ``httpx.AsyncClient`` (one the
caller injected, e.g. on an ASGI app in process, or when a proxy is configured) onto the same.

A request never goes out on a connection the server has closed: before an idle connection is
reused, its socket is asked (``poll``, no wait) whether the server hung up, which the event
loop may not have noticed yet when it is busy; and a request whose bytes could not be written
at all is sent again on another connection. Either way nothing left, so the call is not
"maybe delivered".
"""

from __future__ import annotations

import asyncio
import http
import select
import ssl
import time
import urllib.request
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httptools
import httpx

__all__ = [
    "Answer",
    "AnswerTimeout",
    "ConnectFailed",
    "ConnectionBroken",
    "Exchange",
    "HttpxTransport",
    "Pool",
    "Transport",
    "env_proxy",
]

_HEADER_CACHE = 64  # encoded header blocks kept (one per distinct headers dict the client uses)
_SEND_TRIES = 3  # connections a request may find closed under it before it is "could not connect"
# What an idle connection's socket must not show: the peer hung up (FIN: POLLRDHUP, Linux), an
# error or a reset; on plain HTTP also bytes nobody asked for (a late or stray answer; on TLS
# the server may send session tickets, which are not a reason to drop the connection).
_HUNG_UP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)
_UNASKED = _HUNG_UP | select.POLLIN


class ConnectFailed(Exception):
    """No connection could be made (refused, unreachable, TLS failed, or too slow): nothing was sent."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class AnswerTimeout(Exception):
    """The request went out on an intact connection and no full answer came in time."""


class ConnectionBroken(Exception):
    """The connection broke after the request was (maybe) sent: it may have reached the server."""


@dataclass(slots=True)
class Answer:
    """An HTTP answer: the attribute names are httpx.Response's, so helpers read either."""

    status_code: int
    headers: Mapping[str, str]  # lower-case names
    content: bytes
    elapsed_s: float

    @property
    def reason_phrase(self) -> str:
        try:
            return http.HTTPStatus(self.status_code).phrase
        except ValueError:
            return ""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class Exchange:
    """One POST in flight; ``answering`` turns True once the first byte of its answer arrived
    (the server is done with it, whatever the client's event loop has not read yet)."""

    __slots__ = ("answering",)

    def __init__(self) -> None:
        self.answering = False


class Transport(Protocol):
    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        timeout_s: float,
        exchange: Exchange | None = None,
    ) -> Answer: ...

    async def aclose(self) -> None: ...


def env_proxy(url: str) -> bool:
    """True if the environment routes ``url`` through a proxy (HTTP_PROXY and the like), which
    httpx honours and ``Pool`` does not: such a client keeps sending through httpx."""
    proxies = urllib.request.getproxies_environment()
    scheme = urlsplit(url).scheme
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass_environment(urlsplit(url).hostname or "", proxies)


# --------------------------------------------------------------------------- httpx


class HttpxTransport:
    """The same ``post`` over an ``httpx.AsyncClient`` (closed by whoever made it)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        timeout_s: float,
        exchange: Exchange | None = None,
    ) -> Answer:
        try:
            response = await self._client.post(
                url, content=body, headers=headers, timeout=httpx.Timeout(timeout_s, pool=None)
            )
        except httpx.ConnectTimeout as exc:
            raise ConnectFailed(f"connecting timed out: {exc!r}", timed_out=True) from exc
        except httpx.ConnectError as exc:
            raise ConnectFailed(str(exc) or repr(exc)) from exc
        except httpx.TimeoutException as exc:
            raise AnswerTimeout(repr(exc)) from exc
        except httpx.TransportError as exc:
            raise ConnectionBroken(repr(exc)) from exc
        if exchange is not None:
            exchange.answering = True
        return Answer(
            response.status_code, response.headers, response.content, response.elapsed.total_seconds()
        )

    async def aclose(self) -> None:
        pass


# --------------------------------------------------------------------------- our own pool


@dataclass(slots=True)
class _Target:
    """A URL taken apart once: where to connect, and the start of a request to it."""

    origin: _Origin
    head: bytes  # "POST /path HTTP/1.1\r\nhost: ...\r\n"


class _Origin:
    """Connections to one (scheme, host, port): idle ones, most recently used last."""

    __slots__ = ("host", "idle", "port", "server_hostname", "ssl")

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        self.host = host
        self.port = port
        self.ssl = ssl_context
        self.server_hostname = host if ssl_context is not None else None
        self.idle: deque[_Connection] = deque()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._poll: select.poll | None = None  # its socket, to look at before it is reused
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Answer] | None = None
        self._exchange: Exchange | None = None
        self._sent_at = 0.0
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._framed = False  # the answer says its length (Content-Length or chunked)
        self._headers_done = False
        self.reusable = False  # the last answer came complete, and the server keeps the connection

    # --- the request

    def still_open(self) -> bool:
        """Whether an idle connection may carry a request: the server has not closed it, even if
        the event loop has not yet read that it did (a busy loop reads the end late)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        if self._poll is None:
            return True
        try:
            return not self._poll.poll(0)
        except (OSError, ValueError):  # the socket is gone
            return False

    def send(self, data: bytes, waiter: asyncio.Future[Answer], exchange: Exchange | None) -> bool:
        """Write the request; False if not one byte of it could leave (the connection was
        already closed or broken: the write failed at once), with ``waiter`` left untouched."""
        assert self.transport is not None
        if self.transport.is_closing():
            return False
        self._waiter, self._exchange = waiter, exchange
        self._status, self._headers, self._body = 0, {}, []
        self._framed = self._headers_done = self.reusable = False
        self._sent_at = time.monotonic()
        self.transport.write(data)
        # asyncio sends at once when nothing is queued; a send that fails there sent nothing
        # and closes the transport before ``write`` returns. A partial send queues the rest.
        if self.transport.is_closing() and self.transport.get_write_buffer_size() == 0:
            self._waiter = self._exchange = None
            return False
        return True

    def timed_out(self, timeout_s: float) -> None:
        self._fail(AnswerTimeout(f"no answer within {timeout_s:g} s"))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._poll = select.poll()
            self._poll.register(sock.fileno(), _HUNG_UP if self.origin.ssl is not None else _UNASKED)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: the connection is out of step
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionBroken(f"unreadable HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._poll = None
        if self._waiter is not None and self._headers_done and not self._framed:
            self._complete()  # an answer delimited by the end of the connection
        else:
            self._fail(
                ConnectionBroken(f"the connection closed before the answer was complete ({exc or 'EOF'})")
            )

    # --- httptools callbacks

    def on_status(self, status: bytes) -> None:
        if self._exchange is not None:
            self._exchange.answering = True

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in ("content-length", "transfer-encoding"):
            self._framed = True
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._headers_done = True
        if self._status in (204, 304) or 100 <= self._status < 200:
            self._framed = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:  # an interim answer (100 Continue): the real one follows
            self._headers, self._body, self._headers_done = {}, [], False
            return
        self.reusable = self._parser.should_keep_alive()
        self._complete()

    # --- settling

    def _complete(self) -> None:
        waiter, self._waiter, self._exchange = self._waiter, None, None
        if waiter is None or waiter.done():
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        encoding = self._headers.get("content-encoding", "identity").lower()
        if encoding in ("gzip", "deflate"):  # we never ask for it; a proxy may send it anyway
            try:
                body = zlib.decompress(body, 47)  # 47: gzip or zlib header, detected
            except zlib.error as exc:
                waiter.set_exception(
                    ConnectionBroken(f"an answer in {encoding} that does not decompress: {exc}")
                )
                return
        waiter.set_result(Answer(self._status, self._headers, body, time.monotonic() - self._sent_at))

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter, self._exchange = self._waiter, None, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class Pool:
    """Keep-alive HTTP/1.1 connections, at most ``max_connections`` open across all origins.

    An idle connection is reused last-in first-out, and never once it has been idle for
    ``keepalive_s`` (well under a server's own keep-alive timeout, 5 s by default: a connection
    the server is closing must not carry a request, which would then be "maybe delivered"), nor
    once its socket shows the server hung up (``_Connection.still_open``); it is closed when next
    looked at, or by the server. At most ``max_idle`` are kept. A request that finds the pool full waits for a connection, first
    come first served. A connection whose request failed or was cancelled is closed.
    """

    def __init__(self, *, max_connections: int, max_idle: int, keepalive_s: float) -> None:
        self._max = max_connections
        self._max_idle = max_idle
        self._keepalive_s = keepalive_s
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._origins: dict[tuple[str, str, int], _Origin] = {}
        self._targets: dict[str, _Target] = {}
        self._headers: dict[int, tuple[dict[str, str], bytes]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    @property
    def open_connections(self) -> int:
        return self._open

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        timeout_s: float,
        exchange: Exchange | None = None,
    ) -> Answer:
        target = self._targets.get(url) or self._target(url)
        data = b"%s%scontent-length: %d\r\n\r\n%s" % (target.head, self._encoded(headers), len(body), body)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Answer] = loop.create_future()
        for _ in range(_SEND_TRIES):
            connection = await self._acquire(target.origin, timeout_s)
            if connection.send(data, waiter, exchange):
                break
            connection.close()  # closed under us before a byte left: another connection
            self._release(connection)
        else:
            raise ConnectFailed(
                f"{_SEND_TRIES} connections to {target.origin.host}:{target.origin.port} closed "
                "before the request could be written; nothing was sent"
            )
        timer = loop.call_later(timeout_s, connection.timed_out, timeout_s)
        try:
            answer = await waiter
        except BaseException:  # failed, timed out or cancelled: the connection's state is unknown
            connection.close()
            self._release(connection)
            raise
        finally:
            timer.cancel()
        self._release(connection)
        return answer

    async def aclose(self) -> None:
        self._closed = True
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.pop().close()
                self._open -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    # --- connections

    async def _acquire(self, origin: _Origin, timeout_s: float) -> _Connection:
        while True:
            if self._closed:
                raise ConnectFailed("the client was closed")
            idle = origin.idle
            if idle:
                now = time.monotonic()
                while idle:
                    connection = idle.pop()
                    if now - connection.idle_since < self._keepalive_s and connection.still_open():
                        return connection
                    connection.close()
                    self._open -= 1
            if self._open < self._max:
                return await self._connect(origin, timeout_s)
            if not self._drop_idle():  # every connection is busy: wait for one to come back
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    await waiter
                except asyncio.CancelledError:
                    if waiter.done() and not waiter.cancelled():
                        self._wake()  # the turn it was given goes to the next in line
                    raise

    async def _connect(self, origin: _Origin, timeout_s: float) -> _Connection:
        self._open += 1
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(origin),
                    origin.host,
                    origin.port,
                    ssl=origin.ssl,
                    server_hostname=origin.server_hostname,
                ),
                timeout_s,
            )
        except BaseException as exc:
            self._open -= 1
            self._wake()
            if isinstance(exc, TimeoutError):
                raise ConnectFailed(
                    f"connecting to {origin.host}:{origin.port} took over {timeout_s:g} s", timed_out=True
                ) from None
            if isinstance(exc, OSError):  # refused, unreachable, no such host, TLS failed
                raise ConnectFailed(f"connecting to {origin.host}:{origin.port} failed: {exc}") from exc
            raise
        return connection

    def _release(self, connection: _Connection) -> None:
        """A request on ``connection`` ended: keep it for the next one, or let it go."""
        if connection.closed or not connection.reusable or self._closed:
            connection.close()
            self._open -= 1
            self._wake()
            return
        if self._waiters:  # someone waits for a connection: make room for theirs
            connection.close()
            self._open -= 1
            self._wake()
            return
        idle = connection.origin.idle
        if len(idle) >= self._max_idle:
            idle.popleft().close()
            self._open -= 1
        connection.idle_since = time.monotonic()
        idle.append(connection)

    def _drop_idle(self) -> bool:
        """Close one idle connection (of any origin) to make room; False if none is idle."""
        for origin in self._origins.values():
            if origin.idle:
                origin.idle.popleft().close()
                self._open -= 1
                return True
        return False

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # --- requests

    def _target(self, url: str) -> _Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"cannot POST to {url!r}: an http:// or https:// URL with a host is needed")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port)
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = _Origin(
                parts.hostname, port, self._ssl_context() if parts.scheme == "https" else None
            )
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        head = f"POST {path} HTTP/1.1\r\nhost: {parts.netloc.rpartition('@')[2]}\r\n".encode("latin-1")
        target = self._targets[url] = _Target(origin, head)
        return target

    def _encoded(self, headers: dict[str, str]) -> bytes:
        """The header lines of ``headers``, encoded once per dict (the client reuses a few)."""
        cached = self._headers.get(id(headers))
        if cached is not None and cached[0] is headers:
            return cached[1]
        block = "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode("latin-1")
        if len(self._headers) >= _HEADER_CACHE:
            self._headers.clear()
        self._headers[id(headers)] = (headers, block)  # holds the dict: its id stays its own
        return block

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()  # httpx's trust store and SSL_CERT_* handling
        return self._ssl
