"""A web page the user visits cannot drive a server on loopback (issue 30, point 8).

Two ways in, both with requests a browser sends for any page: a cross-site "simple" POST
(``text/plain``, a form, or no type at all: no CORS preflight) to 127.0.0.1, and DNS
rebinding (the attacker's name re-pointed at 127.0.0.1, so the page is same-origin with the
server and the request carries ``Host: attacker.example``). Both reach the real server
(``tool-server serve`` on loopback without tokens) here, by httpx with the headers a
browser would send; the ``count`` tool shows whether anything ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.server import REPO, ServerProcess, running_server, server_config

CALLS = "/v1/calls"
TOKEN = "drive-by-test-token-0123456789"
SIMPLE_TYPES = [  # what a page may send cross-site without a preflight
    "text/plain",
    "text/plain;charset=UTF-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    None,
]
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with running_server(server_config()) as srv:
        yield srv


def count_body(key: str) -> bytes:
    call = {"call_id": uuid.uuid4().hex, "name": "count", "arguments": {"key": key}}
    return json.dumps({"calls": [call]}).encode()


def ran(server: ServerProcess, key: str) -> int:
    """How often ``count`` has run for ``key`` (this call included: 1 means never before)."""
    body = {"calls": [{"call_id": uuid.uuid4().hex, "name": "count", "arguments": {"key": key}}]}
    answer = httpx.post(server.url + CALLS, json=body, timeout=30).json()
    return answer["results"][0]["structured"]["count"] - 1


def post(
    server: ServerProcess, path: str, body: bytes, content_type: str | None, **headers: str
) -> httpx.Response:
    if content_type is not None:
        headers["Content-Type"] = content_type
    return httpx.post(server.url + path, content=body, headers=headers, timeout=30)


@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
def test_a_cross_site_simple_post_runs_no_tool(server, content_type):
    key = uuid.uuid4().hex
    answer = post(server, CALLS, count_body(key), content_type)
    assert answer.status_code == 415, answer.text
    error = answer.json()["error"]
    assert error["kind"] == "bad_request" and "Content-Type: application/json" in error["message"]
    assert ran(server, key) == 0


@pytest.mark.parametrize(
    "path",
    ["/v1/verify", "/v1/sessions", "/retrieve", "/ui/api/replay", "/ui/api/upload", "/mcp", "/mcp/test"],
)
def test_every_post_endpoint_refuses_a_body_not_declared_json(server, path):
    body = b'{"requests": [], "session": "s", "pack": "p", "task": "t", "queries": ["q"]}'
    answer = post(server, path, body, "text/plain", Accept="application/json, text/event-stream")
    assert answer.status_code == 415, answer.text
    data = answer.json()
    message = data["error"]["message"]  # a JSON-RPC error on /mcp, our error object elsewhere
    assert "Content-Type" in message and "text/plain" in message


def test_an_empty_post_without_a_type_opens_no_session(server):
    """An empty POST without a Content-Type is a simple request: it must not fill the session table."""
    answer = httpx.post(server.url + "/v1/sessions", timeout=30)
    assert answer.status_code == 415
    assert httpx.post(server.url + "/v1/sessions", json={}, timeout=30).status_code == 201


def test_json_with_a_charset_and_jsonl_uploads_are_accepted(server):
    key = uuid.uuid4().hex
    answer = post(server, CALLS, count_body(key), "Application/JSON; charset=utf-8")
    assert answer.status_code == 200 and ran(server, key) == 1
    line = b'{"id": "t", "response_mask": [1], "reward": 1.0}\n'
    for kind in ("application/x-ndjson", "application/jsonl", "application/json"):
        upload = post(server, "/ui/api/upload?name=mine.jsonl", line, kind)
        assert upload.status_code == 201, (kind, upload.text)


@pytest.mark.parametrize(
    "host", ["attacker.example", "attacker.example:8000", "127.0.0.1.nip.io", "localhost.attacker"]
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/tools"),
        ("GET", "/ui/api/files"),
        ("GET", "/ui/api/auth"),
        ("GET", "/healthz"),
        ("GET", "/ui/"),
    ],
)
def test_a_rebound_name_is_refused_on_every_route(server, host, method, path):
    answer = httpx.request(method, server.url + path, headers={"Host": host}, timeout=30)
    assert answer.status_code == 421, answer.text
    message = answer.json()["error"]["message"]
    assert "DNS rebinding" in message and "server.allowed_hosts" in message


def test_a_rebound_page_runs_no_tool_even_with_a_json_post(server):
    key = uuid.uuid4().hex
    answer = post(server, CALLS, count_body(key), "application/json", Host="attacker.example:8000")
    assert answer.status_code == 421
    mcp = httpx.post(
        server.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={**MCP_HEADERS, "Host": "attacker.example"},
        timeout=30,
    )
    assert mcp.status_code == 421 and "DNS rebinding" in mcp.json()["error"]["message"]
    assert ran(server, key) == 0


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:1234", "localhost.", "127.0.0.1", "127.0.0.2:80", "[::1]:8000"]
)
def test_loopback_names_and_addresses_are_answered(server, host):
    assert httpx.get(server.url + "/v1/tools", headers={"Host": host}, timeout=30).status_code == 200


@pytest.mark.parametrize(
    "origin", ["http://attacker.example", "https://attacker.example:8443", "null", "file://"]
)
def test_a_page_of_another_site_is_refused(server, origin):
    key = uuid.uuid4().hex
    answer = post(server, CALLS, count_body(key), "application/json", Origin=origin)
    assert answer.status_code == 403 and "Origin" in answer.json()["error"]["message"]
    assert ran(server, key) == 0


def test_the_servers_own_pages_are_answered(server):
    """The workbench's own fetches carry the server's origin; a page on another loopback port too."""
    for origin in (server.url, "http://localhost:3000"):
        answer = post(server, CALLS, count_body(uuid.uuid4().hex), "application/json", Origin=origin)
        assert answer.status_code == 200, (origin, answer.text)


def test_listed_names_are_answered_on_every_route_mcp_included():
    config = server_config(
        server={"shutdown_grace_s": 2, "allowed_hosts": ["tools.internal", "proxy.example:8443"]}
    )
    with running_server(config) as srv:
        for host in ("tools.internal", "Tools.Internal:9000", "proxy.example:8443"):
            assert httpx.get(srv.url + "/v1/tools", headers={"Host": host}, timeout=30).status_code == 200
            mcp = httpx.post(
                srv.url + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Host": host}, timeout=30
            )
            assert mcp.status_code == 200, (host, mcp.text)
        for host in ("proxy.example", "proxy.example:80", "attacker.example"):
            assert httpx.get(srv.url + "/v1/tools", headers={"Host": host}, timeout=30).status_code == 421


def test_any_host_needs_tokens(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(server_config(server={"allowed_hosts": ["*"]})))
    command = [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(path), "--port", "0"]
    env = {**os.environ, "TOOLFACTORY_TOKENS": ""}
    refused = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "server.allowed_hosts" in refused.stderr and "tokens" in refused.stderr
    with running_server(path, env={"TOOLFACTORY_TOKENS": TOKEN}) as srv:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(srv.url + "/v1/tools", headers={"Host": "lb.example", **auth}).status_code == 200
        assert httpx.get(srv.url + "/v1/tools", headers={"Host": "lb.example"}).status_code == 401
        # The type check stays: a page that could guess nothing else still gets 415 before any tool.
        typed = post(srv, CALLS, count_body("k"), "text/plain", **auth)
        assert typed.status_code == 415


def test_on_every_interface_ip_addresses_pass_and_names_do_not():
    """On 0.0.0.0 (tokens required) any address is one of ours (probes use the pod IP); names are listed."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with running_server(server_config(), host="0.0.0.0", env={"TOOLFACTORY_TOKENS": TOKEN}) as srv:
        for host in ("10.1.2.3:8000", "[fd00::5]:8000", "localhost"):
            assert httpx.get(srv.url + "/v1/tools", headers={"Host": host, **auth}).status_code == 200
        named = httpx.get(srv.url + "/v1/tools", headers={"Host": "tool-server:8000", **auth})
        assert named.status_code == 421
