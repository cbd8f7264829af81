"""A stateful tool for tests that need per-session state behind a real server."""

from __future__ import annotations

import asyncio
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


_running: dict[str, int] = {"now": 0, "peak": 0}


@tool(name="tally", stateful=True, timeout_s=10)
async def tally(ctx: ToolContext, pause_s: Annotated[float, "Pause between read and write."] = 0.002) -> dict:
    """Read the session's count, pause, write it back plus one: loses updates if calls overlap.

    Also reports how many tally calls ran at once (over all sessions) at the peak.
    """
    if ctx.session is None:
        raise ToolError("tally needs a session")
    _running["now"] += 1
    _running["peak"] = max(_running["peak"], _running["now"])
    try:
        seen = ctx.session.data.get("count", 0)
        await asyncio.sleep(pause_s)
        ctx.session.data["count"] = seen + 1
        ctx.session.data.setdefault("order", []).append(ctx.call_id)
        return {"count": seen + 1, "order": list(ctx.session.data["order"]), "peak": _running["peak"]}
    finally:
        _running["now"] -= 1


@tool(name="add_to_cart", stateful=True, timeout_s=5)
async def add_to_cart(ctx: ToolContext, item: str) -> dict:
    """Put an item in the session's cart (slowly, like a real shop API)."""
    await asyncio.sleep(0.01)
    ctx.session.data.setdefault("cart", []).append(item)  # type: ignore[union-attr]
    return {"cart": list(ctx.session.data["cart"])}  # type: ignore[union-attr]


@tool(name="checkout", stateful=True, timeout_s=5)
def checkout(ctx: ToolContext) -> dict:
    """Buy what is in the cart (a fast sync tool: it would overtake a slow add_to_cart)."""
    cart = ctx.session.data.get("cart", [])  # type: ignore[union-attr]
    if not cart:
        raise ToolError("the cart is empty")
    return {"bought": list(cart)}
