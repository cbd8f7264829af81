"""Split POSTs (``trainer_client.client.splits``) against real servers on loopback: relief for a batch that
one slow call holds back, none for a replica that is slow as a whole."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from protocol import Call, new_call_id
from tests.support.server import running_server
from trainer_client.client.tool_client import ToolClient


@pytest.fixture(scope="module")
def two_servers() -> Iterator[tuple[str, str]]:
    with running_server() as first, running_server() as second:
        yield first.url, second.url


def sleep_call(seconds: float, session: str | None = None) -> Call:
    return Call(new_call_id(), "sleep", {"seconds": seconds}, session)


async def session_on(client: ToolClient, url: str) -> str:
    """A new session whose home (rendezvous hash) is the replica at ``url``."""
    for _ in range(200):
        session = await client.create_session()
        if client.session_replica(session) == url:
            return session
    raise AssertionError(f"no session hashed to {url} in 200 tries")


async def test_a_slow_call_gets_relief_while_another_replica_is_slow_as_a_whole(
    two_servers: tuple[str, str],
) -> None:
    """Replica ``slow`` runs only slow calls; on ``fine`` one slow call shares a batch with a
    fast one. The fast one comes back early. (The old policy split every late batch, so the
    slow replica's batch took the client's split budget -- a quarter of an 8-connection pool
    -- and the fast call waited for the slow one.)"""
    slow, fine = two_servers
    async with ToolClient([slow, fine], max_connections=8, split_after_ms=150, health_interval_s=0) as client:
        on_slow, on_fine = await session_on(client, slow), await session_on(client, fine)
        # What the client knows of `fine`: one batch of quick calls, answered in time.
        await client.call_tools([sleep_call(0, on_fine), sleep_call(0, on_fine)])
        busy = asyncio.create_task(client.call_tools([sleep_call(2.5, on_slow) for _ in range(4)]))
        await asyncio.sleep(0.3)  # its batch is late by now
        # Started in the same event-loop pass, so both calls share one POST.
        held = asyncio.create_task(client.call_tools([sleep_call(2.5, on_fine)]))
        fast = asyncio.create_task(client.call_tools([sleep_call(0.05, on_fine)]))
        done, _ = await asyncio.wait({held, fast}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {fast}, "the fast call waited for the slow call in its batch"
        results = [*(await busy), *(await held), *fast.result()]
        metrics = client.metrics()
    assert not any(r.is_error for r in results), results
    assert metrics["split_posts"] == 2  # the two calls of the held-back batch, none for `slow`


async def test_a_replica_slow_as_a_whole_gets_no_split_posts(two_servers: tuple[str, str]) -> None:
    """Every call on the replica takes 400 ms: batches are late, and no split would help."""
    async with ToolClient(two_servers[0], split_after_ms=150) as client:

        async def trajectory() -> list[bool]:
            return [r.is_error for _ in range(3) for r in await client.call_tools([sleep_call(0.4)])]

        errors = await asyncio.gather(*(trajectory() for _ in range(16)))
        metrics = client.metrics()
    assert not any(e for errs in errors for e in errs)
    assert metrics["mean_batch_size"] >= 2, metrics  # batches that could have been split
    assert metrics["split_posts"] == 0, metrics


async def test_a_replica_that_turns_slow_stops_getting_split_posts(two_servers: tuple[str, str]) -> None:
    """Quick at first, so late batches are split; once every call is slow, the splits stop
    within the moving average's ~8 batches (the old policy split every late batch)."""
    async with ToolClient(two_servers[1], split_after_ms=150) as client:
        for _ in range(10):
            await client.call_tools([sleep_call(0), sleep_call(0)])

        async def slow_batches(n: int) -> int:
            for _ in range(n):
                results = await client.call_tools([sleep_call(0.4), sleep_call(0.4)])
                assert not any(r.is_error for r in results), results
            return client.metrics()["split_posts"]

        at_first = await slow_batches(8)
        later = await slow_batches(6) - at_first
    assert at_first > 0  # the quick history let the first late batches be split
    assert later == 0
