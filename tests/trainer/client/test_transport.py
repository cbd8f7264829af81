"""The batch POSTs' own HTTP/1.1 pool (``trainer_client.client.transport``) against real sockets:
a real tool server, and small scripted HTTP servers on loopback for the ways an answer can go
wrong. What the dispatcher needs of a failure is which of the three it was (nothing sent, no
answer in time, the connection broke after sending): the delivery rules hang on it."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import select
import shutil
import socket
import socketserver
import ssl
import struct
import subprocess
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from tests.support.server import running_server, server_config
from trainer_client.client.transport import AnswerTimeout, ConnectFailed, ConnectionBroken, Exchange, Pool

HEADERS = {"content-type": "application/json"}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]


@dataclass
class Scripted:
    """A loopback HTTP server whose ``handler`` answers each request (and says whether to keep
    the connection); counts connections, and the most open at once."""

    url: str
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    requests: list[bytes] = field(default_factory=list)


@contextlib.asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[Scripted]:
    state = Scripted("")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        state.open_now += 1
        state.most_open = max(state.most_open, state.open_now)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                state.requests.append(head + body)
                if not await handler(reader, writer, body):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            state.open_now -= 1
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/calls"
    try:
        yield state
    finally:
        server.close()


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", *headers]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def echo_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(answer(body, "content-type: application/json", "x-toolfactory-instance: abc"))
    return True


def free_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/calls"


def pool(**options: float) -> Pool:
    settings = {"max_connections": 8, "max_idle": 8, "keepalive_s": 5.0, **options}
    return Pool(**settings)  # type: ignore[arg-type]


async def test_a_real_server_answers_batches_on_one_kept_connection() -> None:
    with running_server() as server:
        http = pool()
        body = orjson.dumps(
            {"calls": [{"call_id": f"t-{i}", "name": "echo", "arguments": {"text": "hi"}} for i in range(3)]}
        )
        exchange = Exchange()
        answers = [
            await http.post(server.url + "/v1/calls", body, HEADERS, 30.0, exchange) for _ in range(20)
        ]
        await http.aclose()
    assert {a.status_code for a in answers} == {200}
    assert exchange.answering
    results = orjson.loads(answers[-1].content)["results"]
    assert [r["call_id"] for r in results] == ["t-0", "t-1", "t-2"]
    assert answers[0].headers["x-toolfactory-instance"]  # lower-case names, as httpx gives them
    assert http.open_connections == 0  # closed by aclose; 20 POSTs went over one connection:


async def test_sequential_posts_reuse_one_connection_and_concurrent_ones_respect_the_limit() -> None:
    async def slow_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        await asyncio.sleep(0.05)
        return await echo_body(reader, writer, body)

    async with scripted(slow_echo) as server:
        http = pool(max_connections=2)
        for i in range(5):
            assert (await http.post(server.url, b"%d" % i, HEADERS, 30.0)).content == b"%d" % i
        assert server.connections == 1
        bodies = [b"c%d" % i for i in range(10)]
        answers = await asyncio.gather(*(http.post(server.url, b, HEADERS, 30.0) for b in bodies))
        await http.aclose()
    assert [a.content for a in answers] == bodies
    assert server.most_open <= 2


async def test_an_idle_connection_is_not_reused_after_keepalive_s() -> None:
    """A server closes idle connections after its own keep-alive time; a request sent on one it
    is closing would be "maybe delivered", so the pool lets idle ones go well before that."""
    async with scripted(echo_body) as server:
        http = pool(keepalive_s=0.2)
        await http.post(server.url, b"1", HEADERS, 30.0)
        await asyncio.sleep(0.5)
        await http.post(server.url, b"2", HEADERS, 30.0)
        await http.aclose()
    assert server.connections == 2


async def test_a_refused_connection_is_connect_failed_and_nothing_was_sent() -> None:
    http = pool()
    with pytest.raises(ConnectFailed) as failed:
        await http.post(free_port_url(), b"{}", HEADERS, 30.0)
    assert not failed.value.timed_out
    assert "127.0.0.1" in str(failed.value)
    assert http.open_connections == 0


async def test_a_connection_closed_before_the_answer_is_broken() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        return False  # read the request, close without a word

    async with scripted(hang_up) as server:
        http = pool()
        with pytest.raises(ConnectionBroken, match="closed before the answer"):
            await http.post(server.url, b"{}", HEADERS, 30.0)
        assert http.open_connections == 0


async def test_a_truncated_answer_is_broken() -> None:
    async def truncated(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        writer.write(answer(b'{"results": [', "content-length: 100"))
        await writer.drain()
        return False

    async with scripted(truncated) as server:
        http = pool()
        with pytest.raises(ConnectionBroken):
            await http.post(server.url, b"{}", HEADERS, 30.0)


async def test_no_answer_in_time_is_a_timeout_and_the_connection_is_dropped() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        await asyncio.sleep(30)
        return False

    async with scripted(silent) as server:
        http = pool()
        with pytest.raises(AnswerTimeout, match="0.3 s"):
            await http.post(server.url, b"{}", HEADERS, 0.3)
        assert http.open_connections == 0  # its answer may still come: never reused


async def test_chunked_gzip_and_closing_answers_are_read() -> None:
    async def varied(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        if body == b"chunked":
            writer.write(answer(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "transfer-encoding: chunked"))
        elif body == b"gzip":
            writer.write(answer(gzip.compress(b"hello world"), "content-encoding: gzip"))
        else:
            writer.write(answer(b"hello world", "connection: close"))
            return False
        return True

    async with scripted(varied) as server:
        http = pool()
        answers = [
            await http.post(server.url, kind, HEADERS, 30.0) for kind in (b"chunked", b"gzip", b"close")
        ]
        after = await http.post(server.url, b"chunked", HEADERS, 30.0)
        await http.aclose()
    assert [a.content for a in answers] == [b"hello world"] * 3
    assert after.content == b"hello world"
    assert server.connections == 2  # the server closed the first after "close"


async def test_a_cancelled_post_drops_its_connection_and_frees_its_place() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        await asyncio.sleep(30)
        return False

    async with scripted(silent) as server:
        http = pool(max_connections=1)
        task = asyncio.create_task(http.post(server.url, b"{}", HEADERS, 30.0))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert http.open_connections == 0
        # The only place in the pool is free again: the next POST connects (and times out here).
        with pytest.raises(AnswerTimeout):
            await http.post(server.url, b"{}", HEADERS, 0.2)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_https_uses_httpx_trust_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An https replica: verified against the same trust store httpx would use (here the
    certificate named by SSL_CERT_FILE), and refused when the certificate is not trusted."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            writer.write(answer(await reader.readexactly(length)))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/calls"
    try:
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await pool().post(url, b"{}", HEADERS, 30.0)  # certifi does not know it
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        trusting = pool()
        assert (await trusting.post(url, b'{"ok":1}', HEADERS, 30.0)).content == b'{"ok":1}'
        await trusting.aclose()
    finally:
        server.close()


def _idle_socket(http: Pool) -> int:
    """The file descriptor of the pool's one idle connection."""
    (origin,) = http._origins.values()
    (connection,) = origin.idle
    assert connection.transport is not None
    return int(connection.transport.get_extra_info("socket").fileno())


