"""A session with a call in flight is never swept as idle; its TTL restarts when the call ends.

An MCP client sends no lease renewals: before, a call that ran (or waited for a slot) longer
than ``sessions.ttl_s`` lost its session in the middle, its result landed in a released
world, and the trajectory's next call got ``unknown_session``.

The sweeps here are driven by a fake clock (no test waits for the TTL to pass), except in
the real server's test, which waits for the server's own sweeper to close an idle session
opened after the long call's: the sweep that closes it would have closed the long call's.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from protocol import Call, VerifyRequest, new_call_id, verifier
from tests.support.server import BASE_TOOLS, running_server, server_config
from tool_server.app import build_registry
from tool_server.config import config_from_dict
from tool_server.executor.executor import Executor
from tool_server.sessions import SessionStore

pytestmark = pytest.mark.timeout(300)

TTL_S = 10.0
HOLD = {"target": "tests.server.executor.in_flight_tools:hold", "toolsets": ["test"]}
WAIT_S = 120.0  # a generous bound on waits for the loaded machine; never a measured figure


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@verifier(name="gated_score")
async def gated_score(request: VerifyRequest) -> dict[str, Any]:
    """Scores 1 once the file named by ``arguments['gate']`` exists."""
    Path(request.arguments["gate"] + ".started").touch()
    while not Path(request.arguments["gate"]).exists():
        await asyncio.sleep(0.05)
    return {"score": 1.0}


def make_executor(clock: FakeClock, **limits: Any) -> Executor:
    config = config_from_dict(
        {
            "tools": [HOLD],
            "verifiers": [{"target": f"{__name__}:gated_score"}],
            "sessions": {"ttl_s": TTL_S, "sweep_interval_s": 3600},
            "limits": limits,
        },
        environ={},
    )
    executor = Executor(build_registry(config), config)
    executor.sessions.clock = clock
    return executor


def hold(session: str, put: str, gate: Path | None = None) -> Call:
    return Call(new_call_id(), "hold", {"put": put, "gate": str(gate or "")}, session)


async def started(gate: Path) -> None:
    """Wait until the call gated by ``gate`` runs (it has opened its session)."""
    async with asyncio.timeout(WAIT_S):
        while not Path(f"{gate}.started").exists():
            await asyncio.sleep(0.02)


async def sessions_open(http: httpx.AsyncClient) -> float:
    """The server's own count of open sessions (its /metrics gauge)."""
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith("toolfactory_sessions "):
            return float(line.split()[1])
    raise AssertionError("no toolfactory_sessions gauge in /metrics")


async def test_the_store_keeps_a_session_while_its_calls_are_in_flight() -> None:
    clock = FakeClock()
    store = SessionStore(TTL_S, 8, clock=clock)
    store.open("a", "busy")
    store.open("a", "idle")
    store.open("a", "named-by-b")
    store.call_began(("a", "busy"))
    store.call_began(("a", "busy"))  # two calls: the session waits for both
    store.call_began(("b", "named-by-b"))  # another token's call does not keep a's session
    clock.now += 3 * TTL_S
    assert await store.sweep() == 2
    assert "busy" in store and "idle" not in store and "named-by-b" not in store
    store.call_ended(("a", "busy"))
    clock.now += 3 * TTL_S
    assert await store.sweep() == 0  # one call still in flight
    store.call_ended(("a", "busy"))  # the TTL counts from here
    clock.now += TTL_S - 1
    assert await store.sweep() == 0
    clock.now += 2
    assert await store.sweep() == 1
    assert "busy" not in store
    store.call_ended(("b", "named-by-b"))  # a call ending after its session closed opens nothing
    assert len(store) == 0 and store._in_flight == {}


async def test_a_call_longer_than_the_ttl_keeps_its_world(tmp_path: Path) -> None:
    clock = FakeClock()
    executor = make_executor(clock)
    await executor.start()
    try:
        gate = tmp_path / "gate"
        long_call = asyncio.create_task(executor.run_one(hold("long", "a", gate)))
        await started(gate)
        assert not (await executor.run_one(hold("idle", "z"))).is_error
        clock.now += 3 * TTL_S
        assert await executor.sessions.sweep() == 1  # the idle session only, as before
        assert "long" in executor.sessions and "idle" not in executor.sessions
        gate.touch()
        result = await long_call
        assert not result.is_error, result.error
        assert result.structured == {"lines": ["a"], "released": False}
        clock.now += TTL_S - 1  # the TTL restarted when the call ended
        assert await executor.sessions.sweep() == 0
        follow_up = await executor.run_one(hold("long", "b"))
        assert follow_up.structured == {"lines": ["a", "b"], "released": False}
        clock.now += TTL_S + 1
        assert await executor.sessions.sweep() == 1  # idle for a TTL after its last call
        late = await executor.run_one(hold("long", "c"))
        assert late.error is not None and late.error.kind == "unknown_session"
    finally:
        await executor.stop()


