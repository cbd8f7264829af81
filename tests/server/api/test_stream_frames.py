"""``/v1/stream``'s frames as the server reads them (api/ws_frames.py ``GuardedWebSocketProtocol``):
however TCP cuts them, with pings, fragments and protocol errors, against real servers.

The server reads the frames a client sends one message at a time itself and gives anything else
to websockets' parser; these tests hold it to what websockets and uvicorn did: every frame answered
once and in order, pings answered, errors closed with websockets' codes, a client that reads no
answers read no further. A raw socket client speaks the frames websockets' client would not send.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import os
import socket
import struct
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.asyncio.client import connect
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri
from websockets.utils import apply_mask

from tests.support.processes import started
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config
from tool_server.api.ws_frames import GuardedWebSocketProtocol, at_frame_boundary, frame_header

REPO = Path(__file__).resolve().parents[3]
NOTEBOOK = REPO / "tests" / "support" / "notebook_upstream.py"  # an MCP server that can come up late
MAX_FRAME_BYTES = 256 * 1024
TOOLS: list[dict[str, Any]] = [
    *BASE_TOOLS,
    {"target": "tests.support.stateful_tools:tally", "toolsets": ["test"]},
]
TEXT, BINARY, CLOSE, PING, PONG = 1, 2, 8, 9, 10


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with running_server(server_config(tools=TOOLS, limits={"max_request_bytes": MAX_FRAME_BYTES})) as srv:
        yield srv


def call(name: str = "echo", **arguments: Any) -> dict[str, Any]:
    return {"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments}


def calls_frame(*calls: dict[str, Any]) -> bytes:
    return orjson.dumps({"calls": list(calls)})


def client_frame(
    payload: bytes, opcode: int = TEXT, *, fin: bool = True, rsv: int = 0, mask: bool = True
) -> bytes:
    """A client frame, masked unless told otherwise (RFC 6455 5.2), any bits as given."""
    size = len(payload)
    if size < 126:
        length = bytes([size])
    elif size < 1 << 16:
        length = bytes([126]) + struct.pack("!H", size)
    else:
        length = bytes([127]) + struct.pack("!Q", size)
    first = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    if not mask:
        return first + length + payload
    key = os.urandom(4)
    return first + bytes([length[0] | 0x80]) + length[1:] + key + apply_mask(payload, key)


class RawStream:
    """A WebSocket client on a plain socket: sends the bytes it is given, reads server frames."""

    def __init__(self, srv: ServerProcess | str, buffer_bytes: int = 0) -> None:
        url = srv if isinstance(srv, str) else srv.url
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.socket()
        if buffer_bytes:  # small kernel buffers: the client's side holds little of what is in flight
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        self.sock.settimeout(60)
        self.sock.connect((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /v1/stream HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._fill()
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        return taken

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, *, answer_pings: bool = True) -> tuple[int, bytes]:
        """The next server frame (opcode, payload); pings are answered and skipped unless told."""
        while True:
            first, second = self._take(2)
            assert not second & 0x80, "a server frame is never masked"
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", self._take(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", self._take(8))
            opcode, payload = first & 0x0F, self._take(size)
            if opcode == PING and answer_pings:
                self.send(client_frame(payload, PONG))
                continue
            return opcode, payload

    def results(self) -> list[dict[str, Any]]:
        opcode, payload = self.read()
        assert opcode in (TEXT, BINARY), (opcode, payload)
        return orjson.loads(payload)["results"]

    def close_code(self) -> int:
        """Read until the server's close frame (pings unanswered); its code."""
        while True:
            opcode, payload = self.read(answer_pings=False)
            if opcode == CLOSE:
                return struct.unpack("!H", payload[:2])[0]

    def close(self) -> None:
        self.sock.close()


def echoed(results: list[dict[str, Any]], sent: dict[str, Any]) -> bool:
    (result,) = results
    return result["call_id"] == sent["call_id"] and result["structured"]["text"] == sent["arguments"]["text"]


