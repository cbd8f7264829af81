"""A real nginx (Debian's) in front of three replicas on 127.0.0.x: sessions stay on one replica.

The nginx config is the shipped ``compose/nginx/toolfactory.conf`` with only its example
replica addresses and listen port replaced. Clients are the official MCP SDK client, one
per session, each sending the session id in ``X-Toolfactory-Session`` (nginx hashes it) and
in ``_meta`` (where the server reads it). The ``notebook`` tool shows whether a session's
state was kept: each call appends a line and returns every line so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol import new_session_id
from tests.support.processes import started
from tests.support.require import require_program
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "compose" / "nginx" / "toolfactory.conf"
HEADER = "X-Toolfactory-Session"
SESSION_META = "toolfactory/session"
NOTEBOOK = {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]}
CONFIG = server_config(tools=[*BASE_TOOLS, NOTEBOOK])
ADDRESSES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
EXAMPLE_SERVER = re.compile(r"^(\s*server )10\.0\.0\.\d+:8000(.*;)$")

# The shipped file is an http{}-level snippet; this is the least main config around it.
MAIN = """\
user root;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/toolfactory.conf;
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    require_program(found, "nginx: make setup apt-installs SYSTEM_PACKAGES")
    return found


def site_config(replicas: list[str], port: int) -> str:
    """The shipped config with our replicas in both upstreams and our listen address."""
    out: list[str] = []
    first = True
    for line in SHIPPED.read_text().splitlines(keepends=True):
        match = EXAMPLE_SERVER.match(line)
        if line.startswith("upstream "):
            first = True
        elif match and first:  # the first example server of an upstream: ours, with its options
            out += [f"{match.group(1)}{r}{match.group(2)}\n" for r in replicas]
            first = False
            continue
        elif match:
            continue
        out.append(line)
    config = "".join(out)
    assert config.count("listen 8080;") == 1 and "10.0.0." not in config, "the shipped config changed shape"
    return config.replace("listen 8080;", f"listen 127.0.0.1:{port};")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_nginx(replicas: list[str], tmp: Path) -> Iterator[str]:
    binary = nginx_binary()
    port = free_port()
    (tmp / "toolfactory.conf").write_text(site_config(replicas, port))
    (tmp / "nginx.conf").write_text(MAIN.format(tmp=tmp))
    check = subprocess.run([binary, "-t", "-c", str(tmp / "nginx.conf")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr

    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    with started([binary, "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"], probe=listening, timeout_s=20):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def nginx_fleet(tmp: Path) -> Iterator[tuple[str, list[ServerProcess]]]:
    """Three replicas on their own loopback addresses and nginx in front: (nginx URL, replicas)."""
    nginx_binary()
    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(running_server(CONFIG, host=a)) for a in ADDRESSES]
        url = stack.enter_context(running_nginx([r.url.removeprefix("http://") for r in replicas], tmp))
        yield url, replicas


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[ServerProcess]]]:
    with nginx_fleet(tmp_path_factory.mktemp("nginx")) as running:
        yield running


@pytest.fixture
def own_fleet(tmp_path: Path) -> Iterator[tuple[str, list[ServerProcess]]]:
    """A fleet for a test that kills one of its replicas."""
    with nginx_fleet(tmp_path) as running:
        yield running


async def mcp_session(url: str, session: str, lines: list[str], *, header: bool = True) -> list[Any]:
    """One MCP client (the official SDK) for one session: a notebook call per line, in order.

    Returns each call's notebook lines, or the exception a call raised.
    """
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    seen: list[Any] = []
    headers = {HEADER: session} if header else {}
    try:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(url + "/mcp/test", http_client=http)) as client,
        ):
            for line in lines:
                try:
                    answer = await client.call_tool("notebook", {"put": line}, meta={SESSION_META: session})
                except Exception as exc:  # a failed call (e.g. its replica is gone) is a result here
                    seen.append(exc)
                    continue
                assert not answer.is_error, answer
                seen.append(answer.structured_content["lines"])
    except Exception as exc:  # the handshake failed: so does every call
        seen += [exc] * (len(lines) - len(seen))
    return seen


def homes(replicas: list[ServerProcess], sessions: list[str]) -> dict[str, list[str]]:
    """session -> URLs of the replicas that hold lines of it (asked directly, appending nothing)."""
    found: dict[str, list[str]] = {s: [] for s in sessions}
    for replica in replicas:
        calls = [
            {"call_id": f"peek-{i}-{new_session_id()}", "name": "notebook", "arguments": {}, "session": s}
            for i, s in enumerate(sessions)
        ]
        response = httpx.post(replica.url + "/v1/calls", json={"calls": calls}, timeout=30)
        for session, result in zip(sessions, response.json()["results"], strict=True):
            if result["structured"]["lines"]:
                found[session].append(replica.url)
    return found


def continuous(seen: list[Any]) -> bool:
    return seen == [[str(k) for k in range(1, j + 1)] for j in range(1, len(seen) + 1)]