async def test_a_call_queued_longer_than_the_ttl_keeps_its_session(tmp_path: Path) -> None:
    """One global slot, held by another session's long call: the queued call's session was
    last used before the TTL, but its call is admitted, so it stays."""
    clock = FakeClock()
    executor = make_executor(clock, max_concurrency=1)
    await executor.start()
    try:
        assert not (await executor.run_one(hold("queued", "a"))).is_error
        gate = tmp_path / "gate"
        blocker = asyncio.create_task(executor.run_one(hold("blocker", "x", gate)))
        await started(gate)
        queued = asyncio.create_task(executor.run_one(hold("queued", "b")))
        async with asyncio.timeout(WAIT_S):
            while executor.admitted < 2:
                await asyncio.sleep(0.01)
        clock.now += 3 * TTL_S
        assert await executor.sessions.sweep() == 0
        gate.touch()
        assert not (await blocker).is_error
        result = await queued
        assert not result.is_error, result.error
        assert result.structured == {"lines": ["a", "b"], "released": False}
    finally:
        await executor.stop()


async def test_a_call_that_comes_while_the_sweep_closes_another_session_keeps_its_own(
    tmp_path: Path,
) -> None:
    """The sweep awaits each session's cleanup (an interpreter to stop): a session that was
    idle when the sweep began, and got a call meanwhile, is not closed under that call."""
    clock = FakeClock()
    executor = make_executor(clock)
    await executor.start()
    try:
        close_gate, gate = tmp_path / "close", tmp_path / "gate"
        slow = Call(new_call_id(), "hold", {"put": "a", "close_gate": str(close_gate)}, "slow-cleanup")
        assert not (await executor.run_one(slow)).is_error
        assert not (await executor.run_one(hold("late", "a"))).is_error
        clock.now += 3 * TTL_S
        sweeping = asyncio.create_task(executor.sessions.sweep())
        await started(close_gate)  # the sweep is closing the first session
        late_call = asyncio.create_task(executor.run_one(hold("late", "b", gate)))
        await started(gate)
        close_gate.touch()
        assert await sweeping == 1
        gate.touch()
        result = await late_call
        assert result.structured == {"lines": ["a", "b"], "released": False}
    finally:
        await executor.stop()


async def test_a_verify_request_in_flight_keeps_its_session(tmp_path: Path) -> None:
    """A verify request names its session in the request: that session is held too."""
    clock = FakeClock()
    executor = make_executor(clock)
    await executor.start()
    try:
        assert not (await executor.run_one(hold("scored", "a"))).is_error
        gate = tmp_path / "gate"
        request = VerifyRequest("gated_score", session="scored", arguments={"gate": str(gate)})
        scoring = asyncio.create_task(executor.verify_batch([request]))
        await started(gate)
        clock.now += 3 * TTL_S
        assert await executor.sessions.sweep() == 0
        gate.touch()
        [score] = await scoring
        assert not score.is_error and score.score == 1.0
        follow_up = await executor.run_one(hold("scored", "b"))
        assert follow_up.structured == {"lines": ["a", "b"], "released": False}
    finally:
        await executor.stop()


async def test_an_mcp_call_longer_than_the_ttl_keeps_its_world_on_a_real_server(tmp_path: Path) -> None:
    """A real server sweeping every 0.1 s with a 1 s TTL; an MCP client (no renewals) whose
    call runs until the test opens its gate, well past the TTL."""
    config = server_config(tools=[*BASE_TOOLS, HOLD], sessions={"ttl_s": 1.0, "sweep_interval_s": 0.1})
    long_id, idle_id = f"long-{uuid.uuid4().hex}", f"idle-{uuid.uuid4().hex}"
    gate = tmp_path / "gate"
    with running_server(config) as srv:
        async with (
            Client(f"{srv.url}/mcp/test/s/{long_id}", mode="2026-07-28") as agent,
            httpx.AsyncClient(base_url=srv.url, timeout=WAIT_S) as http,
        ):
            long_call = asyncio.create_task(agent.call_tool("hold", {"put": "a", "gate": str(gate)}))
            await started(gate)
            idle = {"call_id": new_call_id(), "name": "hold", "arguments": {"put": "z"}, "session": idle_id}
            assert (await http.post("/v1/calls", json={"calls": [idle]})).status_code == 200
            # The idle session was opened after the long call's: the sweep that closes it
            # is past the long call's TTL too. (Watched on /metrics: a renewal would keep it.)
            async with asyncio.timeout(WAIT_S):
                while await sessions_open(http) == 2:
                    await asyncio.sleep(0.1)
            renewal = await http.post("/v1/sessions/renew", json={"sessions": [idle_id]})
            assert renewal.json()["closed"] == [idle_id]
            gate.touch()
            result = await long_call
            assert not result.is_error, result.content
            assert result.structured_content == {"lines": ["a"], "released": False}
            follow_up = await agent.call_tool("hold", {"put": "b"})
            assert not follow_up.is_error, follow_up.content
            assert follow_up.structured_content == {"lines": ["a", "b"], "released": False}
