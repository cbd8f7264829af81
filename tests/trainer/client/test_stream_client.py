"""StreamClient against real servers on loopback, through a TCP proxy the tests can cut."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from websockets.asyncio.server import ServerConnection, serve

from protocol import Call, ErrorKind, ProtocolError, new_call_id, new_session_id
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config
from trainer_client.client import StreamClient as Exported
from trainer_client.client.stream import StreamClient, StreamClosed, stream_url

TOKEN = "stream-client-token-0123456789"
TOOLS = [
    *BASE_TOOLS,
    {"target": "tools.testing:tick", "toolsets": ["test"]},
    {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]},
]


MAX_FRAME_BYTES = 65536


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    config = server_config(tools=TOOLS, limits={"max_request_bytes": MAX_FRAME_BYTES})
    with running_server(config, env={"TOOLFACTORY_TOKENS": TOKEN}) as srv:
        yield srv


def port_of(srv: ServerProcess) -> int:
    return int(srv.url.rsplit(":", 1)[1])


class Proxy:
    """A TCP forwarder to a server: ``cut()`` drops every connection through it at once (no
    close frame: the network failed), ``target`` says where new connections go."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.links: list[asyncio.StreamWriter] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        for writer in self.links:
            writer.transport.abort()
        self.links.clear()

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self.links += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def wait_for_file(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)


def test_urls_and_the_package_export() -> None:
    assert Exported is StreamClient
    assert stream_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/v1/stream"
    assert stream_url("https://tools.internal/") == "wss://tools.internal/v1/stream"
    assert stream_url("ws://h:1/v1/stream") == "ws://h:1/v1/stream"
    with pytest.raises(ValueError, match="http"):
        stream_url("tools.internal:8000")


async def test_call_call_many_and_release(server: ServerProcess) -> None:
    session = new_session_id()
    async with StreamClient(server.url, token=TOKEN) as client:
        assert (await client.call("calculator", {"expression": "6*7"})).structured["result"] == 42
        calls = [
            Call(new_call_id(), "echo", {"text": "a"}),
            Call(new_call_id(), "no_such_tool", {}),
            Call(new_call_id(), "notebook", {"put": "line"}, session),
        ]
        results = await client.call_many(calls)
        assert [r.call_id for r in results] == [c.call_id for c in calls]
        assert results[0].structured["text"] == "a"
        assert results[1].error.kind == ErrorKind.UNKNOWN_TOOL
        assert results[2].structured["lines"] == ["line"]
        assert await client.release(session) is True
        assert await client.release(session) is False  # closed already
        gone = await client.call("notebook", {"put": "late"}, session=session)
        assert gone.error.kind == ErrorKind.UNKNOWN_SESSION
        with pytest.raises(ValueError, match="name"):
            await client.call_many([Call(new_call_id(), "", {})])  # refused before it is sent


async def test_many_calls_in_flight_on_one_connection(server: ServerProcess) -> None:
    async with StreamClient(server.url, token=TOKEN) as client:
        results = await asyncio.gather(*(client.call("echo", {"text": str(i)}) for i in range(300)))
        slow = asyncio.create_task(client.call("sleep", {"seconds": 3.0}))
        fast = await client.call("echo", {"text": "overtakes"})
        assert not slow.done() and fast.structured["text"] == "overtakes"
        assert not (await slow).is_error
    assert [r.structured["text"] for r in results] == [str(i) for i in range(300)]


async def test_calls_refused_before_sending_name_what_is_wrong(server: ServerProcess) -> None:
    async with StreamClient(server.url, token=TOKEN) as client:
        with pytest.raises(ProtocolError, match=r"calls\[1\]\.arguments must be an object"):
            await client.call_many([Call(new_call_id(), "echo", {}), Call(new_call_id(), "echo", [1])])  # type: ignore[arg-type]
        with pytest.raises(ProtocolError, match=r"calls\[0\]\.call_id must be a non-empty string"):
            await client.call_many([Call("x" * 257, "echo", {})])
        twice = new_call_id()
        with pytest.raises(ValueError, match="used twice"):
            await client.call_many([Call(twice, "echo", {}), Call(twice, "echo", {})])
        waiting = asyncio.create_task(client.call_many([Call(twice, "sleep", {"seconds": 0.5})]))
        while twice not in client._pending:
            await asyncio.sleep(0.01)
        with pytest.raises(ValueError, match="used twice"):
            await client.call_many([Call(twice, "echo", {})])  # the same id while it is in flight
        (slept,) = await waiting
        assert not slept.is_error
        # arguments None is an empty object, as the server reads it
        (echo,) = await client.call_many([Call(new_call_id(), "echo", None)])  # type: ignore[arg-type]
        assert echo.error is None or echo.error.kind != ErrorKind.BAD_REQUEST


async def test_frames_sent_in_one_turn_of_the_loop_go_out_in_one_write(server: ServerProcess) -> None:
    async with StreamClient(server.url, token=TOKEN) as client:
        await client.call("echo", {"text": "warm"})
        assert client._ws is not None
        transport = client._ws.transport
        writes: list[bytes] = []
        write = transport.write

        def counted(data: bytes) -> None:
            writes.append(bytes(data))
            write(data)

        transport.write = counted  # type: ignore[method-assign]
        try:
            results = await asyncio.gather(*(client.call("echo", {"text": str(i)}) for i in range(50)))
        finally:
            transport.write = write  # type: ignore[method-assign]
    assert [r.structured["text"] for r in results] == [str(i) for i in range(50)]
    assert len(writes) == 1  # 50 frames, one write: one system call, not 50


