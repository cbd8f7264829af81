"""A tool that waits for the test to let it finish: calls in flight for as long as a test needs,
with no timing in the test (it opens the gate when it has checked what it wanted to)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any

from protocol import ToolContext, ToolError, tool


async def wait_at(gate: str) -> None:
    """Note the call in ``<gate>.started`` (one line each), then wait until ``gate`` exists."""
    with open(gate + ".started", "a") as started:  # one short append: whole lines even if concurrent
        started.write(f"{os.getpid()}\n")
    while not Path(gate).exists():
        await asyncio.sleep(0.01)


@tool(name="gated", timeout_s=300)
async def gated(
    gate: Annotated[str, "A file path: the call returns once this file exists."],
    pad: Annotated[str, "Ignored: makes the call as large as a test needs."] = "",
) -> dict[str, Any]:
    """Wait at ``gate`` (``wait_at``), then return."""
    await wait_at(gate)
    return {"passed": True, "pad": len(pad)}


@tool(name="held_notebook", stateful=True, timeout_s=300, idempotent=False)
async def held_notebook(
    ctx: ToolContext,
    gate: Annotated[str, "A file path: the call returns once this file exists."],
    put: Annotated[str, "A line to append."] = "",
) -> dict[str, Any]:
    """The test notebook's append (``stateful_tools.notebook``), then wait at ``gate``: the
    session has a call in flight for as long as the test needs."""
    if ctx.session is None:
        raise ToolError("held_notebook needs a session")
    lines = ctx.session.data.setdefault("lines", [])
    if put:
        lines.append(put)
    await wait_at(gate)
    return {"session": ctx.session.id, "lines": list(lines)}


def started(gate: str | Path) -> int:
    """Calls that have reached the gate so far."""
    path = Path(f"{gate}.started")
    return len(path.read_text().splitlines()) if path.exists() else 0