def _block_until(fd: int, events: int) -> None:
    """Hold the event loop (as a busy trainer's is) until ``fd`` shows ``events``: the loop has
    not read what arrived, so the pool has not seen it either."""
    watcher = select.poll()
    watcher.register(fd, events)
    assert watcher.poll(60_000), "the server did not close the idle connection within 60 s"


async def test_a_connection_the_server_closed_while_the_loop_was_busy_is_not_reused() -> None:
    """A real tool server (uvicorn) closes idle keep-alive connections (after ``keep_alive_s``,
    or evicted under load). Before: the pool reused one whose end the busy loop had not read
    yet, the POST broke, and the dispatcher made its calls ``outcome_unknown``; nothing had run."""
    config = server_config(server={"keep_alive_s": 1})
    with running_server(config) as server:
        http = pool(keepalive_s=600.0)  # our own idle limit out of the way: only the server's counts
        body = orjson.dumps({"calls": [{"call_id": "k-1", "name": "echo", "arguments": {"text": "hi"}}]})
        assert (await http.post(server.url + "/v1/calls", body, HEADERS, 30.0)).status_code == 200
        _block_until(_idle_socket(http), select.POLLIN)  # the server's FIN arrived, unread
        again = orjson.dumps({"calls": [{"call_id": "k-2", "name": "echo", "arguments": {"text": "ho"}}]})
        answer_2 = await http.post(server.url + "/v1/calls", again, HEADERS, 30.0)
        await http.aclose()
    assert answer_2.status_code == 200
    assert orjson.loads(answer_2.content)["results"][0]["structured"]["text"] == "ho"


async def test_a_request_that_could_not_be_written_goes_on_another_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server resets the connection between the pool's look at it and the write (here: the
    look is skipped): the write fails at once, so not a byte left, and the request goes on a
    new connection instead of failing as "maybe delivered"."""
    answered = threading.Event()
    connections: list[socket.socket] = []

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            connections.append(self.request)
            data = b""
            while b"\r\n\r\n" not in data:
                data += self.request.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += self.request.recv(65536)
            self.request.sendall(answer(body))
            if len(connections) == 1:  # the first: reset once the client has its answer
                answered.wait(60)
                self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/calls"
    try:
        http = pool(keepalive_s=600.0)
        assert (await http.post(url, b"first", HEADERS, 30.0)).content == b"first"
        fd = _idle_socket(http)
        answered.set()
        _block_until(fd, select.POLLHUP | select.POLLERR)  # reset arrived, unread by the loop
        monkeypatch.setattr(
            "trainer_client.client.transport._Connection.still_open", lambda self: True, raising=False
        )
        assert (await http.post(url, b"second", HEADERS, 30.0)).content == b"second"
        await http.aclose()
    finally:
        server.shutdown()
        server.server_close()
    assert len(connections) == 2