# ------------------------------------------------------------------ however TCP cuts the frames


def test_frames_however_tcp_cuts_them_are_each_answered_once_in_order(server: ServerProcess) -> None:
    stream = RawStream(server)
    try:
        cut = call(text="cut in pieces")
        data = client_frame(calls_frame(cut))
        for piece in (data[:1], data[1:2], data[2:5], data[5:-1], data[-1:]):  # the header itself cut
            stream.send(piece)
            time.sleep(0.05)  # separate reads (whatever the timing, each answer is checked)
        assert echoed(stream.results(), cut)
        together = [call(text=f"together {i}") for i in range(3)]
        stream.send(b"".join(client_frame(calls_frame(c), BINARY) for c in together))
        assert [stream.results()[0]["call_id"] for _ in together] == [c["call_id"] for c in together]
        medium, large = call(text="m" * 1000), call(text="L" * 100_000)  # 16- and 64-bit lengths
        for sent in (medium, large):
            data = client_frame(calls_frame(sent))
            for start in range(0, len(data), 4096):
                stream.send(data[start : start + 4096])
            assert echoed(stream.results(), sent)
    finally:
        stream.close()


def test_a_call_sent_right_after_a_release_of_its_session_finds_it_released(server: ServerProcess) -> None:
    # The release runs in a task; the frame after it (an inline call, answered where it is
    # read) waits until that task has closed the session.
    session = "s-" + uuid.uuid4().hex
    stream = RawStream(server)
    try:
        stream.send(client_frame(calls_frame({**call(text="opens it"), "session": session})))
        assert stream.results()[0]["error"] is None
        late = {**call(text="too late"), "session": session}
        release = client_frame(orjson.dumps({"release": session}))
        stream.send(release + client_frame(calls_frame(late)))  # one write: read together
        assert orjson.loads(stream.read()[1]) == {"released": session}
        (refused,) = stream.results()
        assert refused["call_id"] == late["call_id"] and refused["error"]["kind"] == "unknown_session"
    finally:
        stream.close()


# ------------------------------------------------------------------ control frames and fragments


async def test_pings_pongs_and_fragmented_messages_are_answered(server: ServerProcess) -> None:
    url = server.url.replace("http://", "ws://") + "/v1/stream"
    async with connect(url, compression=None) as ws:
        latency = await asyncio.wait_for(await ws.ping(b"are you there"), 60)
        assert latency >= 0
        await ws.pong(b"unsolicited")  # ignored
        parts = call(text="in two fragments")
        body = calls_frame(parts)
        await ws.send([body[:10], body[10:]])  # one message, two frames
        assert echoed(orjson.loads(await asyncio.wait_for(ws.recv(), 60))["results"], parts)
        after = call(text="one frame again")
        await ws.send(calls_frame(after))
        assert echoed(orjson.loads(await asyncio.wait_for(ws.recv(), 60))["results"], after)


def test_a_ping_between_fragments_is_answered_first(server: ServerProcess) -> None:
    stream = RawStream(server)
    try:
        sent = call(text="around a ping")
        body = calls_frame(sent)
        stream.send(client_frame(body[:7], TEXT, fin=False))
        stream.send(client_frame(b"between", PING))
        stream.send(client_frame(body[7:], 0))  # the continuation
        assert stream.read(answer_pings=False) == (PONG, b"between")
        assert echoed(stream.results(), sent)
        stream.send(client_frame(calls_frame(again := call(text="and on"))))
        assert echoed(stream.results(), again)
    finally:
        stream.close()


