"""ToolInvoker over plain MCP, for tool servers that have no batch API.

The same rollout loop can then drive any MCP server (ours at ``/mcp`` or a third
party's). It is slower than ``ToolClient`` (one JSON-RPC request per call, and the
SDK's client spends far more CPU per call: bench/README.md), so the trainer's hot path
should use the batch API where it exists; this mode is for interoperability.

MCP has no batching, and a failed call is not retried here: it comes back as an
error result. The trajectory's session id and the call_id travel in the request
``_meta`` (MCP 2026-07-28 is stateless); servers other than ours ignore them. So does the
server process a session was opened on, as our server names it in a session call's result:
a restarted server then refuses the session (``unknown_session``) instead of starting it
empty, and the rollout ends that trajectory (see docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types.jsonrpc import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT

from protocol import (
    CALL_ID_META_KEY,
    INSTANCE_META_KEY,
    META_KEY,
    SESSION_META_KEY,
    Call,
    ErrorInfo,
    ErrorKind,
    Result,
)
from trainer_client.client.tool_client import TOKEN_ENV

ERROR_KIND_META_KEY = "error_kind"  # under _meta[META_KEY] of a result: the protocol ErrorKind


class McpToolClient:
    """``call_tools`` / ``release_session`` over the official MCP SDK client.

    Args:
        url: the MCP endpoint, e.g. ``http://127.0.0.1:8000/mcp``.
        token: bearer token (default: ``TOOLFACTORY_TOKEN`` from the environment).
        mode: the SDK's connect mode: ``"auto"``, ``"legacy"`` or a protocol version
            such as ``"2026-07-28"``.
        max_concurrency: most calls in flight at once over this connection.
        timeout_s: read timeout of one call.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        mode: str = "auto",
        max_concurrency: int = 32,
        timeout_s: float = 120.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"MCP URL must start with http:// or https://, got {url!r}")
        self.url = url
        self.mode = mode
        self.timeout_s = timeout_s
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._limit = asyncio.Semaphore(max_concurrency)
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._connecting = asyncio.Lock()
        self.calls = 0
        self.errors: dict[str, int] = {}
        self._instances: dict[str, str] = {}  # session -> the server process that answered for it

    async def __aenter__(self) -> McpToolClient:
        await self._connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _connect(self) -> Client:
        """Open the connection once, in a task of its own.

        The SDK's transports use anyio task groups, which must be entered and left by
        the same task; a dedicated owner task lets any caller connect and any caller close.
        """
        async with self._connecting:
            if self._client is None:
                ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
                self._stop = asyncio.Event()
                self._owner = asyncio.create_task(self._own_connection(ready, self._stop))
                self._client = await ready
            return self._client

    async def _own_connection(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        try:
            async with AsyncExitStack() as stack:
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(headers=self._headers, timeout=httpx2.Timeout(self.timeout_s))
                )
                transport = streamable_http_client(self.url, http_client=http)
                client = Client(transport, mode=self.mode, read_timeout_seconds=self.timeout_s)
                ready.set_result(await stack.enter_async_context(client))
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                raise

    async def list_tools(self) -> list[dict[str, Any]]:
        """Tool descriptors as plain dicts in MCP wire form (``inputSchema``, ``_meta``)."""
        client = await self._connect()
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools

    async def call_tools(self, calls: Sequence[Call]) -> list[Result]:
        """Run the calls concurrently (one MCP request each); results in order.

        Never raises for a failed call: an unreachable server gives ``unavailable`` results.
        """
        try:
            client = await self._connect()
        except Exception as exc:
            self.errors["unavailable"] = self.errors.get("unavailable", 0) + len(calls)
            message = f"cannot connect to the MCP server at {self.url}: {exc!r}"
            return [Result.failure(c.call_id, ErrorKind.UNAVAILABLE, message) for c in calls]
        return list(await asyncio.gather(*(self._call(client, c) for c in calls)))

    async def _call(self, client: Client, call: Call) -> Result:
        meta: dict[str, Any] = {CALL_ID_META_KEY: call.call_id}
        if call.session:
            meta[SESSION_META_KEY] = call.session
            if call.session in self._instances:
                meta[INSTANCE_META_KEY] = self._instances[call.session]
        start = time.perf_counter()
        self.calls += 1
        async with self._limit:
            try:
                answer = await client.call_tool(call.name, call.arguments, meta=meta)  # type: ignore[arg-type]
            except Exception as exc:  # transport failure or a JSON-RPC error: an error result
                kind = _exception_kind(exc)
                if kind == ErrorKind.UNAVAILABLE and self._client is client:
                    await self.aclose()  # the connection is gone: the next call reconnects
                self.errors[kind.value] = self.errors.get(kind.value, 0) + 1
                return Result.failure(call.call_id, kind, f"MCP call {call.name} to {self.url} failed: {exc}")
        elapsed = (time.perf_counter() - start) * 1000.0
        content = [
            block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in answer.content
        ]
        result = Result(
            call.call_id, content, answer.structured_content, bool(answer.is_error), elapsed_ms=elapsed
        )
        instance = ((answer.meta or {}).get(META_KEY) or {}).get("instance")
        if call.session and isinstance(instance, str):
            self._instances.setdefault(call.session, instance)
        if result.is_error:
            result.error = ErrorInfo(_error_kind(answer.meta), result.text)
            self.errors[result.error.kind.value] = self.errors.get(result.error.kind.value, 0) + 1
        return result

    async def release_session(self, session_id: str) -> None:
        """MCP has no session release: state of stateful tools expires with the server's TTL."""
        self._instances.pop(session_id, None)

    async def aclose(self) -> None:
        owner, self._owner, self._client = self._owner, None, None
        if owner is not None:
            self._stop.set()
            await asyncio.gather(owner, return_exceptions=True)


def _error_kind(meta: dict[str, Any] | None) -> ErrorKind:
    ours = (meta or {}).get(META_KEY) or {}
    try:
        return ErrorKind(ours.get(ERROR_KIND_META_KEY, ErrorKind.TOOL_ERROR))
    except ValueError:
        return ErrorKind.TOOL_ERROR


def _exception_kind(exc: Exception) -> ErrorKind:
    """The protocol error kind of an exception raised by the SDK client."""
    if isinstance(exc, MCPError):
        return {
            CONNECTION_CLOSED: ErrorKind.UNAVAILABLE,
            REQUEST_TIMEOUT: ErrorKind.TIMEOUT,
            INVALID_PARAMS: ErrorKind.INVALID_ARGUMENTS,
        }.get(exc.code, ErrorKind.TOOL_ERROR)
    if isinstance(exc, httpx2.HTTPError | OSError | TimeoutError):
        return ErrorKind.TIMEOUT if isinstance(exc, TimeoutError) else ErrorKind.UNAVAILABLE
    return ErrorKind.TOOL_ERROR
