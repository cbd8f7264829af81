"""Auth and tenants: the attacks of the security campaign, against a real server.

Each test is one hole that was open: an empty bind address that skipped the token
check, stored results and in-flight calls shared across tokens, a call_id reused for
another call, sessions readable and deletable by any token, a 500 on a non-ASCII token.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from protocol import Result, decode_results
from tests.support.server import REPO, ServerProcess, running_server, server_config
from tool_server.api.auth import is_loopback

TOKEN_A = "tenant-a-token-0123456789"  # every tool
TOKEN_B = "tenant-b-token-0123456789"  # math only
TOKEN_C = "tenant-c-token-0123456789"  # every tool, another tenant than A
NOTEBOOK = {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post_calls(srv: ServerProcess, token: str, *calls: dict[str, Any]) -> list[Result]:
    response = httpx.post(srv.url + "/v1/calls", json={"calls": list(calls)}, headers=auth(token), timeout=30)
    assert response.status_code == 200, response.text
    return decode_results(response.content)


@pytest.fixture(scope="module")
def tenants() -> Iterator[ServerProcess]:
    config = server_config(toolsets={"mathonly": ["calculator"]})
    config["tools"] = [*config["tools"], NOTEBOOK]
    config["verifiers"] = [{"target": "tools.verifiers.match:exact_match"}]
    env = {"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}:mathonly,{TOKEN_C}"}
    with running_server(config, env=env) as srv:
        yield srv


# ------------------------------------------------------------------ 1. bind address


def serve_and_fail(tmp_path, config: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(path), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TOOLFACTORY_TOKENS": "", **env},
    )


def test_empty_host_binds_every_interface_so_it_needs_tokens(tmp_path):
    # uvicorn listens on 0.0.0.0 and [::] for host "": that is not loopback.
    proc = serve_and_fail(tmp_path, server_config(server={"host": ""}), {})
    assert proc.returncode == 2, proc.stderr
    assert "refusing to bind ''" in proc.stderr and "0.0.0.0" in proc.stderr


def test_empty_host_from_the_environment_is_a_clear_error(tmp_path):
    proc = serve_and_fail(tmp_path, server_config(), {"TOOLFACTORY__SERVER__HOST": ""})
    assert proc.returncode == 2, proc.stderr
    assert "server.host is empty" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("", False), ("0.0.0.0", False), ("::", False), ("127.0.0.1", True), ("127.0.0.9", True),
     ("::1", True), ("[::1]", True), ("localhost", True), ("no-such-host.invalid", False)],
)  # fmt: skip
def test_loopback_is_decided_from_the_bound_addresses(host, loopback):
    assert is_loopback(host) is loopback


# ------------------------------------------------------------------ 2. stored results per tenant


def test_another_tenants_call_id_is_a_new_id_and_permission_comes_first(tenants):
    call_id = uuid.uuid4().hex
    key = uuid.uuid4().hex
    count = {"call_id": call_id, "name": "count", "arguments": {"key": key}}
    (first,) = post_calls(tenants, TOKEN_A, count)
    assert first.structured["count"] == 1

    # The math-only token may not call count: not even a stored result of it. To it, count does
    # not exist (as on /mcp): the answer names only its own tools.
    (scoped,) = post_calls(tenants, TOKEN_B, count)
    assert scoped.error.kind == "unknown_tool" and str(key) not in scoped.text
    assert "calculator" in scoped.error.message and "echo" not in scoped.error.message
    # The same id for a tool it may call is simply a new call of its own.
    (own,) = post_calls(
        tenants, TOKEN_B, {"call_id": call_id, "name": "calculator", "arguments": {"expression": "2+2"}}
    )
    assert not own.is_error and own.structured["result"] == 4

    # Another full tenant sending A's id runs its own call (the counter moves on) ...
    (other,) = post_calls(tenants, TOKEN_C, count)
    assert not other.is_error and other.structured["count"] == 2
    # ... while A's retry still gets A's stored result.
    (retry,) = post_calls(tenants, TOKEN_A, count)
    assert retry.structured["count"] == 1


def test_another_tenant_cannot_join_an_in_flight_call(tenants):
    call_id = uuid.uuid4().hex
    slow = {"call_id": call_id, "name": "sleep", "arguments": {"seconds": 1.5}}

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=tenants.url, timeout=30) as client:
            running = asyncio.create_task(
                client.post("/v1/calls", json={"calls": [slow]}, headers=auth(TOKEN_A))
            )
            await asyncio.sleep(0.3)
            joined = await client.post("/v1/calls", json={"calls": [slow]}, headers=auth(TOKEN_B))
            return joined, await running

    joined, running = asyncio.run(scenario())
    (denied,) = decode_results(joined.content)
    assert denied.error.kind == "unknown_tool"  # sleep is not among the math-only token's tools
    assert decode_results(running.content)[0].structured == {"slept": 1.5}


# ------------------------------------------------------------------ 3. call_id fingerprint


def test_a_reused_call_id_must_repeat_the_same_call(server):
    call_id = uuid.uuid4().hex

    def send(*calls: dict[str, Any]) -> list[Result]:
        return decode_results(httpx.post(server.url + "/v1/calls", json={"calls": list(calls)}).content)

    arguments = {"text": "a", "data": {"x": 1, "y": 2}}
    (first,) = send({"call_id": call_id, "name": "echo", "arguments": arguments})
    assert first.structured["text"] == "a"
    (other_args,) = send({"call_id": call_id, "name": "echo", "arguments": {"text": "b"}})
    assert other_args.error.kind == "bad_request" and "different call" in other_args.error.message
    (other_session,) = send({"call_id": call_id, "name": "echo", "arguments": arguments, "session": "s"})
    assert other_session.error.kind == "bad_request"
    # Key order does not matter: the arguments are compared canonically.
    reordered = {"data": {"y": 2, "x": 1}, "text": "a"}
    (same,) = send({"call_id": call_id, "name": "echo", "arguments": reordered})
    assert same == first


def test_a_reused_call_id_cannot_join_a_different_call_in_flight(server):
    call_id = uuid.uuid4().hex
    slow = {"call_id": call_id, "name": "sleep", "arguments": {"seconds": 1.0}}

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            running = asyncio.create_task(client.post("/v1/calls", json={"calls": [slow]}))
            await asyncio.sleep(0.3)
            other_tool = await client.post(
                "/v1/calls", json={"calls": [{"call_id": call_id, "name": "echo", "arguments": {}}]}
            )
            other_args = await client.post(
                "/v1/calls",
                json={"calls": [{"call_id": call_id, "name": "sleep", "arguments": {"seconds": 0.5}}]},
            )
            same = await client.post("/v1/calls", json={"calls": [slow]})  # joins the running call
            return [other_tool, other_args, same, await running]

    other_tool, other_args, same, running = (decode_results(r.content)[0] for r in asyncio.run(scenario()))
    assert other_tool.error.kind == "bad_request" and other_args.error.kind == "bad_request"
    assert same.structured == running.structured == {"slept": 1.0}


# ------------------------------------------------------------------ 4. sessions per tenant


def test_a_session_belongs_to_the_tenant_that_created_it(tenants):
    session = f"traj-{uuid.uuid4().hex}"

    def note(token: str, line: str) -> Result:
        call = {
            "call_id": uuid.uuid4().hex,
            "name": "notebook",
            "arguments": {"put": line},
            "session": session,
        }
        return post_calls(tenants, token, call)[0]

    assert note(TOKEN_A, "secret of A").structured["lines"] == ["secret of A"]
    stolen = note(TOKEN_C, "peek")
    assert stolen.error.kind == "unknown_session" and "secret" not in stolen.text

    deleted = httpx.delete(f"{tenants.url}/v1/sessions/{session}", headers=auth(TOKEN_B))
    assert deleted.status_code == 404 and deleted.json()["error"]["kind"] == "unknown_session"
    taken = httpx.post(f"{tenants.url}/v1/sessions", json={"session": session}, headers=auth(TOKEN_C))
    assert taken.status_code == 409

    assert note(TOKEN_A, "more").structured["lines"] == ["secret of A", "more"]  # untouched
    assert httpx.delete(f"{tenants.url}/v1/sessions/{session}", headers=auth(TOKEN_A)).status_code == 200
    assert note(TOKEN_A, "late").error.kind == "unknown_session"  # released: never revived


def test_verify_requests_use_only_the_callers_sessions(tenants):
    session = f"traj-{uuid.uuid4().hex}"
    call = {"call_id": uuid.uuid4().hex, "name": "notebook", "arguments": {"put": "x"}, "session": session}
    assert not post_calls(tenants, TOKEN_A, call)[0].is_error
    request = {"verifier": "exact_match", "response": "4", "ground_truth": "4", "session": session}
    mine = httpx.post(tenants.url + "/v1/verify", json={"requests": [request]}, headers=auth(TOKEN_A)).json()
    theirs = httpx.post(
        tenants.url + "/v1/verify", json={"requests": [request]}, headers=auth(TOKEN_C)
    ).json()
    assert mine["results"][0]["score"] == 1.0
    assert theirs["results"][0]["error"]["kind"] == "unknown_session"


# ------------------------------------------------------------------ 5. odd tokens


@pytest.mark.parametrize("raw", ["Bearer t\xe9nant-a-token-0123456789", "Bearer \xff\xfe", "bearer \x80"])
def test_non_ascii_bearer_tokens_get_401_not_500(tenants, raw):
    response = httpx.post(
        tenants.url + "/v1/calls",
        content=b'{"calls": []}',
        headers=[(b"Authorization", raw.encode("latin-1"))],
    )
    assert response.status_code == 401
    assert tenants.proc.poll() is None


# ------------------------------------------------------------------ 5. server-wide figures


def test_server_wide_figures_need_a_token_for_every_tool(tmp_path):
    """/metrics and /readyz name every tool and upstream (an upstream's last error may name a
    host): a token scoped to some toolsets, or no token on the public /readyz, must not see them."""
    config = server_config(
        toolsets={"mathonly": ["calculator"]},
        mcpServers={"internal": {"url": "http://127.0.0.1:9/secret-upstream/mcp"}},  # nothing listens
    )
    config["tools"] = [*config["tools"], NOTEBOOK]
    env = {"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}:mathonly"}
    with running_server(config, env=env) as srv:
        full = httpx.get(srv.url + "/metrics", headers=auth(TOKEN_A))
        assert full.status_code == 200 and 'server="internal"' in full.text
        for path in ("/metrics", "/ui/api/live"):
            scoped = httpx.get(srv.url + path, headers=auth(TOKEN_B))
            assert scoped.status_code == 403, (path, scoped.text)
            assert scoped.json()["error"]["kind"] == "unauthorized"
            assert "internal" not in scoped.text and "secret-upstream" not in scoped.text
        detailed = httpx.get(srv.url + "/readyz", headers=auth(TOKEN_A)).json()
        assert "secret-upstream" in str(detailed["checks"])  # the operator sees why it is down
        for headers in ({}, auth(TOKEN_B), auth("not-a-token-0123456789")):
            answer = httpx.get(srv.url + "/readyz", headers=headers)
            assert answer.status_code in (200, 503)
            assert answer.json() == {"status": detailed["status"]}, headers
    # an operator who makes /metrics public (a Prometheus without a token) gets what they chose
    config["auth"] = {"public_paths": ["/healthz", "/readyz", "/metrics"]}
    with running_server(config, env=env) as srv:
        assert 'server="internal"' in httpx.get(srv.url + "/metrics").text
        assert httpx.get(srv.url + "/ui/api/live", headers=auth(TOKEN_B)).status_code == 403
        assert "checks" not in httpx.get(srv.url + "/readyz").json()


def test_an_upload_to_the_workbench_is_its_tenants_alone(tenants):
    """Two tokens for every tool, two tenants: a trajectories file one uploads is not the other's."""
    line = b'{"id": "private-trajectory", "response_mask": [1], "reward": 1.0}\n'
    answer = httpx.post(
        tenants.url + "/ui/api/upload",
        params={"name": "mine.jsonl"},
        content=line,
        headers={**auth(TOKEN_A), "content-type": "application/x-ndjson"},
    )
    assert answer.status_code == 201, answer.text
    name = answer.json()["file"]
    page = {"file": name}
    mine = httpx.get(tenants.url + "/ui/api/trajectories", params=page, headers=auth(TOKEN_A))
    assert mine.status_code == 200 and mine.json()["rows"][0]["id"] == "private-trajectory"
    listed = httpx.get(tenants.url + "/ui/api/files", headers=auth(TOKEN_C)).json()["files"]
    assert name not in [f["name"] for f in listed]
    assert name in [
        f["name"] for f in httpx.get(tenants.url + "/ui/api/files", headers=auth(TOKEN_A)).json()["files"]
    ]
    for path in ("/ui/api/trajectories", "/ui/api/trajectory"):
        theirs = httpx.get(tenants.url + path, params={**page, "line": 0}, headers=auth(TOKEN_C))
        assert theirs.status_code == 404 and "private-trajectory" not in theirs.text, (path, theirs.text)


def test_a_cached_result_is_its_tenants_alone(tenants):
    """A cache shared across tenants told one tenant what another had asked: a hit (cached,
    0 ms) on arguments nobody else could know. Each tenant has its own entries."""
    expression = f"{uuid.uuid4().int % 10**9} + 1"  # nobody asked this before

    def ask(token: str) -> Result:
        call = {"call_id": uuid.uuid4().hex, "name": "calculator", "arguments": {"expression": expression}}
        (result,) = post_calls(tenants, token, call)
        assert not result.is_error, result
        return result

    assert not ask(TOKEN_A).cached
    assert ask(TOKEN_A).cached  # the cache is on: A's second ask is a hit
    assert not ask(TOKEN_C).cached  # another tenant with the same rights: no hit from A's entry
    assert not ask(TOKEN_B).cached