@pytest.mark.parametrize(
    ("what", "data", "code"),
    [
        ("a reserved bit set", client_frame(b"{}", TEXT, rsv=4), 1002),
        ("an unmasked frame", client_frame(b"{}", TEXT, mask=False), 1002),
        ("a reserved opcode", client_frame(b"{}", 3), 1002),
        ("a continuation with no message begun", client_frame(b"{}", 0), 1002),
        ("a ping of 126 bytes", client_frame(b"p" * 126, PING), 1002),
        ("a fragmented ping", client_frame(b"p", PING, fin=False), 1002),
        ("a text frame that is not UTF-8", client_frame(b'{"calls": "\xff"}', TEXT), 1007),
        # Its header is enough: the rest would not be read (and could reset the connection).
        (
            "a frame over limits.max_request_bytes",
            client_frame(b"x" * (MAX_FRAME_BYTES + 1), BINARY)[:1024],
            1009,
        ),
    ],
    # a masked frame is random: its own id would differ between pytest-xdist workers
    ids=lambda value: "frame" if isinstance(value, bytes) else None,
)
def test_a_protocol_error_closes_the_connection_with_websockets_code(
    server: ServerProcess, what: str, data: bytes, code: int
) -> None:
    stream = RawStream(server)
    try:
        stream.send(client_frame(calls_frame(ok := call(text="before"))))
        assert echoed(stream.results(), ok)
        stream.send(data)
        assert stream.close_code() == code, what
    finally:
        stream.close()
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200


def test_a_close_from_the_client_is_answered_with_a_close(server: ServerProcess) -> None:
    stream = RawStream(server)
    try:
        stream.send(client_frame(calls_frame(ok := call(text="then close"))))
        assert echoed(stream.results(), ok)
        stream.send(client_frame(struct.pack("!H", 1000) + b"done", CLOSE))
        assert stream.close_code() == 1000
    finally:
        stream.close()


# ------------------------------------------------------------------ the caller of a connection


async def test_a_scoped_streams_calls_see_the_tools_that_join_after_it_opened(tmp_path: Path) -> None:
    # The stream works out what its token may call once per connection: again when the
    # registry changes (an upstream's tools join the token's toolset as the upstream comes up).
    backend, token = tmp_path / "backend-up", "stream-scoped-token-0123456789"
    notes = {"command": sys.executable, "args": [str(NOTEBOOK), "--wait-for", str(backend)]}
    config = server_config(mcpServers={"notes": {**notes, "restart_backoff": [0.2, 0.5]}})
    with running_server(config, env={"TOOLFACTORY_TOKENS": f"{token}:default"}) as srv:
        bearer = {"Authorization": f"Bearer {token}"}
        url = srv.url.replace("http://", "ws://") + "/v1/stream"
        async with connect(url, additional_headers=bearer, compression=None) as ws:
            await ws.send(calls_frame(call("notes__read")))
            (early,) = orjson.loads(await asyncio.wait_for(ws.recv(), 60))["results"]
            assert early["error"]["kind"] == "unknown_tool"
            backend.touch()
            deadline = time.monotonic() + 60
            while True:  # until the upstream is up (its tools are in the registry)
                posted = httpx.post(
                    srv.url + "/v1/calls", json={"calls": [call("notes__read")]}, headers=bearer, timeout=30
                ).json()["results"][0]
                if posted["error"] is None:
                    break
                assert time.monotonic() < deadline, posted
                await asyncio.sleep(0.2)
            await ws.send(calls_frame(call("notes__read")))  # the same connection
            (later,) = orjson.loads(await asyncio.wait_for(ws.recv(), 60))["results"]
            assert later["error"] is None, later


# ------------------------------------------------------------------ flow control


def test_a_client_that_reads_no_answers_is_read_no_further(server: ServerProcess) -> None:
    """The answers it does not read fill the socket's buffers; then the server reads no more of
    its frames. (It used to read on until limits.max_calls_per_batch frames, 4,096 by default,
    waited to send their answers: here 4,096 answers of 64 KiB held in the server.)"""
    stream = RawStream(server, buffer_bytes=65536)
    text = "w" * 32768
    sent, ceiling = 0, 32 * 1024 * 1024  # ~10x what the kernel's buffers held here (3-4 MiB)
    stream.sock.settimeout(5)
    try:
        while sent < ceiling:
            try:
                stream.sock.sendall(client_frame(calls_frame(call(text=text)), BINARY))
            except TimeoutError:
                break  # the server stopped reading
            sent += len(text)
        assert sent < ceiling, f"the server read {sent} bytes of frames whose answers were not read"
    finally:
        stream.close()
    assert httpx.get(server.url + "/healthz", timeout=60).status_code == 200