async def test_each_session_stays_on_one_replica_behind_nginx(fleet: tuple[str, list[ServerProcess]]) -> None:
    url, replicas = fleet
    sessions = [new_session_id() for _ in range(24)]
    lines = [str(k) for k in range(1, 5)]
    seen = await asyncio.gather(*(mcp_session(url, s, lines) for s in sessions))
    assert all(continuous(s) and len(s) == len(lines) for s in seen), seen
    where = homes(replicas, sessions)
    assert all(len(urls) == 1 for urls in where.values()), where  # each session on one replica
    assert len({urls[0] for urls in where.values()}) >= 2, where  # and the sessions spread out
    # Requests without the header are stateless: they go round, not all to one replica.
    async with httpx.AsyncClient(base_url=url) as http:
        for i in range(30):
            body = {"calls": [{"call_id": f"c{i}-{new_session_id()}", "name": "echo", "arguments": {}}]}
            assert (await http.post("/v1/calls", json=body)).status_code == 200
    served = [echo_calls(r) for r in replicas]
    assert sum(served) == 30 and sum(n > 0 for n in served) >= 2, served


async def test_without_the_header_sessions_are_split_across_replicas(
    fleet: tuple[str, list[ServerProcess]],
) -> None:
    """The control: the same clients minus the header lose state, so the hash is what keeps it."""
    url, replicas = fleet
    sessions = [new_session_id() for _ in range(8)]
    seen = await asyncio.gather(*(mcp_session(url, s, ["1", "2", "3", "4"], header=False) for s in sessions))
    assert not all(continuous(s) for s in seen), seen
    assert any(len(urls) > 1 for urls in homes(replicas, sessions).values())


async def test_a_dead_replica_fails_its_sessions_clearly_and_no_other(
    own_fleet: tuple[str, list[ServerProcess]],
) -> None:
    url, replicas = own_fleet
    sessions = [new_session_id() for _ in range(24)]
    first = await asyncio.gather(*(mcp_session(url, s, ["1", "2"]) for s in sessions))
    assert all(continuous(s) for s in first), first
    where = homes(replicas, sessions)
    victim = replicas[0]
    victim.proc.kill()
    victim.proc.wait(10)
    on_victim = {s for s, urls in where.items() if urls == [victim.url]}
    assert on_victim and len(on_victim) < len(sessions), where

    later = await asyncio.gather(*(mcp_session(url, s, ["3", "4"]) for s in sessions))
    for session, seen in zip(sessions, later, strict=True):
        if session in on_victim:  # never re-homed: both calls fail, none starts an empty notebook
            assert all(isinstance(x, Exception) for x in seen), seen
        else:
            assert seen == [["1", "2", "3"], ["1", "2", "3", "4"]]
    # The error a plain HTTP client gets says what happened; stateless calls still all succeed.
    async with httpx.AsyncClient(base_url=url) as http:
        lost = next(iter(on_victim))
        body = {
            "calls": [
                {"call_id": f"x-{new_session_id()}", "name": "notebook", "arguments": {}, "session": lost}
            ]
        }
        answer = await http.post("/v1/calls", json=body, headers={HEADER: lost})
        assert answer.status_code == 502 and "session state went with it" in answer.json()["error"]["message"]
        for i in range(20):
            body = {"calls": [{"call_id": f"s{i}-{new_session_id()}", "name": "echo", "arguments": {}}]}
            assert (await http.post("/v1/calls", json=body)).status_code == 200


def echo_calls(replica: ServerProcess) -> int:
    """How many echo calls a replica ran, from its Prometheus metrics."""
    text = httpx.get(replica.url + "/metrics", timeout=10).text
    return int(
        sum(
            float(m.group(1))
            for m in re.finditer(
                r'^toolfactory_calls_total\{[^}]*tool="echo"[^}]*\} (\S+)$', text, re.MULTILINE
            )
        )
    )


async def test_a_stream_naming_its_session_reaches_the_sessions_replica_behind_nginx(
    fleet: tuple[str, list[ServerProcess]],
) -> None:
    """The WebSocket upgrade passes through the shipped config, and a stream that names its
    session at the handshake is hashed like the session's other requests: each episode's calls
    land on one replica, in order, and the episodes spread out."""
    from trainer_client.client.stream import StreamClient

    url, replicas = fleet

    async def episode(session: str) -> list[list[str]]:
        async with StreamClient(url, session=session, timeout_s=60) as stream:
            seen = []
            for line in ("1", "2", "3"):
                result = await stream.call("notebook", {"put": line}, session=session)
                assert not result.is_error, result
                seen.append(result.structured["lines"])
            return seen

    sessions = [new_session_id() for _ in range(12)]
    seen = await asyncio.gather(*(episode(s) for s in sessions))
    assert all(continuous(s) for s in seen), seen
    where = homes(replicas, sessions)
    assert all(len(urls) == 1 for urls in where.values()), where
    assert len({urls[0] for urls in where.values()}) >= 2, where
