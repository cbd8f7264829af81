"""A tool that waits for the test to let it finish: calls in flight for as long as a test needs,
with no timing in the test (it opens the gate when it has checked what it wanted to)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any

from protocol import tool


@tool(name="gated", timeout_s=300)
async def gated(
    gate: Annotated[str, "A file path: the call returns once this file exists."],
    pad: Annotated[str, "Ignored: makes the call as large as a test needs."] = "",
) -> dict[str, Any]:
    """Note the call in ``<gate>.started`` (one line each), then wait until ``gate`` exists."""
    with open(gate + ".started", "a") as started:  # one short append: whole lines even if concurrent
        started.write(f"{os.getpid()}\n")
    while not Path(gate).exists():
        await asyncio.sleep(0.01)
    return {"passed": True, "pad": len(pad)}


def started(gate: str | Path) -> int:
    """Calls that have reached the gate so far."""
    path = Path(f"{gate}.started")
    return len(path.read_text().splitlines()) if path.exists() else 0