# ------------------------------------------------------------------ keepalive, and other servers

LAUNCH = """
import sys
from pathlib import Path
import uvicorn
from tool_server.api.connections import ConnectionLimits, guarded_protocol
from tool_server.api.ws_frames import guarded_websocket_protocol
from tool_server.app import create_app
from tool_server.config import load_config
config = load_config(Path(sys.argv[1]))
options = {"ws": "websockets-sansio"}  # uvicorn's own protocol: frames through ASGI receive()
if sys.argv[2] == "guarded":  # tool-server serve's protocols
    http = guarded_protocol(ConnectionLimits())
    options = {"http": http, "ws": guarded_websocket_protocol(http.guard)}
uvicorn.run(create_app(config, bind_host="127.0.0.1"), host="127.0.0.1", port=0, ws_max_size=MAX,
            ws_ping_interval=float(sys.argv[3]), ws_ping_timeout=float(sys.argv[4]),
            ws_per_message_deflate=False, **options)
"""


def launched(tmp_path: Path, protocols: str, ping_interval_s: float, ping_timeout_s: float) -> Any:
    """The app under uvicorn with the given WebSocket protocol and keepalive (not tool-server serve)."""
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(server_config(tools=TOOLS, limits={"max_request_bytes": MAX_FRAME_BYTES}))
    )
    script = LAUNCH.replace("MAX", str(MAX_FRAME_BYTES))
    cmd = [sys.executable, "-c", script, str(config), protocols, str(ping_interval_s), str(ping_timeout_s)]
    return started(cmd, ready_line=r"Uvicorn running on (http://\S+)", timeout_s=120, cwd=REPO)


async def test_keepalive_pings_answered_keep_a_stream_open_and_unanswered_ones_close_it(
    tmp_path: Path,
) -> None:
    with launched(tmp_path, "guarded", 0.2, 1.0) as process:
        url = process.match.group(1)
        async with connect(url.replace("http://", "ws://") + "/v1/stream", compression=None) as ws:
            await asyncio.sleep(3)  # about 15 pings, each answered by the client's pong
            await ws.send(calls_frame(sent := call(text="still open")))
            assert echoed(orjson.loads(await asyncio.wait_for(ws.recv(), 60))["results"], sent)
        silent = RawStream(url)
        try:
            assert silent.read(answer_pings=False)[0] == PING
            assert silent.close_code() == 1011  # keepalive ping timeout
        finally:
            silent.close()


async def test_the_stream_works_the_same_through_asgi_receive_on_uvicorns_own_protocol(
    tmp_path: Path,
) -> None:
    with launched(tmp_path, "uvicorn", 20.0, 20.0) as process:
        url = process.match.group(1).replace("http://", "ws://") + "/v1/stream"
        async with connect(url, compression=None) as ws:
            await ws.send(calls_frame(sent := call(text="through receive()")))
            assert echoed(orjson.loads(await asyncio.wait_for(ws.recv(), 60))["results"], sent)
            await ws.send(calls_frame(sent).decode())  # text in, text out; answered from the store
            assert isinstance(answer := await asyncio.wait_for(ws.recv(), 60), str)
            assert echoed(orjson.loads(answer)["results"], sent)
            slow, fast = call("sleep", seconds=1.0), call(text="not behind the sleep")
            await ws.send(calls_frame(slow))
            await ws.send(calls_frame(fast))
            order = [
                orjson.loads(await asyncio.wait_for(ws.recv(), 60))["results"][0]["call_id"] for _ in range(2)
            ]
            assert order == [fast["call_id"], slow["call_id"]]
            session = "s-" + uuid.uuid4().hex
            tallies = [
                {**call("tally", pause_s=0.2 if i == 0 else 0.0), "session": session} for i in range(4)
            ]
            for t in tallies:
                await ws.send(calls_frame(t))
            counts = {}
            for _ in tallies:
                (result,) = orjson.loads(await asyncio.wait_for(ws.recv(), 60))["results"]
                counts[result["call_id"]] = result["structured"]["count"]
            assert [counts[t["call_id"]] for t in tallies] == [1, 2, 3, 4]
            await ws.send(orjson.dumps({"release": session}))
            assert orjson.loads(await asyncio.wait_for(ws.recv(), 60)) == {"released": session}


