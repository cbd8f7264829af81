"""Test tools: ``echo``, ``sleep`` and ``count``. Served in the ``test`` toolset only.

They make the executor's behaviour observable from outside: ``sleep`` for timeouts
and latency workloads, ``count`` for proving that a retried call did not run twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Annotated, Any

from protocol import ToolError, tool

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
