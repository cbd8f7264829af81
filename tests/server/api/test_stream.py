"""``/v1/stream``: calls over one WebSocket, against real servers (uvicorn subprocesses).

The raw ``websockets`` client speaks the frames here, as any client would; the trainer's
``StreamClient`` has its own tests (tests/trainer/client/test_stream_client.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config

TOKEN_A = "stream-tenant-a-0123456789"
TOKEN_B = "stream-tenant-b-0123456789"
MAX_FRAME_BYTES = 65536
MAX_IN_FLIGHT = 4  # limits.max_calls_per_batch: frames in flight on one connection
HANG_TIMEOUT_S = 5  # the `sleep` tool's timeout on the first server
TOOLS: list[dict[str, Any]] = [
    *(t for t in BASE_TOOLS if t["target"] != "tools.testing:sleep"),
    {"target": "tools.testing:sleep", "toolsets": ["test"], "timeout_s": HANG_TIMEOUT_S},
    {"target": "tools.testing:tick", "toolsets": ["test"]},
    {"target": "tests.support.stateful_tools:tally", "toolsets": ["test"]},
    {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]},
    {"target": "tests.support.faulty_tools:faulty_async", "toolsets": ["test"]},
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """Two tenants; small frame and in-flight limits, so that tests can reach them."""
    config = server_config(
        tools=TOOLS,
        limits={"max_request_bytes": MAX_FRAME_BYTES, "max_calls_per_batch": MAX_IN_FLIGHT},
    )
    with running_server(config, env={"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def open_server() -> Iterator[ServerProcess]:
    """No tokens (loopback only): the Origin check is all that keeps web pages out. Room for
    two calls in all, so that a frame can find the server overloaded."""
    with running_server(server_config(limits={"max_concurrency": 1, "max_queue": 1})) as srv:
        yield srv


def stream_url(srv: ServerProcess) -> str:
    return srv.url.replace("http://", "ws://") + "/v1/stream"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def stream(srv: ServerProcess, token: str | None = TOKEN_A, **options: Any) -> Any:
    headers = {**(auth(token) if token else {}), **options.pop("headers", {})}
    return connect(stream_url(srv), additional_headers=headers, compression=None, **options)


def call(name: str, arguments: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "call_id": fields.pop("call_id", uuid.uuid4().hex),
        "name": name,
        "arguments": arguments or {},
        **fields,
    }


def frame(*calls: dict[str, Any]) -> bytes:
    return orjson.dumps({"calls": list(calls)})


async def answer(ws: ClientConnection) -> dict[str, Any]:
    return orjson.loads(await asyncio.wait_for(ws.recv(), 60))


async def results_by_id(ws: ClientConnection, count: int) -> dict[str, dict[str, Any]]:
    """The next ``count`` results, whatever frames they come in, by call_id."""
    found: dict[str, dict[str, Any]] = {}
    while len(found) < count:
        for result in (await answer(ws))["results"]:
            found[result["call_id"]] = result
    return found


def in_flight(srv: ServerProcess, token: str | None = TOKEN_A) -> int:
    """Calls the server has admitted and not finished (``/readyz``, for a token of every toolset)."""
    return httpx.get(srv.url + "/readyz", headers=auth(token) if token else None, timeout=30).json()[
        "in_flight"
    ]


def wait_until(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def metric(srv: ServerProcess, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", headers=auth(TOKEN_A), timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


# ------------------------------------------------------------------ the same answers as POST


async def test_a_call_over_the_stream_answers_the_bytes_post_would(server: ServerProcess) -> None:
    posted = call("echo", {"text": "over http first"})
    first = httpx.post(server.url + "/v1/calls", json={"calls": [posted]}, headers=auth(TOKEN_A), timeout=30)
    streamed = call("echo", {"text": "over the stream first"})
    async with stream(server) as ws:
        assert ws.response.headers["x-toolfactory-instance"] == first.headers["x-toolfactory-instance"]
        await ws.send(frame(posted))  # the same call_id again: answered from the store
        assert await ws.recv() == first.content
        await ws.send(frame(streamed))
        fresh = await ws.recv()
        await ws.send(frame(streamed).decode())  # a text frame is answered with a text frame
        again = await ws.recv()
    assert isinstance(again, str) and again.encode() == fresh
    second = httpx.post(
        server.url + "/v1/calls", json={"calls": [streamed]}, headers=auth(TOKEN_A), timeout=30
    )
    assert second.content == fresh
    (result,) = orjson.loads(fresh)["results"]
    assert result["structured"] == {"text": "over the stream first", "data": None} and not result["is_error"]


async def test_frames_run_concurrently_and_answers_are_matched_by_call_id(server: ServerProcess) -> None:
    slow = call("sleep", {"seconds": 3.0})
    fast = [call("echo", {"text": str(i)}) for i in range(3)]
    async with stream(server) as ws:
        await ws.send(frame(slow))
        for c in fast:
            await ws.send(frame(c))
        order = []
        for _ in range(4):
            order += [r["call_id"] for r in (await answer(ws))["results"]]
    assert order[-1] == slow["call_id"]  # sent first, answered last: nothing waited for it
    assert sorted(order[:3]) == sorted(c["call_id"] for c in fast)


async def test_calls_of_one_session_run_in_the_order_of_their_frames(server: ServerProcess) -> None:
    # tally reads its count, pauses, writes it back: calls that overlapped would lose updates,
    # and the first (the slowest) would finish last.
    session = "s-order-" + uuid.uuid4().hex
    calls = [
        call("tally", {"pause_s": 0.3 if i == 0 else 0.0}, session=session) for i in range(2 * MAX_IN_FLIGHT)
    ]
    async with stream(server) as ws:
        for c in calls:
            await ws.send(frame(c))
        found = await results_by_id(ws, len(calls))
    counts = [found[c["call_id"]]["structured"]["count"] for c in calls]
    assert counts == list(range(1, len(calls) + 1))
    assert found[calls[-1]["call_id"]]["structured"]["order"] == [c["call_id"] for c in calls]


# ------------------------------------------------------------------ bad frames and limits


async def test_a_bad_frame_gets_an_error_frame_and_the_connection_stays_open(server: ServerProcess) -> None:
    async with stream(server) as ws:
        for bad in [b"not json", b'{"calls": "no"}', b"[1, 2]", b'{"calls": [{"name": "echo"}]}']:
            await ws.send(bad)
            error = (await answer(ws))["error"]
            assert error["kind"] == "bad_request" and '{"release": "<session id>"}' in error["message"]
        await ws.send(b'{"release": 7}')
        assert (await answer(ws))["error"]["kind"] == "bad_request"
        too_many = [call("echo") for _ in range(MAX_IN_FLIGHT + 1)]
        await ws.send(frame(*too_many))
        refused = (await answer(ws))["results"]
        assert [r["call_id"] for r in refused] == [c["call_id"] for c in too_many]
        assert {r["error"]["kind"] for r in refused} == {"too_large"}
        await ws.send(frame(ok := call("echo", {"text": "still here"})))
        assert (await answer(ws))["results"][0]["call_id"] == ok["call_id"]


async def test_a_frame_over_the_request_size_limit_closes_with_1009(server: ServerProcess) -> None:
    async with stream(server) as ws:
        await ws.send(frame(call("echo", {"text": "x" * MAX_FRAME_BYTES})))
        with pytest.raises(ConnectionClosed) as closed:
            await answer(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert str(MAX_FRAME_BYTES) in closed.value.rcvd.reason
    async with stream(server) as ws:  # the server goes on
        await ws.send(frame(call("echo")))
        assert not (await answer(ws))["results"][0]["is_error"]


async def test_at_most_max_calls_per_batch_frames_are_in_flight_on_a_connection(
    server: ServerProcess,
) -> None:
    wait_until(lambda: in_flight(server) == 0, "no call in flight")
    sent = [call("sleep", {"seconds": 1.0}) for _ in range(MAX_IN_FLIGHT + 3)]
    async with stream(server) as ws:
        for c in sent:
            await ws.send(frame(c))
        receiving = asyncio.create_task(results_by_id(ws, len(sent)))
        seen = []
        while not receiving.done():
            seen.append(await asyncio.to_thread(in_flight, server))
        found = await receiving
    assert set(found) == {c["call_id"] for c in sent} and not any(r["is_error"] for r in found.values())
    assert max(seen) == MAX_IN_FLIGHT, seen  # the others were not read until one was answered


async def test_stream_connections_count_as_open_connections(server: ServerProcess) -> None:
    before = metric(server, "toolfactory_connections_open")
    sockets = [await stream(server) for _ in range(3)]
    try:
        assert metric(server, "toolfactory_connections_open") >= before + 3
    finally:
        for ws in sockets:
            await ws.close()
    wait_until(lambda: metric(server, "toolfactory_connections_open") <= before, "the count to drop")


# ------------------------------------------------------------------ refused at the handshake


async def refusal(srv: ServerProcess, token: str | None, **options: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(InvalidStatus) as refused:
        await stream(srv, token, **options)
    response = refused.value.response
    return response.status_code, orjson.loads(response.body)


async def test_no_token_or_a_wrong_one_is_refused_at_the_handshake(server: ServerProcess) -> None:
    status, body = await refusal(server, None)
    assert status == 401 and body["error"]["kind"] == "unauthorized"
    assert "Authorization: Bearer" in body["error"]["message"]
    status, body = await refusal(server, "not-a-token-of-this-server")
    assert status == 401 and body["error"]["kind"] == "unauthorized"


async def test_a_foreign_origin_or_host_is_refused_at_the_handshake(server: ServerProcess) -> None:
    status, body = await refusal(server, TOKEN_A, origin="https://evil.example")
    assert status == 403 and "evil.example" in body["error"]["message"]
    port = int(server.url.rsplit(":", 1)[1])
    with pytest.raises(InvalidStatus) as refused:  # DNS rebinding: another name for this address
        await connect(
            f"ws://rebound.example:{port}/v1/stream",
            host="127.0.0.1",
            port=port,
            additional_headers=auth(TOKEN_A),
        )
    assert refused.value.response.status_code == 421


async def test_a_page_of_another_site_cannot_open_the_stream_of_a_server_without_tokens(
    open_server: ServerProcess,
) -> None:
    # Cross-site WebSocket hijacking: a browser sends the page's Origin, and nothing else tells
    # the page apart from a real client here.
    for origin in ["https://evil.example", "null"]:
        status, body = await refusal(open_server, None, origin=origin)
        assert status == 403 and body["error"]["kind"] == "bad_request"
    async with stream(open_server, None, origin=open_server.url) as ws:  # the server's own pages may
        await ws.send(frame(call("echo")))
        assert not (await answer(ws))["results"][0]["is_error"]


async def test_a_plain_get_of_the_stream_says_it_is_a_websocket(open_server: ServerProcess) -> None:
    response = httpx.get(open_server.url + "/v1/stream", timeout=30)
    assert response.status_code == 426 and "WebSocket" in response.json()["error"]["message"]


# ------------------------------------------------------------------ tenants, sessions, fencing


async def test_another_tenant_cannot_use_a_session_or_a_kept_result(server: ServerProcess) -> None:
    session = "s-iso-" + uuid.uuid4().hex
    secret = call("notebook", {"put": "A-secret"}, session=session)
    counted = call("count", {"key": "iso-" + uuid.uuid4().hex})
    async with stream(server, TOKEN_A) as a, stream(server, TOKEN_B) as b:
        await a.send(frame(secret, counted))
        mine = await results_by_id(a, 2)
        assert mine[secret["call_id"]]["structured"]["lines"] == ["A-secret"]
        await b.send(frame(secret))  # A's call exactly: same call_id, session and arguments
        stolen = (await answer(b))["results"][0]
        assert (
            stolen["error"]["kind"] == "unknown_session" and "A-secret" not in orjson.dumps(stolen).decode()
        )
        await b.send(frame(counted))  # A's call_id: a new call for B, not A's kept result
        assert (await answer(b))["results"][0]["structured"]["count"] == mine[counted["call_id"]][
            "structured"
        ]["count"] + 1
        await b.send(orjson.dumps({"release": session}))
        assert await answer(b) == {
            "error": {
                "kind": "unknown_session",
                "message": f"no open session {session!r} (expired, released, or not yours)",
            },
            "release": session,
        }
        await a.send(frame(call("notebook", {"put": "again"}, session=session)))
        assert (await answer(a))["results"][0]["structured"]["lines"] == ["A-secret", "again"]
        await a.send(orjson.dumps({"release": session}))
        assert await answer(a) == {"released": session}


async def test_the_handshakes_instance_header_fences_every_frame(server: ServerProcess) -> None:
    gone = {"x-toolfactory-instance": "a-process-that-is-gone"}
    async with stream(server, headers=gone) as ws:
        for _ in range(2):
            await ws.send(frame(call("notebook", {"put": "x"}, session="s-fenced-" + uuid.uuid4().hex)))
            assert (await answer(ws))["results"][0]["error"]["kind"] == "unknown_session"
        await ws.send(frame(call("echo")))  # no session: nothing to fence
        assert not (await answer(ws))["results"][0]["is_error"]


# ------------------------------------------------------------------ failures stay results


async def test_a_tool_that_crashes_or_hangs_is_a_failure_result_and_the_connection_stays_open(
    server: ServerProcess,
) -> None:
    crash, exits, hang = (
        call("fail"),
        call("faulty_async", {"fault": "system_exit"}),
        call("sleep", {"seconds": 30}),
    )
    async with stream(server) as ws:
        await ws.send(frame(crash, exits))
        await ws.send(frame(hang))
        found = await results_by_id(ws, 3)
        await ws.send(frame(after := call("echo")))  # the same connection goes on
        assert (await answer(ws))["results"][0]["call_id"] == after["call_id"]
    assert found[crash["call_id"]]["error"]["kind"] == "tool_error"
    assert found[exits["call_id"]]["error"]["kind"] == "tool_error"
    assert found[hang["call_id"]]["error"]["kind"] == "timeout"


async def test_a_client_gone_mid_call_leaves_the_server_healthy_and_the_call_run_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    ticks = tmp_path / "ticks"
    ticking = call("tick", {"path": str(ticks), "seconds": 1.0})
    ws = await stream(server)
    await ws.send(frame(ticking))
    wait_until(ticks.exists, "the call to start")
    ws.transport.abort()  # gone without a close frame
    slow = await stream(server)
    await slow.send(frame(call("sleep", {"seconds": 1.0})))
    await slow.close()  # a clean close, mid-call
    async with stream(server) as again:  # the same call on a new connection: joined or replayed
        await again.send(frame(ticking))
        (result,) = (await answer(again))["results"]
    assert result["structured"] == {"call_id": ticking["call_id"]}
    assert len(ticks.read_text().splitlines()) == 1  # it ran once
    wait_until(lambda: in_flight(server) == 0, "the calls to end")
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
    assert "Traceback" not in server.output and "Exception in ASGI application" not in server.output


async def test_an_overloaded_frame_gets_an_overloaded_result_per_call(open_server: ServerProcess) -> None:
    holding = [call("sleep", {"seconds": 2.0}) for _ in range(2)]  # the server's whole capacity
    refused = [call("echo", {"text": str(i)}) for i in range(2)]
    async with stream(open_server, None) as ws:
        await ws.send(frame(*holding))
        await ws.send(frame(*refused))
        first = (await answer(ws))["results"]
        assert [r["call_id"] for r in first] == [c["call_id"] for c in refused]
        assert {r["error"]["kind"] for r in first} == {"overloaded"}
        assert all(not r["is_error"] for r in (await answer(ws))["results"])  # the sleeps
        await ws.send(frame(*refused))  # retried with the same call_ids: they run now
        assert all(not r["is_error"] for r in (await answer(ws))["results"])
