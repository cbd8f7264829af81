"""A stateful tool for tests that need per-session state behind a real server."""

from __future__ import annotations

from typing import Annotated, Any

from protocol import ToolContext, ToolError, tool


@tool(name="notebook", stateful=True, timeout_s=5, idempotent=False)
async def notebook(ctx: ToolContext, put: Annotated[str, "A line to append."] = "") -> dict[str, Any]:
    """Append a line to the session's notebook and return every line so far."""
    if ctx.session is None:
        raise ToolError("notebook needs a session")
    lines = ctx.session.data.setdefault("lines", [])
    if put:
        lines.append(put)
    return {"session": ctx.session.id, "lines": list(lines)}
