"""A stateful tool whose call lasts as long as the test wants (served by test_session_in_flight.py).

The test controls it through files, so that it works in a real server's process too: the
call says it runs by creating ``<gate>.started`` and returns once ``<gate>`` exists; the
release of a session opened with ``close_gate`` waits for that one likewise.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

from protocol import ToolContext, ToolError, tool


@tool(name="hold", stateful=True, timeout_s=300, idempotent=False)
async def hold(
    ctx: ToolContext,
    put: Annotated[str, "A line to append to the session's notebook."],
    gate: Annotated[str, "Wait until this file exists ('' : return at once)."] = "",
    close_gate: Annotated[str, "On the session's first call: its release waits for this file."] = "",
) -> dict[str, Any]:
    """Append a line to the session's notebook, wait for the gate, return every line so far."""
    session = ctx.session
    if session is None:
        raise ToolError("hold needs a session")
    data = session.data
    if "lines" not in data:
        data["lines"] = []
        session.on_close(lambda: data.update(released=True))  # the world was released
        if close_gate:
            session.on_close(lambda: _wait_for(close_gate))  # runs first: newest first
    data["lines"].append(put)
    if gate:
        await _wait_for(gate)
    return {"lines": list(data["lines"]), "released": data.get("released", False)}


async def _wait_for(gate: str) -> None:
    Path(gate + ".started").touch()
    while not Path(gate).exists():
        await asyncio.sleep(0.05)
