"""Overload (bounded queue → 429 / overloaded) and bearer-token auth, against real servers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import httpx
import httpx2
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from protocol import decode_results
from tests.support.server import REPO, running_server, server_config

TOKEN_ALL = "all-tools-token-0123456789"
TOKEN_MATH = "math-only-token-0123456789"


def test_batch_beyond_capacity_gets_429_with_retry_after_and_server_recovers():
    config = server_config(limits={"max_concurrency": 2, "max_queue": 3, "retry_after_s": 2})
    with running_server(config) as srv:

        async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
                slow = [
                    {"call_id": uuid.uuid4().hex, "name": "sleep", "arguments": {"seconds": 1.0}}
                    for _ in range(5)
                ]
                first = asyncio.create_task(client.post("/v1/calls", json={"calls": slow}))
                await asyncio.sleep(0.3)  # the first batch now holds all 5 places (2 running + 3 queued)
                extra = [{"call_id": uuid.uuid4().hex, "name": "echo_async", "arguments": {}}]
                rejected = await client.post("/v1/calls", json={"calls": extra})
                done = await first
                retried = await client.post("/v1/calls", json={"calls": extra})
                return rejected, done, retried

        rejected, done, retried = asyncio.run(scenario())
        assert rejected.status_code == 429
        assert rejected.headers["retry-after"] == "2"
        assert rejected.json()["error"]["kind"] == "overloaded"
        assert all(not r.is_error for r in decode_results(done.content))
        assert retried.status_code == 200 and not decode_results(retried.content)[0].is_error
        assert "toolfactory_rejected_batches_total 1.0" in httpx.get(srv.url + "/metrics").text


def test_auth_required_and_toolset_scoped_tokens():
    config = server_config(toolsets={"mathonly": ["calculator"]})
    env = {"TOOLFACTORY_TOKENS": f"{TOKEN_ALL},{TOKEN_MATH}:mathonly"}
    with running_server(config, env=env) as srv:
        call = {"call_id": uuid.uuid4().hex, "name": "echo", "arguments": {"text": "hi"}}
        anonymous = httpx.post(srv.url + "/v1/calls", json={"calls": [call]})
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.post(
            srv.url + "/v1/calls", json={"calls": [call]}, headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401
        assert httpx.get(srv.url + "/healthz").status_code == 200  # public
        ok = httpx.post(
            srv.url + "/v1/calls", json={"calls": [call]}, headers={"Authorization": f"Bearer {TOKEN_ALL}"}
        )
        assert ok.status_code == 200 and not decode_results(ok.content)[0].is_error

        math_headers = {"Authorization": f"Bearer {TOKEN_MATH}"}
        calls = [
            {"call_id": uuid.uuid4().hex, "name": "echo", "arguments": {}},
            {"call_id": uuid.uuid4().hex, "name": "calculator", "arguments": {"expression": "2**10"}},
        ]
        scoped = decode_results(
            httpx.post(srv.url + "/v1/calls", json={"calls": calls}, headers=math_headers).content
        )
        assert scoped[0].error.kind == "unknown_tool"  # echo does not exist for a math-only token
        assert scoped[1].structured["result"] == 1024
        listed = httpx.get(srv.url + "/v1/tools", params={"toolset": "*"}, headers=math_headers).json()
        assert [t["name"] for t in listed["tools"]] == ["calculator"]

        async def mcp_calls() -> None:
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN_ALL}"})
            transport = streamable_http_client(srv.url + "/mcp/test", http_client=http)
            async with http, Client(transport, mode="2026-07-28") as client:
                result = await client.call_tool("echo", {"text": "through mcp"})
                assert result.structured_content["text"] == "through mcp"

        asyncio.run(mcp_calls())
        unauthenticated_mcp = httpx.post(
            srv.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        )
        assert unauthenticated_mcp.status_code == 401


def test_auth_off_by_default_on_loopback(server):
    response = httpx.get(server.url + "/v1/tools")
    assert response.status_code == 200


def test_non_loopback_bind_without_tokens_is_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TOOLFACTORY_TOKENS": ""},
    )
    assert proc.returncode == 2
    assert "refusing to bind '0.0.0.0' (0.0.0.0) without auth" in proc.stderr and "--insecure" in proc.stderr


def test_short_tokens_are_a_configuration_error(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(server_config()))
    proc = subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "serve", "--port", "0", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TOOLFACTORY_TOKENS": "short"},
    )
    assert proc.returncode != 0
    assert "at least 16 characters" in proc.stderr
