"""Per-session order: calls of stateful tools in one session run one at a time, in call order."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from protocol import Result, decode_results
from tests.support.server import ServerProcess, running_server, server_config

STATEFUL = [
    {"target": f"tests.support.stateful_tools:{name}", "toolsets": ["test"]}
    for name in ("notebook", "tally", "add_to_cart", "checkout")
]


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    config = server_config()
    config["tools"] = [*config["tools"], *STATEFUL]
    with running_server(config) as proc:
        yield proc


def call(name: str, session: str | None, **arguments: Any) -> dict[str, Any]:
    return {"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}


async def post(client: httpx.AsyncClient, calls: list[dict[str, Any]]) -> list[Result]:
    response = await client.post("/v1/calls", json={"calls": calls})
    assert response.status_code == 200, response.text
    return decode_results(response.content)


def test_one_sessions_calls_never_overlap_and_keep_batch_order(srv):
    session = uuid.uuid4().hex
    calls = [call("tally", session) for _ in range(100)]

    async def scenario() -> list[Result]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            return await post(client, calls)

    results = asyncio.run(scenario())
    assert [r.structured["count"] for r in results] == list(range(1, 101))  # no lost update
    assert results[-1].structured["order"] == [c["call_id"] for c in calls]  # batch order


def test_batches_of_one_session_run_in_arrival_order_and_other_sessions_in_parallel(srv):
    session, others = uuid.uuid4().hex, [uuid.uuid4().hex for _ in range(4)]

    async def scenario() -> tuple[list[list[Result]], list[list[Result]]]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            mine = []
            for _ in range(5):  # sent one after another, each without waiting for the last
                mine.append(asyncio.create_task(post(client, [call("tally", session) for _ in range(10)])))
                await asyncio.sleep(0.01)
            theirs = [post(client, [call("tally", s, pause_s=0.2)]) for s in others]
            return await asyncio.gather(*mine), await asyncio.gather(*theirs)

    mine, theirs = asyncio.run(scenario())
    counts = [r.structured["count"] for batch in mine for r in batch]
    assert counts == list(range(1, 51))
    # Different sessions are not serialised: their 0.2 s calls overlapped each other.
    assert max(r.structured["peak"] for batch in theirs for r in batch) >= 2


def test_parallel_calls_of_one_turn_run_in_the_order_the_model_wrote_them(srv):
    async def trajectory(client: httpx.AsyncClient) -> Result:
        session = uuid.uuid4().hex
        results = await post(client, [call("add_to_cart", session, item="book"), call("checkout", session)])
        return results[1]

    async def scenario() -> list[Result]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            return await asyncio.gather(*(trajectory(client) for _ in range(40)))

    checkouts = asyncio.run(scenario())
    assert all(r.structured == {"bought": ["book"]} for r in checkouts), [r.text for r in checkouts]


def test_a_released_session_is_not_revived_by_a_late_call(srv):
    session = uuid.uuid4().hex

    async def scenario() -> tuple[Result, Result]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            (first,) = await post(client, [call("notebook", session, put="a")])
            assert (await client.delete(f"/v1/sessions/{session}")).status_code == 200
            (late,) = await post(client, [call("notebook", session, put="b")])
            return first, late

    first, late = asyncio.run(scenario())
    assert first.structured["lines"] == ["a"]
    assert late.error.kind == "unknown_session" and "released or expired" in late.error.message
