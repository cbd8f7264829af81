"""Tools that stress the executor's failure paths (served by tests/server/executor/test_faults.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import pydantic

from protocol import Result, SessionState, ToolContext, tool

GATE: dict[str, asyncio.Event] = {}


@tool(name="cleanup_fails", stateful=True, timeout_s=5)
async def cleanup_fails(ctx: ToolContext) -> str:
    """Succeeds, but leaves its session a cleanup that raises."""
    session: SessionState = ctx.session

    def broken_cleanup() -> None:
        raise RuntimeError("cleanup failed")

    session.on_close(broken_cleanup)
    return "done"


STARTED: list[str] = []  # call ids of one_at_a_time, in the order they started


@tool(name="one_at_a_time", max_concurrency=1, timeout_s=30)
async def one_at_a_time(ctx: ToolContext, tag: Annotated[str, "Which gate to wait for."]) -> str:
    """Waits until the test opens its gate; at most one runs at a time."""
    STARTED.append(ctx.call_id)
    await GATE.setdefault(tag, asyncio.Event()).wait()
    return tag


@tool(name="held", stateful=True, timeout_s=30)
async def held(ctx: ToolContext, tag: Annotated[str, "Which gate to wait for."]) -> str:
    """A stateful call that waits until the test opens its gate."""
    await GATE.setdefault(tag, asyncio.Event()).wait()
    return tag


CONSTANT = Result("whatever", [{"type": "text", "text": "always the same object"}])


@tool(name="constant_result", timeout_s=5)
async def constant_result(n: int = 0) -> Result:
    """Returns one shaped Result object on every call (a memoised answer)."""
    return CONSTANT


@tool(name="wide_structured", timeout_s=10)
async def wide_structured(items: int = 30_000) -> dict:
    """Structured output of about 100 bytes of JSON per item."""
    return {"items": ["x" * 96] * items}


@tool(name="jot", stateful=True, timeout_s=5)
async def jot(ctx: ToolContext, line: str) -> dict:
    """Adds a line to the session's notes; returns them all. The line "raise" raises."""
    if line == "raise":
        raise RuntimeError("asked to fail")
    notes = ctx.session.data.setdefault("notes", [])
    notes.append(line)
    return {"notes": list(notes)}


@tool(name="jotting_agent", stateful=True, timeout_s=5)
async def jotting_agent(ctx: ToolContext) -> dict:
    """Jots a line itself, then has the jot tool add one in the same session."""
    ctx.session.data.setdefault("notes", []).append("outer")
    inner = await ctx.call("jot", {"line": "inner"})
    return {"inner": inner.structured, "session": ctx.session.id}


@tool(name="shaped_oversize", timeout_s=5)
async def shaped_oversize(chars: int = 100_000) -> Result:
    """Returns its own Result: long text, and structured output JSON cannot hold (a set)."""
    return Result("any", [{"type": "text", "text": "y" * chars}], structured={"tags": {"a", "b"}})


@tool(name="numpy_scores", timeout_s=5)
async def numpy_scores(n: int = 3) -> dict:
    """Structured output holding numpy values, as model code returns them."""
    import numpy as np

    scores = np.linspace(0.0, 1.0, n, dtype=np.float32)
    return {"best": scores.max(), "count": np.int64(n), "scores": scores}


@tool(name="stuck", stateful=True, timeout_s=0.2)
async def stuck(ctx: ToolContext) -> str:
    """A stateful call that runs past its timeout."""
    await asyncio.sleep(30)
    return "never"


class Picky(pydantic.BaseModel):
    """Arguments whose own check has a bug."""

    key: str

    @pydantic.field_validator("key")
    @classmethod
    def known(cls, key: str) -> str:
        return {"ok": "ok"}[key]  # KeyError for any other key: pydantic lets it through


@tool(name="buggy_check", timeout_s=5)
async def buggy_check(picky: Picky) -> str:
    """A tool whose argument model raises something pydantic does not turn into a validation error."""
    return picky.key