# ------------------------------------------------------------------ the parts, in process


def handshaken() -> tuple[ServerProtocol, ClientProtocol]:
    """websockets' server and client protocols after an opening handshake."""
    client = ClientProtocol(parse_uri("ws://127.0.0.1/v1/stream"))
    client.send_request(client.connect())
    server = ServerProtocol(max_size=MAX_FRAME_BYTES)
    server.receive_data(b"".join(client.data_to_send()))
    (request,) = server.events_received()
    server.send_response(server.accept(request))
    client.receive_data(b"".join(server.data_to_send()))
    assert client.state is State.OPEN and server.state is State.OPEN
    return server, client


def test_at_frame_boundary_tells_where_websockets_parser_waits() -> None:
    server, client = handshaken()
    assert at_frame_boundary(server)
    client.send_text(b'{"calls": []}')
    data = b"".join(client.data_to_send())
    server.receive_data(data[:2])  # the header read, the mask awaited: the buffer is empty
    assert not server.reader.buffer and not at_frame_boundary(server)
    server.receive_data(data[2:])
    assert [e.opcode for e in server.events_received()] == [Opcode.TEXT] and at_frame_boundary(server)
    client.send_text(b"first part", fin=False)
    server.receive_data(b"".join(client.data_to_send()))
    assert not at_frame_boundary(server)  # a fragmented message begun
    client.send_continuation(b" and the rest", fin=True)
    server.receive_data(b"".join(client.data_to_send()))
    assert at_frame_boundary(server)


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_frame_header_is_what_websockets_writes(size: int) -> None:
    data = b"a" * size
    for text in (True, False):
        opcode = Opcode.TEXT if text else Opcode.BINARY
        assert frame_header(data, text) + data == Frame(opcode, data).serialize(mask=False)


def test_uvicorn_and_websockets_internals_the_frames_rely_on() -> None:
    """GuardedWebSocketProtocol subclasses uvicorn's websockets-sansio protocol and reads
    websockets' parser state: fail loudly if either changes."""
    for hook in (
        "connection_made",
        "connection_lost",
        "data_received",
        "handle_connect",
        "send_receive_event_to_app",
        "pause_writing",
        "resume_writing",
        "shutdown",  # drained, not closed at once
    ):
        assert callable(getattr(WebSocketsSansIOProtocol, hook, None)), hook
        assert hook in GuardedWebSocketProtocol.__dict__, hook
    source = inspect.getsource(WebSocketsSansIOProtocol)
    for used in (
        "self.frames = [event.data]",
        'self.curr_msg_data_type = "text"',
        "self.close_sent = True",
        "self.disconnected = True",
        "def handle_pong(self, event: Frame)",
        "def handle_parser_exception(self)",
        '"extensions": {"websocket.http.response": {}}',
        "self.response = self.conn.accept(event)",
        'self.queue.put_nowait({"type": "websocket.disconnect", "code": 1012})',  # shutdown
        "def stop_keepalive(self)",
        "self.config = config",  # timeout_graceful_shutdown, the drain's limit
    ):
        assert used in source, used
    server, _ = handshaken()
    assert server.max_message_size == MAX_FRAME_BYTES
    assert isinstance(server.reader.buffer, bytearray)  # cleared when the connection is lost
