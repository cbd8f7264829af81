"""The connection to one upstream: its transport, watched for its end, and its failures in words.

``open_transport`` gives the SDK client a stdio subprocess or a streamable HTTP
connection whose read stream reports when it ends: that is how a dead stdio process
shows itself (its stdout closes), and what the supervisor waits on to reconnect.
Either way one message from the server holds at most ``max_message_bytes`` of our memory
(stdio: ``stdio``; HTTP: the SDK's SSE event limit, and ``_bounded_bodies``
for other bodies).
``describe_failure`` says why a connection attempt failed, the way an operator reads it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TextIO

import anyio
import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from tool_server.upstream.config import HttpSpec, StdioSpec
from tool_server.upstream.stdio import bounded_stdio_client

__all__ = ["describe_failure", "exc_text", "open_transport"]


class HttpNotes:
    """What an upstream's HTTP answers said that the SDK's error for them does not ("Server
    returned an error response"): the first refusal of our credentials (401, 403) or of a POST
    (404, 405: no streamable HTTP endpoint there), as ``(status, method, url, challenge)``."""

    __slots__ = ("refused",)

    def __init__(self) -> None:
        self.refused: tuple[int, str, str, str | None] | None = None

    def saw(self, response: httpx2.Response) -> None:
        status, method = response.status_code, response.request.method
        if self.refused is None and (status in (401, 403) or (status in (404, 405) and method == "POST")):
            self.refused = (
                status,
                method,
                str(response.request.url),
                response.headers.get("www-authenticate"),
            )


def open_transport(
    spec: StdioSpec | HttpSpec,
    on_end: Callable[[], None],
    *,
    errlog: TextIO,
    connect_timeout_s: float,
    call_timeout_s: float,
    max_message_bytes: int,
    notes: HttpNotes | None = None,
) -> contextlib.AbstractAsyncContextManager[tuple[Any, Any]]:
    """The SDK transport for ``spec``, its read stream watched (``on_end`` runs when it ends);
    an HTTP one records its refusals in ``notes``."""
    if isinstance(spec, StdioSpec):
        client = bounded_stdio_client(spec, errlog=errlog, max_message_bytes=max_message_bytes)
        return _watched(client, on_end)
    _quiet_http_log()
    # Our own client (the SDK's default has no headers): read timeout long enough for SSE streams.
    http = httpx2.AsyncClient(
        headers=spec.headers or None,
        timeout=httpx2.Timeout(connect_timeout_s, read=max(call_timeout_s, 300.0)),
        event_hooks={"response": [_bounded_bodies(max_message_bytes, notes)]},
    )
    client = streamable_http_client(spec.url, http_client=http, max_sse_event_size=max_message_bytes)
    return _watched(client, on_end, owned=http)


def describe_failure(
    exc: BaseException,
    name: str,
    spec: StdioSpec | HttpSpec,
    connect_timeout_s: float,
    stderr: str = "",
    notes: HttpNotes | None = None,
) -> str:
    """Why connecting to upstream ``name`` failed; ``stderr`` (an excerpt) is quoted where it
    helps, and an HTTP refusal (``notes``) is named: the SDK reports it as any error response."""

    def with_stderr(message: str) -> str:
        return f"{message}; stderr: {stderr}" if stderr else message

    if notes is not None and notes.refused is not None:
        status, method, url, challenge = notes.refused
        if status in (401, 403):
            said = f" (WWW-Authenticate: {challenge})" if challenge else ""
            return (
                f"upstream '{name}' refused our credentials: HTTP {status} to {method} {url}{said}; "
                f"check the token in mcpServers.{name}.headers (Authorization: Bearer ...)"
            )
        return (
            f"upstream '{name}' answered HTTP {status} to {method} {url}: no streamable HTTP MCP "
            "endpoint there. A legacy SSE endpoint (often .../sse) is not supported: give the "
            "server's streamable HTTP URL (often .../mcp)"
        )

    if isinstance(exc, FileNotFoundError) and isinstance(spec, StdioSpec):
        return (
            f"cannot start upstream '{name}': command {spec.command!r} not found "
            "(is it installed, and on PATH or given as an absolute path?)"
        )
    if isinstance(exc, PermissionError) and isinstance(spec, StdioSpec):
        return f"cannot start upstream '{name}': command {spec.command!r} is not executable"
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        return with_stderr(f"upstream '{name}' exited or closed the connection during the handshake")
    if (isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT) or isinstance(exc, TimeoutError):
        return with_stderr(
            f"upstream '{name}' did not complete the MCP handshake within {connect_timeout_s:g} s"
        )
    if isinstance(exc, httpx2.TransportError) and isinstance(spec, HttpSpec):
        return f"cannot reach upstream '{name}' at {spec.url}: {exc_text(exc)}"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_failure(e, name, spec, connect_timeout_s, stderr) for e in exc.exceptions)
    return with_stderr(f"upstream '{name}' failed: {exc_text(exc)}")


def exc_text(exc: BaseException) -> str:
    """``Type: message``, or just ``Type`` when it has none (``TimeoutError()``)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _MessageTooLarge(httpx2.StreamError):
    """An HTTP response body over the limit (the SDK fails the request it answers with it)."""


def _bounded_bodies(
    limit: int, notes: HttpNotes | None = None
) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A response hook: every body but an SSE stream is cut at ``limit`` bytes; refusals go to ``notes``.

    The SDK reads a JSON response whole (``aread``); SSE events it bounds itself. (A hook,
    not a transport of ours: a client given a transport ignores the proxy variables.)
    """

    async def bound(response: httpx2.Response) -> None:
        if notes is not None and response.status_code >= 400:
            notes.saw(response)
        if not response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            response.stream = _CappedBody(response.stream, limit)

    return bound


class _CappedBody(httpx2.AsyncByteStream):
    """A response body that raises ``_MessageTooLarge`` once more than ``limit`` bytes came."""

    def __init__(self, inner: Any, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        async for chunk in self._inner:
            received += len(chunk)
            if received > self._limit:
                raise _MessageTooLarge(
                    f"upstream message larger than the {self._limit} byte limit (max_message_bytes); discarded"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _WatchedReadStream:
    """Delegates to the transport's read stream and reports when it ends."""

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


def _quiet_http_log() -> None:
    """httpx2 logs every request at INFO: one line per upstream call would drown the server log."""
    http_log = logging.getLogger("httpx2")
    if http_log.level == logging.NOTSET:
        http_log.setLevel(logging.WARNING)
