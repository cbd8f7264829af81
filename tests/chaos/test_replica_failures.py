"""Replicas die under load (kill -9, SIGTERM, restart): no call runs twice, none is lost.

Real processes on loopback. Every execution of the ``tick`` tools appends its call_id and
the server's pid to one shared file (O_APPEND), so a test sees what ran where, across
replicas and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from pathlib import Path

import pytest

from protocol import Call, ErrorKind, Result, new_call_id
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config
from trainer_client.client.tool_client import ToolClient

pytestmark = pytest.mark.timeout(90)

TICK_TOOLS = [
    *BASE_TOOLS,
    {"target": "tools.testing:tick", "toolsets": ["test"]},
    {"target": "tools.testing:tick_idempotent", "toolsets": ["test"]},
]
CONFIG = server_config(tools=TICK_TOOLS, server={"shutdown_grace_s": 5})


def executions(path: Path) -> dict[str, list[int]]:
    """call_id -> pids of the server processes that ran it, once per execution."""
    ran: dict[str, list[int]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        call_id, pid = line.split()
        ran.setdefault(call_id, []).append(int(pid))
    return ran


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_hard(server: ServerProcess) -> None:
    server.proc.kill()  # SIGKILL: no drain, in-flight calls are cut off
    server.proc.wait(10)


class Stream:
    """Calls of one tick tool submitted in waves, each call awaited on its own."""

    def __init__(self, client: ToolClient, tool: str, path: Path, seconds: float) -> None:
        self.client, self.tool, self.path, self.seconds = client, tool, path, seconds
        self.calls: list[Call] = []
        self.tasks: list[asyncio.Task[list[Result]]] = []

    def submit(self, count: int) -> None:
        for _ in range(count):
            call = Call(new_call_id(), self.tool, {"path": str(self.path), "seconds": self.seconds})
            self.calls.append(call)
            self.tasks.append(asyncio.create_task(self.client.call_tools([call])))

    async def waves(self, waves: int, per_wave: int, gap_s: float) -> None:
        for _ in range(waves):
            self.submit(per_wave)
            await asyncio.sleep(gap_s)

    async def results(self, timeout_s: float = 40.0) -> list[Result]:
        """Every call's result; a hang (a call never settled) fails the test here."""
        done = await asyncio.wait_for(asyncio.gather(*self.tasks), timeout_s)
        return [result for (result,) in done]


