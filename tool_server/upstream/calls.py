"""What one upstream call sends besides its arguments, and what its outcome becomes: a ``Result``.

``call_outcome`` maps the SDK's result to ours; ``call_error`` maps what the call
raised to an error kind and message, and says when it means the connection is gone.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx2
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, PARSE_ERROR, REQUEST_TIMEOUT, CallToolResult

from protocol import CALL_ID_META_KEY, SESSION_META_KEY, ErrorKind, Result, SessionState
from protocol.messages import ErrorInfo
from tool_server.upstream.stdio import MESSAGE_TOO_LARGE

__all__ = ["CallError", "call_error", "call_outcome", "failure", "request_meta"]


def request_meta(call_id: str, session: SessionState | None) -> dict[str, Any] | None:
    """The request ``_meta``: the trajectory's session and the call id, where there are any."""
    meta = {}
    if session is not None:
        meta[SESSION_META_KEY] = session.id
    if call_id:
        meta[CALL_ID_META_KEY] = call_id
    return meta or None


def call_outcome(raw: CallToolResult, call_id: str, started: float) -> Result:
    """The upstream's result as ours: its content blocks and structured content as they are."""
    content = [block.model_dump(by_alias=True, exclude_none=True, mode="json") for block in raw.content]
    result = Result(
        call_id=call_id,
        content=content,
        structured=raw.structured_content,
        is_error=bool(raw.is_error),
        elapsed_ms=_elapsed_ms(started),
    )
    if result.is_error:
        result.error = ErrorInfo(ErrorKind.TOOL_ERROR, result.text or "upstream tool reported an error")
    return result


def failure(call_id: str, kind: ErrorKind, message: str, started: float) -> Result:
    return Result.failure(call_id, kind, message, _elapsed_ms(started))


class CallError:
    """A failed call, classified: ``lost`` says why the connection is gone (None: it is not)."""

    __slots__ = ("kind", "message", "lost")

    def __init__(self, kind: ErrorKind, message: str, lost: str | None = None) -> None:
        self.kind, self.message, self.lost = kind, message, lost


def call_error(exc: Exception, *, tool: str, upstream_tool: str, label: str, deadline: float) -> CallError:
    """What ``exc``, raised by a call of ``tool`` (``upstream_tool`` upstream), means for the caller."""
    late = CallError(ErrorKind.TIMEOUT, f"{tool} did not answer within {deadline:g} s")
    if isinstance(exc, TimeoutError):
        return late
    if isinstance(exc, MCPError):
        if exc.code == REQUEST_TIMEOUT:
            return late
        if _too_large(exc):
            return CallError(ErrorKind.TOO_LARGE, f"{tool}: {exc.error.message}")
        if exc.code == CONNECTION_CLOSED:
            lost = f"connection closed during a call to {upstream_tool!r}"
            return CallError(ErrorKind.UNAVAILABLE, f"{label} closed the connection", lost)
        if exc.code == INVALID_PARAMS:
            return CallError(ErrorKind.INVALID_ARGUMENTS, f"{tool}: {exc}")
        return CallError(ErrorKind.TOOL_ERROR, f"{tool}: {exc} (code {exc.code})")
    if isinstance(
        exc, httpx2.TransportError | OSError | anyio.BrokenResourceError | anyio.ClosedResourceError
    ):
        lost = f"{type(exc).__name__}: {exc}"
        return CallError(ErrorKind.UNAVAILABLE, f"{label} is unreachable: {exc}", lost)
    if isinstance(exc, RuntimeError) and _result_check(str(exc)):
        return CallError(ErrorKind.TOOL_ERROR, f"{tool}: {exc}")
    if isinstance(exc, RuntimeError):  # the client was closed under us by a reconnect
        return CallError(ErrorKind.UNAVAILABLE, f"{label} is reconnecting: {exc}")
    # e.g. output that fails the tool's own outputSchema
    return CallError(ErrorKind.TOOL_ERROR, f"{tool}: {type(exc).__name__}: {exc}")


def _result_check(message: str) -> bool:
    """The SDK's RuntimeError for a result that fails the tool's own outputSchema (or for that schema)."""
    return message.startswith(("Invalid structured content returned by tool", "Invalid schema for tool")) or (
        "has an output schema but did not return structured content" in message
    )


def _too_large(exc: MCPError) -> bool:
    """The answer was over ``max_message_bytes``: over stdio our code stands in for it; over HTTP
    the SDK fails the request (a JSON body: parse error; an SSE event: stream closed), naming the limit."""
    if exc.code == MESSAGE_TOO_LARGE:
        return True
    return exc.code in (PARSE_ERROR, CONNECTION_CLOSED) and "byte limit" in exc.error.message


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