async def test_fragmented_and_malformed_answers() -> None:
    """A server may fragment a message (WebSocket allows it; tool-server does not): it is read
    as a whole. An answer the client cannot read is logged and the connection goes on."""

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            (call,) = orjson.loads(frame)["calls"]
            answer = orjson.dumps(
                {"results": [{"call_id": call["call_id"], "structured": call["arguments"]}]}
            )
            text = call["arguments"]["text"]
            if text == "fragmented":
                await ws.send([answer[:10], answer[10:]])  # two frames, one message
            elif text == "after a malformed answer":
                await ws.send(b'{"results": [1, "two"]}')  # items that are not results
                await ws.send(answer)
            else:
                await ws.send(answer)

    async with serve(handler, "127.0.0.1", 0, compression=None) as fake:
        port = fake.sockets[0].getsockname()[1]
        async with StreamClient(f"http://127.0.0.1:{port}", timeout_s=30) as client:
            for text in ("whole", "fragmented", "after a malformed answer", "whole again"):
                result = await client.call("echo", {"text": text})
                assert result.structured == {"text": text}


async def test_a_dropped_connection_is_reconnected_and_the_call_resent_without_running_twice(
    server: ServerProcess, tmp_path: Path
) -> None:
    ticks = tmp_path / "ticks"
    async with Proxy(port_of(server)) as proxy, StreamClient(proxy.url, token=TOKEN) as client:
        call = Call(new_call_id(), "tick", {"path": str(ticks), "seconds": 1.0})
        pending = asyncio.create_task(client.call_many([call]))
        await wait_for_file(ticks)  # the tool has done its side effect and sleeps
        proxy.cut()
        (result,) = await pending  # resent with its call_id on a new connection: joined there
        assert not result.is_error and result.structured == {"call_id": call.call_id}
        assert (await client.call("echo", {"text": "after"})).structured["text"] == "after"
    (line,) = ticks.read_text().splitlines()  # it ran once
    assert line.startswith(call.call_id)


async def test_a_restarted_server_is_told_apart_and_nothing_runs_twice(tmp_path: Path) -> None:
    ticks = tmp_path / "ticks"
    config = server_config(tools=TOOLS)
    with running_server(config) as first, running_server(config) as second:
        async with Proxy(port_of(first)) as proxy, StreamClient(proxy.url) as client:
            session = new_session_id()
            assert not (await client.call("notebook", {"put": "x"}, session=session)).is_error
            before = client.instance
            pending = asyncio.create_task(client.call("tick", {"path": str(ticks), "seconds": 2.0}))
            await wait_for_file(ticks)
            proxy.target = port_of(second)  # "the server restarted": another process, same address
            proxy.cut()
            result = await pending
            assert result.error.kind == ErrorKind.OUTCOME_UNKNOWN and "may or may not have run" in result.text
            assert client.instance != before
            lost = await client.call("notebook", {"put": "y"}, session=session)
            assert lost.error.kind == ErrorKind.UNKNOWN_SESSION and "state is lost" in lost.text
            fresh = await client.call("notebook", {"put": "z"}, session=new_session_id())
            assert fresh.structured["lines"] == ["z"]
    assert len(ticks.read_text().splitlines()) == 1  # not resent to the second process


async def test_overloaded_calls_are_retried() -> None:
    config = server_config(limits={"max_concurrency": 1, "max_queue": 1})
    with running_server(config) as srv:
        async with StreamClient(srv.url, backoff_s=0.1) as client:
            holding = asyncio.create_task(
                client.call_many([Call(new_call_id(), "sleep", {"seconds": 3.0}) for _ in range(2)])
            )
            while httpx.get(srv.url + "/readyz", timeout=30).json()["in_flight"] < 2:
                await asyncio.sleep(0.02)
            result = await client.call("echo", {"text": "let in later"})
            assert result.structured["text"] == "let in later"
            assert not any(r.is_error for r in await holding)
        assert rejected_frames(srv) >= 1  # the echo was refused at least once, then let in


def rejected_frames(srv: ServerProcess) -> float:
    metrics = httpx.get(srv.url + "/metrics", timeout=30).text
    (line,) = [m for m in metrics.splitlines() if m.startswith("toolfactory_rejected_batches_total ")]
    return float(line.split()[1])


async def test_a_frame_over_the_size_limit_ends_its_calls_and_the_others_go_on(server: ServerProcess) -> None:
    async with StreamClient(server.url, token=TOKEN) as client:
        slow = asyncio.create_task(client.call("sleep", {"seconds": 1.0}))
        big = await client.call("echo", {"text": "x" * MAX_FRAME_BYTES})
        assert big.error.kind == ErrorKind.TOO_LARGE and str(MAX_FRAME_BYTES) in big.text
        assert not (await slow).is_error  # on the connection the server closed: resent, joined
        assert (await client.call("echo", {"text": "small"})).structured["text"] == "small"


async def test_deadlines_refusals_and_a_closed_client(server: ServerProcess) -> None:
    with pytest.raises(StreamClosed, match="401"):
        await StreamClient(server.url, token="not-the-token-0123456789").connect()
    client = StreamClient(server.url, token=TOKEN)
    await client.connect()
    late = await client.call("sleep", {"seconds": 5.0}, timeout_s=0.2)
    assert late.error.kind == ErrorKind.TIMEOUT
    pending = asyncio.create_task(client.call("sleep", {"seconds": 5.0}))
    await asyncio.sleep(0.2)
    await client.aclose()
    with pytest.raises(StreamClosed, match="closed with this call in flight"):
        await pending
    with pytest.raises(StreamClosed, match="is closed"):
        await client.call("echo")