async def started_on(server: ServerProcess, path: Path, count: int = 20, timeout_s: float = 20.0) -> None:
    """Wait until ``count`` tick calls have started on ``server`` (each then sleeps a while).

    Waiting for evidence rather than a fixed time keeps the kill mid-call on a cold or
    loaded machine too.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while sum(server.proc.pid in pids for pids in executions(path).values()) < count:
        assert loop.time() < deadline, f"fewer than {count} calls started on the victim"
        await asyncio.sleep(0.01)


async def stream_through_a_kill(tool: str, path: Path) -> tuple[Stream, list[Result], int, int]:
    """2,000 calls in 20 waves over two replicas; kill -9 one of them after ~8 waves.

    Returns the stream, its results, the index of the first call submitted after the
    victim was dead, and the victim's pid.
    """
    with running_server(CONFIG) as survivor, running_server(CONFIG) as victim:
        async with ToolClient([victim.url, survivor.url], timeout_s=30, health_interval_s=0.2) as client:
            stream = Stream(client, tool, path, seconds=0.4)
            waves = asyncio.create_task(stream.waves(20, 100, gap_s=0.05))
            await started_on(victim, path)  # so the victim has calls running when it dies
            await asyncio.to_thread(kill_hard, victim)
            after_kill = len(stream.calls)
            await waves
            results = await stream.results()
            metrics = client.metrics()
    assert after_kill < len(stream.calls), "the kill came after the last wave"
    assert metrics["replicas"][0]["calls"] > 0 and metrics["replica_down_events"] >= 1
    return stream, results, after_kill, victim.proc.pid


async def test_kill9_never_reruns_a_non_idempotent_call_and_loses_none(tmp_path: Path) -> None:
    path = tmp_path / "executions.txt"
    stream, results, after_kill, victim = await stream_through_a_kill("tick", path)
    ran = executions(path)
    kinds = Counter("ok" if not r.is_error else r.error.kind.value for r in results)
    assert set(kinds) <= {"ok", ErrorKind.OUTCOME_UNKNOWN.value}, kinds
    assert kinds[ErrorKind.OUTCOME_UNKNOWN.value] > 0, kinds  # the victim had calls in flight
    assert max(len(pids) for pids in ran.values()) == 1  # nothing ran twice
    for call, result in zip(stream.calls, results, strict=True):
        assert result.call_id == call.call_id
        if not result.is_error:
            assert len(ran[call.call_id]) == 1  # a success ran exactly once
        else:  # cut off on the victim: ran there or not at all, and nowhere else
            assert ran.get(call.call_id, [victim]) == [victim]
    # Calls sent after the victim died were refused at connect: safe to send elsewhere.
    assert not any(r.is_error for r in results[after_kill:])


async def test_kill9_retries_idempotent_calls_elsewhere_and_all_succeed(tmp_path: Path) -> None:
    path = tmp_path / "executions.txt"
    stream, results, _, victim = await stream_through_a_kill("tick_idempotent", path)
    assert not [r.error for r in results if r.is_error][:3]
    ran = executions(path)
    assert all(call.call_id in ran for call in stream.calls)
    where = Counter(
        "victim+survivor" if len(set(pids)) > 1 else "victim" if pids == [victim] else "survivor"
        for pids in ran.values()
    )
    assert where["victim+survivor"] > 0, where  # cut off on the victim, then run again elsewhere


async def test_sigterm_drains_in_flight_calls_without_doubles_or_losses(tmp_path: Path) -> None:
    path = tmp_path / "executions.txt"
    with running_server(CONFIG) as survivor, running_server(CONFIG) as victim:
        async with ToolClient([victim.url, survivor.url], timeout_s=30, health_interval_s=0.2) as client:
            stream = Stream(client, "tick", path, seconds=1.0)
            stream.submit(1000)  # one batch per replica's share, all running when SIGTERM comes
            await asyncio.sleep(0.3)
            victim.proc.terminate()  # graceful: stops listening, in-flight calls get shutdown_grace_s
            await asyncio.sleep(0.3)
            stream.submit(500)  # refused by the draining victim: go to the survivor
            results = await stream.results()
            # uvicorn re-raises SIGTERM once it has drained: -15 is its normal exit here.
            assert await asyncio.to_thread(victim.proc.wait, 10) in (0, -15)
    assert not [r.error for r in results if r.is_error][:3]
    ran = executions(path)
    assert sorted(ran) == sorted(c.call_id for c in stream.calls)
    assert max(len(pids) for pids in ran.values()) == 1
    # The victim had a share of the first batch running at SIGTERM: drained, not lost or re-run.
    assert sum(pids == [victim.proc.pid] for pids in ran.values()) >= 300


async def test_restart_runs_waiting_calls_but_not_in_flight_non_idempotent_ones(tmp_path: Path) -> None:
    """One replica, killed and restarted on the same port ~4 s later (default retry settings).

    Calls submitted while it is down complete once it is back; idempotent calls that
    were in flight run again on the new process; a non-idempotent one that was in flight
    ends ``outcome_unknown`` and is not run again by the restarted replica.
    """
    path = tmp_path / "executions.txt"
    port = ["--port", str(free_port())]
    with contextlib.ExitStack() as first, contextlib.ExitStack() as second:
        server = first.enter_context(running_server(CONFIG, extra_args=port))
        async with ToolClient(server.url, health_interval_s=0.2) as client:
            assert not (await client.call("echo", {"text": "warm"})).is_error
            tick = Call(new_call_id(), "tick", {"path": str(path), "seconds": 2})
            in_flight = [asyncio.create_task(client.call_tools([tick]))]
            in_flight += [asyncio.create_task(client.call("sleep", {"seconds": 1})) for _ in range(100)]
            await asyncio.sleep(0.5)
            await asyncio.to_thread(kill_hard, server)
            during = [asyncio.create_task(client.call("echo", {"text": f"d{i}"})) for i in range(200)]
            await asyncio.sleep(3.5)  # longer than the old 6-retry budget (≤ 3.2 s)
            assert not any(task.done() for task in during)
            await asyncio.to_thread(second.enter_context, running_server(CONFIG, extra_args=port))
            (tick_result,), *sleeps = await asyncio.wait_for(asyncio.gather(*in_flight), 30)
            waited = await asyncio.wait_for(asyncio.gather(*during), 30)
    assert [r.structured["text"] for r in waited] == [f"d{i}" for i in range(200)]
    assert not any(r.is_error for r in sleeps)
    assert tick_result.is_error and tick_result.error.kind == ErrorKind.OUTCOME_UNKNOWN
    assert executions(path) == {tick.call_id: [server.proc.pid]}  # ran once, on the first process
