"""Bytes of calls admitted and not yet answered are bounded per connection, per token and in all
(tool_server/api/queued_bytes.py), against a real server: past a bound a body is refused whole
as ``overloaded`` (a result per call on a stream, 429 on HTTP), and the room comes back once the
calls are answered. ``/v1/verify`` takes its room from the same bounds.

The calls wait at a gate (tests/support/gate_tools.py) the test opens itself: nothing here
depends on timing.
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

from tests.support.gate_tools import started
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config

TOKEN_A = "queued-bytes-tenant-a-0123"
TOKEN_B = "queued-bytes-tenant-b-0123"
KIB = 1024
LIMITS = {
    "max_request_bytes": 32 * KIB,
    "max_queued_bytes_per_connection": 64 * KIB,
    "max_queued_bytes_per_tenant": 96 * KIB,
    "max_queued_bytes": 128 * KIB,
}
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    tools = [*BASE_TOOLS, {"target": "tests.support.gate_tools:gated", "toolsets": ["test"]}]
    verifiers = [{"target": "tools.verifiers.format:format_check"}]
    config = server_config(tools=tools, verifiers=verifiers, limits=LIMITS)
    with running_server(config, env={"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}) as srv:
        yield srv


def gated_body(gate: Path, pad: int) -> bytes:
    call = {"call_id": uuid.uuid4().hex, "name": "gated", "arguments": {"gate": str(gate), "pad": "x" * pad}}
    return orjson.dumps({"calls": [call]})


def stream(srv: ServerProcess, token: str) -> Any:
    url = srv.url.replace("http://", "ws://") + "/v1/stream"
    return connect(url, additional_headers={"Authorization": f"Bearer {token}"}, compression=None)


async def next_results(ws: ClientConnection) -> list[dict[str, Any]]:
    return orjson.loads(await asyncio.wait_for(ws.recv(), DEADLINE_S))["results"]


async def calls_started(gate: Path, count: int) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while started(gate) < count:
            await asyncio.sleep(0.02)


async def hold_80_kib(a1: ClientConnection, a2: ClientConnection, gate: Path) -> None:
    """80 KiB of token A's 96 KiB wait at the gate: three frames of 20 KiB on ``a1``, one on ``a2``."""
    for ws, frames in ((a1, 3), (a2, 1)):
        for _ in range(frames):
            await ws.send(gated_body(gate, 20_000))
    await calls_started(gate, 4)


async def all_answered(a1: ClientConnection, a2: ClientConnection) -> None:
    """The four calls ``hold_80_kib`` sent are answered, once the gate is open."""
    for ws, count in ((a1, 3), (a2, 1)):
        for _ in range(count):
            (result,) = await next_results(ws)
            assert result["error"] is None, result


