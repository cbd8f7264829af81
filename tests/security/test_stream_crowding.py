"""One token's idle ``/v1/stream`` connections cannot lock out other tenants (api/connections.py):
a token holds at most its share of streams (429 at the handshake beyond it), and at the
connection cap an idle stream of the token holding most is closed (1013) before a new connection
is refused; a stream with a frame in flight is never evicted. Real servers; the calls that must
stay in flight wait at a gate the test opens (no timing).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from tests.support.gate_tools import started
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config

TOKEN_A = "crowding-tenant-a-0123456"
TOKEN_B = "crowding-tenant-b-0123456"
CAP = 32  # server.max_connections
DEADLINE_S = 60.0
TOOLS = [*BASE_TOOLS, {"target": "tests.support.gate_tools:gated", "toolsets": ["test"]}]


def start(**server: Any) -> Any:
    config = server_config(tools=TOOLS, server={"max_connections": CAP, **server})
    return running_server(config, env={"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"})


@pytest.fixture(scope="module")
def shared() -> Iterator[ServerProcess]:
    """The default share: 3/4 of the cap per token."""
    with start() as srv:
        yield srv


@pytest.fixture(scope="module")
def whole() -> Iterator[ServerProcess]:
    """A token may hold every connection in streams: only eviction keeps the others in."""
    with start(max_streams_per_tenant=CAP) as srv:
        yield srv


def stream(srv: ServerProcess, token: str) -> Any:
    url = srv.url.replace("http://", "ws://") + "/v1/stream"
    return connect(
        url,
        additional_headers={"Authorization": f"Bearer {token}"},
        compression=None,
        open_timeout=DEADLINE_S,
    )


def calculator() -> bytes:
    call = {"call_id": uuid.uuid4().hex, "name": "calculator", "arguments": {"expression": "6*7"}}
    return orjson.dumps({"calls": [call]})


async def answered(ws: ClientConnection, body: bytes) -> dict[str, Any]:
    await ws.send(body)
    (result,) = orjson.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S))["results"]
    return result


async def served_over_http_and_stream(srv: ServerProcess, token: str) -> None:
    """``token`` opens a stream that answers a call and, while it is open, gets a POST answered."""
    async with stream(srv, token) as ws, httpx.AsyncClient(base_url=srv.url, timeout=DEADLINE_S) as client:
        assert (await answered(ws, calculator()))["structured"] is not None
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        response = await client.post("/v1/calls", content=calculator(), headers=headers)
        assert response.status_code == 200, response.text


async def test_a_token_holds_at_most_its_share_of_streams(shared: ServerProcess) -> None:
    share = CAP * 3 // 4
    held: list[ClientConnection] = []
    try:
        for _ in range(share):
            held.append(await stream(shared, TOKEN_A))
        with pytest.raises(InvalidStatus) as refused:
            await stream(shared, TOKEN_A)
        response = refused.value.response
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert b"server.max_streams_per_tenant" in response.body
        await served_over_http_and_stream(shared, TOKEN_B)
        assert (await answered(held[0], calculator()))["error"] is None  # A's streams still work
    finally:
        for ws in held:
            await ws.close()


async def test_at_the_cap_idle_streams_give_way_and_a_busy_one_stays(
    whole: ServerProcess, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    held: list[ClientConnection] = []
    try:
        for _ in range(CAP):  # every connection the server may hold: A's streams
            held.append(await stream(whole, TOKEN_A))
        busy = held[0]
        call = {"call_id": uuid.uuid4().hex, "name": "gated", "arguments": {"gate": str(gate)}}
        await busy.send(orjson.dumps({"calls": [call]}))
        async with asyncio.timeout(DEADLINE_S):
            while started(gate) < 1:
                await asyncio.sleep(0.02)

        await served_over_http_and_stream(whole, TOKEN_B)  # a handshake, then a POST: room made twice

        for evicted in held[1:3]:  # the longest-idle streams, in order
            await asyncio.wait_for(evicted.wait_closed(), DEADLINE_S)
            assert evicted.close_code == 1013, evicted.close_code
        gate.touch()
        (result,) = orjson.loads(await asyncio.wait_for(busy.recv(), DEADLINE_S))["results"]
        assert result["call_id"] == call["call_id"] and result["structured"]["passed"]
        assert (await answered(held[3], calculator()))["error"] is None  # the others were left alone
    finally:
        for ws in held:
            await ws.close()
