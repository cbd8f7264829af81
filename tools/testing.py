"""Test tools: ``echo``, ``sleep``, ``count``, ``tick``. Served in the ``test`` toolset only.

They make the executor's behaviour observable from outside: ``sleep`` for timeouts
and latency workloads, ``count`` for proving that a retried call did not run twice in
one server process, ``tick`` / ``tick_idempotent`` for counting executions across
processes (chaos tests kill replicas and count what ran where).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Annotated, Any

from protocol import ToolContext, ToolError, tool

_executions: Counter[str] = Counter()


@tool(name="echo", timeout_s=5, blocking=False)
def echo(
    text: Annotated[str, "Text to return unchanged."] = "",
    data: Annotated[dict[str, Any] | None, "Any JSON object; returned as structured output."] = None,
) -> dict[str, Any]:
    """Return the arguments unchanged (a trivial tool for tests and benchmarks)."""
    return {"text": text, "data": data}


@tool(name="echo_async", timeout_s=5)
async def echo_async(text: Annotated[str, "Text to return unchanged."] = "") -> dict[str, Any]:
    """Return the text from a coroutine (exercises the task path of the executor)."""
    return {"text": text}


@tool(name="sleep", timeout_s=60)
async def sleep(
    seconds: Annotated[float, "How long to sleep, in seconds (0 to 600)."] = 0.1,
) -> dict[str, float]:
    """Sleep, then report how long: a stand-in for a slow tool or API."""
    if not 0 <= seconds <= 600:
        raise ToolError("seconds must be between 0 and 600", "invalid_arguments")
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@tool(name="count", timeout_s=5, idempotent=False)
async def count(key: Annotated[str, "Counter name."] = "default") -> dict[str, Any]:
    """Increment and return a named in-process counter: shows how often a tool really ran."""
    _executions[key] += 1
    return {"key": key, "count": _executions[key]}


@tool(name="fail", timeout_s=5)
def fail(message: Annotated[str, "Error message to raise."] = "boom") -> str:
    """Raise an exception on purpose (a sync tool): shows that failures become error results."""
    raise RuntimeError(message)


@tool(name="big_output", timeout_s=10)
def big_output(chars: Annotated[int, "Number of characters to return."] = 100_000) -> str:
    """Return a long string: shows output truncation."""
    return "x" * max(0, min(chars, 50_000_000))


def _record_execution(path: str, call_id: str) -> None:
    # One write() on an O_APPEND descriptor: lines from concurrent processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{call_id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


@tool(name="tick", timeout_s=60, idempotent=False)
async def tick(
    ctx: ToolContext,
    path: Annotated[str, "File to append this call's id to (tests only)."],
    seconds: Annotated[float, "How long to sleep after recording, in seconds (0 to 60)."] = 0.0,
) -> dict[str, Any]:
    """Record the execution (append "call_id pid" to a file), then sleep: a non-idempotent side effect.

    The side effect happens first, so a call cut off mid-sleep has already "run".
    """
    if not 0 <= seconds <= 60:
        raise ToolError("seconds must be between 0 and 60", "invalid_arguments")
    _record_execution(path, ctx.call_id)
    await asyncio.sleep(seconds)
    return {"call_id": ctx.call_id}


@tool(name="tick_idempotent", timeout_s=60, idempotent=True)
async def tick_idempotent(
    ctx: ToolContext,
    path: Annotated[str, "File to append this call's id to (tests only)."],
    seconds: Annotated[float, "How long to sleep after recording, in seconds (0 to 60)."] = 0.0,
) -> dict[str, Any]:
    """``tick`` declared idempotent: the client may re-run it on another replica."""
    return await tick(ctx, path, seconds)
