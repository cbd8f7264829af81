"""Slow and excess clients against a real server: read timeouts, the connection cap, fds.

Clients here use raw sockets: an HTTP library would not send half a request. Time bounds
are generous; they only tell an answer from a hang.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from tests.support.server import ServerProcess, running_server, server_config
from tool_server.api.connections import GuardedProtocol, connection_cap

HEADER_TIMEOUT_S = 1.5
BODY_TIMEOUT_S = 1.5
KEEP_ALIVE_S = 1.0
MAX_CONNECTIONS = 32
HANG_S = 15.0  # an answer later than this counts as a hang


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    config = server_config(
        server={
            "shutdown_grace_s": 2,
            "header_timeout_s": HEADER_TIMEOUT_S,
            "body_timeout_s": BODY_TIMEOUT_S,
            "keep_alive_s": KEEP_ALIVE_S,
            "max_connections": MAX_CONNECTIONS,
        }
    )
    with running_server(config) as srv:
        yield srv


def connect(server: ServerProcess) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=HANG_S)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response (status, lower-case headers, body); fails on a hang or a silent close."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed without a response (got {data!r})"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of the body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closes the connection (EOF or reset) before HANG_S."""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def calls_request(calls: list[dict], *, keep_alive: bool = True) -> bytes:
    body = json.dumps({"calls": calls}).encode()
    connection = b"" if keep_alive else b"Connection: close\r\n"
    return (
        b"POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + connection
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def calculator_call() -> dict:
    return {"call_id": uuid.uuid4().hex, "name": "calculator", "arguments": {"expression": "6*7"}}


def open_fds(server: ServerProcess) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def wait_for_fds(server: ServerProcess, at_most: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (count := open_fds(server)) > at_most and time.monotonic() < deadline:
        time.sleep(0.1)
    return count


def test_declared_body_never_sent_gets_408_within_the_body_timeout(server: ServerProcess) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(
            b"POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1048576\r\n\r\n" + b'{"calls": '
        )
        status, headers, body = read_response(sock)
        elapsed = time.monotonic() - started
        assert status == 408
        assert headers["connection"] == "close" and headers["content-type"] == "application/json"
        error = json.loads(body)["error"]
        assert error["kind"] == "timeout" and "10 of 1048576 bytes" in error["message"]
        assert BODY_TIMEOUT_S * 0.8 <= elapsed < HANG_S
        assert closed_by_server(sock)
    # The handler saw a disconnect: no 500, no "ASGI callable returned without..." in the log.
    time.sleep(0.2)
    assert "Exception in ASGI application" not in server.output
    assert "ASGI callable" not in server.output


def test_headers_trickled_too_slowly_get_408_and_a_silent_connection_is_closed(
    server: ServerProcess,
) -> None:
    with connect(server) as trickling, connect(server) as silent:
        started = time.monotonic()
        trickling.settimeout(0.3)
        answer = b""
        for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"x" * 200:
            try:  # a byte every 0.3 s: activity must not extend the header deadline
                trickling.sendall(bytes([byte]))
                answer += trickling.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if answer or time.monotonic() - started > HANG_S:
                break
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b'"kind":"timeout"' in answer and b"request headers not complete" in answer
        assert time.monotonic() - started < HANG_S
        assert closed_by_server(silent)  # never sent a byte: closed, without an answer
        assert time.monotonic() - started < HANG_S


def test_idle_keep_alive_connection_is_closed_after_keep_alive_s(server: ServerProcess) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(sock)[0] == 200
        idle_since = time.monotonic()
        assert closed_by_server(sock)
        # uvicorn's default is 5 s: closing sooner shows server.keep_alive_s is applied.
        assert time.monotonic() - idle_since < KEEP_ALIVE_S + 2.5


def test_at_the_cap_a_new_connection_evicts_the_oldest_incomplete_request(server: ServerProcess) -> None:
    slow = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in slow:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finish
            time.sleep(0.005)  # keeps their order of arrival
        with connect(server) as prompt:
            prompt.sendall(calls_request([calculator_call()]))
            assert read_response(prompt)[0] == 200
        status, headers, body = read_response(slow[0])
        assert status == 503 and headers["retry-after"] == "1"
        assert "oldest incomplete request" in json.loads(body)["error"]["message"]
    finally:
        for sock in slow:
            sock.close()


def test_slow_loris_does_not_lock_out_prompt_clients_and_fds_return_to_baseline(
    server: ServerProcess,
) -> None:
    assert httpx.post(server.url + "/v1/calls", json={"calls": [calculator_call()]}).status_code == 200
    baseline = wait_for_fds(server, 0, 1.0)  # settle: the warm-up connection is closed
    attackers: list[socket.socket] = []
    attack_over, all_opened = threading.Event(), threading.Event()
    attack_errors: list[BaseException] = []

    def slow_loris() -> None:
        """300 connections, 10 every 50 ms, each sending a few header bytes every 0.5 s."""
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        last_trickle = time.monotonic()
        try:
            while not attack_over.is_set():
                if len(attackers) < 300:
                    for _ in range(10):
                        sock = socket.create_connection((host, int(port)), timeout=HANG_S)
                        sock.sendall(b"POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                        attackers.append(sock)
                else:
                    all_opened.set()
                if time.monotonic() - last_trickle > 0.5:
                    last_trickle = time.monotonic()
                    for sock in attackers:
                        with contextlib.suppress(OSError):  # closed by the server: expected
                            sock.send(b"X-Slow: 1\r\n")
                time.sleep(0.05)
        except BaseException as error:  # reported by the test, not lost in the thread
            attack_errors.append(error)
            all_opened.set()

    thread = threading.Thread(target=slow_loris, daemon=True)
    thread.start()
    statuses, peak = [], baseline
    try:
        deadline = time.monotonic() + 3 * HEADER_TIMEOUT_S + 1
        while time.monotonic() < deadline:
            if not all_opened.is_set():
                # However long a busy machine takes to open the 300 connections, prompt
                # clients keep coming for two header timeouts at the attack's full strength.
                deadline = max(deadline, time.monotonic() + 2 * HEADER_TIMEOUT_S)
            # A fresh connection per request: the attack targets new connections.
            response = httpx.post(
                server.url + "/v1/calls", json={"calls": [calculator_call()]}, timeout=HANG_S
            )
            statuses.append(response.status_code)
            peak = max(peak, open_fds(server))
            time.sleep(0.02)
    finally:
        attack_over.set()
        thread.join(10)
    try:
        assert not attack_errors, attack_errors
        assert len(attackers) == 300
        assert statuses and set(statuses) == {200}, statuses
        # Connections beyond the cap were evicted: fds stay near baseline + the cap.
        assert peak <= baseline + MAX_CONNECTIONS + 8, (peak, baseline)
        # The attacker keeps its sockets open; the header timeout closes them server-side.
        settled = wait_for_fds(server, baseline + 1, HEADER_TIMEOUT_S + 8)
        assert settled <= baseline + 1, (settled, baseline)
    finally:
        for sock in attackers:
            sock.close()


def test_beyond_the_cap_with_every_connection_busy_a_new_one_gets_503_quickly(
    server: ServerProcess,
) -> None:
    busy = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in busy:  # every slot holds a request in progress: nothing to evict
            sock.sendall(
                calls_request([{"call_id": uuid.uuid4().hex, "name": "sleep", "arguments": {"seconds": 4}}])
            )
        time.sleep(0.5)
        with connect(server) as extra:
            started = time.monotonic()
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, headers, body = read_response(extra)
            assert time.monotonic() - started < 3.0  # well before any slot frees (4 s sleeps)
            assert status == 503 and headers["retry-after"] == "1"
            assert json.loads(body)["error"]["kind"] == "overloaded"
            assert closed_by_server(extra)
        for sock in busy:  # the admitted requests are unaffected
            assert read_response(sock)[0] == 200
    finally:
        for sock in busy:
            sock.close()
    # Slots free again once those connections close.
    deadline = time.monotonic() + 5
    while (status := httpx.get(server.url + "/healthz").status_code) != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 200
    metrics = httpx.get(server.url + "/metrics").text  # refusals are counted where operators look
    assert re.search(r'^toolfactory_connection_events_total\{event="refused"\} [1-9]', metrics, re.MULTILINE)
    assert re.search(r"^toolfactory_connections_open [1-9]", metrics, re.MULTILINE)


def test_connection_cap_leaves_a_quarter_of_the_fds_for_everything_else() -> None:
    assert connection_cap(8192, 1 << 20) == 8192
    assert connection_cap(8192, 20_000) == 8192
    assert connection_cap(8192, 8192) == 6144
    assert connection_cap(8192, 1024) == 768
    assert connection_cap(100, 64) == 16  # a floor, so a tiny limit still serves


def test_uvicorn_internals_the_guard_relies_on() -> None:
    """GuardedProtocol subclasses uvicorn's httptools protocol: fail loudly if that changes."""
    for hook in (
        "connection_made",
        "connection_lost",
        "data_received",
        "handle_websocket_upgrade",
        "on_message_begin",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
        "on_response_complete",
    ):
        assert callable(getattr(HttpToolsProtocol, hook, None)), hook
        assert hook in GuardedProtocol.__dict__, hook
    protocol_source = inspect.getsource(HttpToolsProtocol)
    for used in (
        "self.loop =",
        "self.flow =",
        "self.pipeline",
        "self.headers =",
        "self.server_state =",
        "on_response=self.on_response_complete",
        "self.timeout_keep_alive_task = self.loop.call_later",  # the idle keep-alive timeout
    ):
        assert used in protocol_source, used
    cycle_source = inspect.getsource(RequestResponseCycle)
    # The body timeout makes a waiting receive() return http.disconnect and sends no-ops.
    for used in (
        "self.disconnected =",
        "self.message_event",
        "self.response_started =",
        "if self.disconnected:",
    ):
        assert used in cycle_source, used
    assert "self.read_paused =" in inspect.getsource(FlowControl)  # timers wait while reading is paused
