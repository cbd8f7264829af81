"""The python tool's fleet budget: live interpreters and their memory are capped across sessions.

Hole closed (security campaign, point 8): nothing limited total sandbox memory or live
workers (8 idle sessions of 420 MB each took 3.4 GB; ~53 would exhaust a 24 GB host).
Now a new session beyond ``max_workers`` / ``max_total_memory_mb`` evicts the least
recently used idle session, or is refused with ``overloaded`` when every one is busy.
Real confined workers throughout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from protocol import ErrorKind, SessionState, ToolError
from tests.support.tool_context import Ctx
from tools.python_tool import PythonTool


@pytest.fixture
async def sessions() -> AsyncIterator[dict[str, SessionState]]:
    made: dict[str, SessionState] = {}

    class Sessions(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> SessionState:
            made[name] = self[name] = SessionState(f"fleet-{name}")
            return made[name]

    yield Sessions()
    for session in made.values():
        await session.close()


async def text(tool: PythonTool, code: str, session: SessionState) -> str:
    return (await tool(code, Ctx(session))).content[0]["text"]


async def test_idle_sessions_are_evicted_least_recently_used_first(sessions: Any) -> None:
    tool = PythonTool(pool_size=0, timeout_s=10, memory_mb=256, max_workers=3)
    await tool.startup()
    try:
        for n in (1, 2, 3):
            await text(tool, f"x = {n}", sessions[n])
        assert await text(tool, "x", sessions[1]) == "1"  # session 2 is now the least recently used
        assert await text(tool, "x = 4\nx", sessions[4]) == "4"  # a 4th session: 2 makes room
        with pytest.raises(ToolError) as info:
            await text(tool, "x", sessions[2])
        assert info.value.kind is ErrorKind.TOOL_ERROR
        message = info.value.message
        assert "evicted" in message and "limit of 3 interpreters" in message, message
        assert "variables" in message and "gone" in message
        assert await text(tool, "'x' in globals()", sessions[2]) == "False"  # a fresh one (3 went)
        assert await text(tool, "x", sessions[1]) == "1" and await text(tool, "x", sessions[4]) == "4"
        gauges = tool.gauges()
        assert gauges["sandbox_workers_live"] == 3
        assert gauges["sandbox_evictions_total"] == 2
        assert gauges["sandbox_admissions_refused_total"] == 0
    finally:
        await tool.shutdown()


async def test_a_new_session_is_refused_as_overloaded_while_every_interpreter_is_busy(sessions: Any) -> None:
    tool = PythonTool(pool_size=0, timeout_s=10, memory_mb=256, max_workers=2)
    await tool.startup()
    try:
        async with anyio.create_task_group() as tg:
            for name in ("a", "b"):
                tg.start_soon(text, tool, "import time\ntime.sleep(2)", sessions[name])
            with anyio.fail_after(5):
                while tool.gauges()["sandbox_workers_busy"] < 2:
                    await anyio.sleep(0.01)
            with pytest.raises(ToolError) as info:
                await text(tool, "1", sessions["c"])
            assert info.value.kind is ErrorKind.OVERLOADED
            assert "limit of 2 interpreters" in info.value.message and "Retry" in info.value.message
            with pytest.raises(ToolError) as one_shot:  # calls without a session need one too
                await tool("1", Ctx(None))
            assert one_shot.value.kind is ErrorKind.OVERLOADED
        assert await text(tool, "'c' + 'c'", sessions["c"]) == "'cc'"  # a and b are idle again
        gauges = tool.gauges()
        assert gauges["sandbox_admissions_refused_total"] == 2 and gauges["sandbox_evictions_total"] == 1
    finally:
        await tool.shutdown()


async def test_memory_budget_evicts_the_idle_session_that_holds_it(sessions: Any) -> None:
    tool = PythonTool(pool_size=0, timeout_s=20, memory_mb=512, max_workers=10, max_total_memory_mb=150)
    await tool.startup()
    try:
        code = "blob = b'x' * (100 << 20)\nlen(blob) >> 20"
        assert await text(tool, code, sessions["big"]) == "100"  # under the budget alone
        # Over it together (during or right after this call): the idle session makes room.
        assert await text(tool, code, sessions["next"]) == "100"
        with anyio.fail_after(20):
            while not tool.gauges()["sandbox_evictions_total"]:
                await anyio.sleep(0.01)
        assert tool.gauges()["sandbox_memory_budget_bytes"] == 150 << 20
        with pytest.raises(ToolError) as info:
            await text(tool, "len(blob)", sessions["big"])
        assert "evicted" in info.value.message and "memory" in info.value.message, info.value.message
        assert await text(tool, "len(blob) >> 20", sessions["next"]) == "100"
        gauges = tool.gauges()
        assert gauges["sandbox_evictions_total"] == 1 and gauges["sandbox_memory_stops_total"] == 0
        assert gauges["sandbox_memory_bytes"] < 150 << 20
    finally:
        await tool.shutdown()


async def test_a_busy_session_that_takes_memory_over_budget_is_stopped(sessions: Any) -> None:
    """Issue 30, point 1: the fleet's budget holds during calls too, not only between them."""
    tool = PythonTool(pool_size=0, timeout_s=30, memory_mb=512, max_workers=10, max_total_memory_mb=150)
    await tool.startup()
    try:
        with pytest.raises(ToolError) as info:
            await text(tool, "import time\nblob = b'x' * (160 << 20)\ntime.sleep(20)", sessions["big"])
        assert info.value.kind is ErrorKind.TOOL_ERROR
        message = info.value.message
        assert "sandbox memory was over its limit" in message and "held the most" in message, message
        assert tool.gauges()["sandbox_memory_stops_total"] == 1
        assert await text(tool, "'admitted'", sessions["new"]) == "'admitted'"
    finally:
        await tool.shutdown()


def test_gauges_without_a_started_pool() -> None:
    gauges = PythonTool(max_workers=7).gauges()
    assert gauges["sandbox_workers_live"] == 0 and gauges["sandbox_workers_max"] == 7
    assert {
        "sandbox_workers_live",
        "sandbox_workers_idle_pool",
        "sandbox_memory_bytes",
        "sandbox_evictions_total",
        "sandbox_memory_stops_total",
        "sandbox_admissions_refused_total",
    } <= set(gauges)