async def test_queued_bytes_are_bounded_per_connection_per_token_and_in_all(
    server: ServerProcess, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    post = httpx.AsyncClient(base_url=server.url, timeout=DEADLINE_S)
    async with stream(server, TOKEN_A) as a1, stream(server, TOKEN_A) as a2, post:
        # One connection: three frames of 20 KiB wait at the gate; a fourth would hold 80 KiB.
        for _ in range(3):
            await a1.send(gated_body(gate, 20_000))
        await calls_started(gate, 3)
        await a1.send(gated_body(gate, 20_000))
        (refused,) = await next_results(a1)
        assert refused["error"]["kind"] == "overloaded", refused
        assert "limits.max_queued_bytes_per_connection" in refused["error"]["message"]

        # The same token on another connection: 80 KiB fits, 100 KiB is over its 96 KiB.
        await a2.send(gated_body(gate, 20_000))
        await calls_started(gate, 4)
        await a2.send(gated_body(gate, 20_000))
        (refused,) = await next_results(a2)
        assert refused["error"]["kind"] == "overloaded", refused
        assert "limits.max_queued_bytes_per_tenant" in refused["error"]["message"]

        # Another token: its first POST fits (100 KiB in all); one of 31 KiB is past the 128 KiB.
        headers_b = {"Authorization": f"Bearer {TOKEN_B}", "Content-Type": "application/json"}
        waiting = asyncio.create_task(
            post.post("/v1/calls", content=gated_body(gate, 20_000), headers=headers_b)
        )
        await calls_started(gate, 5)
        over = await post.post("/v1/calls", content=gated_body(gate, 31_000), headers=headers_b)
        assert over.status_code == 429 and over.headers["retry-after"] == "1", over.text
        error = over.json()["error"]
        assert error["kind"] == "overloaded" and "limits.max_queued_bytes)" in error["message"]

        gate.touch()  # every admitted call is answered, and its bytes given back
        for ws, count in ((a1, 3), (a2, 1)):
            for _ in range(count):
                (result,) = await next_results(ws)
                assert result["error"] is None and result["structured"]["passed"], result
        assert (await waiting).status_code == 200
        await a1.send(gated_body(gate, 20_000))  # the room is back: what was refused now runs
        (result,) = await next_results(a1)
        assert result["error"] is None
        again = await post.post("/v1/calls", content=gated_body(gate, 31_000), headers=headers_b)
        assert again.status_code == 200


async def test_verify_requests_take_their_room_from_the_same_bounds(
    server: ServerProcess, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    verify = orjson.dumps({"requests": [{"verifier": "format", "response": "x" * 20_000}]})
    headers = {
        token: {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        for token in (TOKEN_A, TOKEN_B)
    }
    post = httpx.AsyncClient(base_url=server.url, timeout=DEADLINE_S)
    async with stream(server, TOKEN_A) as a1, stream(server, TOKEN_A) as a2, post:
        await hold_80_kib(a1, a2, gate)
        over = await post.post("/v1/verify", content=verify, headers=headers[TOKEN_A])
        assert over.status_code == 429 and over.headers["retry-after"] == "1", over.text
        error = over.json()["error"]
        assert error["kind"] == "overloaded" and "limits.max_queued_bytes_per_tenant" in error["message"]
        other = await post.post("/v1/verify", content=verify, headers=headers[TOKEN_B])
        assert other.status_code == 200, other.text  # another token's room is its own

        gate.touch()
        await all_answered(a1, a2)
        again = await post.post("/v1/verify", content=verify, headers=headers[TOKEN_A])
        assert again.status_code == 200, again.text
        (verified,) = again.json()["results"]
        assert not verified["is_error"], verified


def test_a_bound_below_the_request_size_is_a_config_error() -> None:
    from tool_server.api.queued_bytes import QueuedBytes
    from tool_server.config import ConfigError, config_from_dict

    config = config_from_dict({"limits": {**LIMITS, "max_queued_bytes_per_connection": 16 * KIB}}, environ={})
    with pytest.raises(
        ConfigError, match="max_queued_bytes_per_connection .* at least limits.max_request_bytes"
    ):
        QueuedBytes(config.limits)


def mcp_gated(gate: Path, pad: int, call_id: str) -> tuple[bytes, dict[str, str]]:
    """A raw MCP ``tools/call`` of the gated tool (2026-07-28, stateless) and its headers."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
        "toolfactory/call_id": call_id,
    }
    params = {"name": "gated", "arguments": {"gate": str(gate), "pad": "x" * pad}, "_meta": meta}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "gated",
    }
    return orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}), headers


async def test_mcp_requests_take_their_room_from_the_same_bounds(
    server: ServerProcess, tmp_path: Path
) -> None:
    """An MCP POST is held from admission until answered like a calls body: past the token's
    share it is refused whole (429, a JSON-RPC error, Retry-After); what was admitted runs."""
    gate = tmp_path / "gate"
    auth = {token: {"Authorization": f"Bearer {token}"} for token in (TOKEN_A, TOKEN_B)}
    post = httpx.AsyncClient(base_url=server.url, timeout=DEADLINE_S)
    async with stream(server, TOKEN_A) as a1, stream(server, TOKEN_A) as a2, post:
        await hold_80_kib(a1, a2, gate)
        body, headers = mcp_gated(gate, 20_000, uuid.uuid4().hex)
        over = await post.post("/mcp/test", content=body, headers={**headers, **auth[TOKEN_A]})
        assert over.status_code == 429 and over.headers["retry-after"] == "1", over.text
        assert "limits.max_queued_bytes_per_tenant" in over.json()["error"]["message"]
        # another token's MCP call fits, and holds its room while it waits at the gate
        body, headers = mcp_gated(gate, 20_000, uuid.uuid4().hex)
        waiting = asyncio.create_task(
            post.post("/mcp/test", content=body, headers={**headers, **auth[TOKEN_B]})
        )
        await calls_started(gate, 5)
        over_all = await post.post(
            "/v1/calls",
            content=gated_body(gate, 31_000),
            headers={**auth[TOKEN_B], "Content-Type": "application/json"},
        )
        assert (
            over_all.status_code == 429 and "limits.max_queued_bytes)" in over_all.json()["error"]["message"]
        )

        gate.touch()
        answered = await waiting
        assert answered.status_code == 200 and answered.json()["result"]["structuredContent"]["passed"], (
            answered.text
        )
        await all_answered(a1, a2)
        body, headers = mcp_gated(gate, 20_000, uuid.uuid4().hex)  # the room is back
        again = await post.post("/mcp/test", content=body, headers={**headers, **auth[TOKEN_A]})
        assert again.status_code == 200 and "result" in again.json(), again.text
