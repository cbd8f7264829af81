"""Bounded memory for kept results, and the small odd requests of the security campaign."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import pytest
from mcp import Client

from protocol import decode_results
from tests.support.server import REPO, running_server, server_config
from tool_server.app import build_registry
from tool_server.config import load_config

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_kept_results_are_bounded_in_bytes_and_reported():
    budget = 400_000
    config = server_config(idempotency={"max_bytes": budget}, cache={"enabled": False})
    with running_server(config) as srv:
        ids = [uuid.uuid4().hex for _ in range(40)]
        calls = [{"call_id": i, "name": "big_output", "arguments": {"chars": 30_000}} for i in ids]
        for start in range(0, len(calls), 10):
            response = httpx.post(
                srv.url + "/v1/calls", json={"calls": calls[start : start + 10]}, timeout=30
            )
            assert not any(r.is_error for r in decode_results(response.content))
        text = httpx.get(srv.url + "/metrics").text
        held = metric(text, 'toolfactory_store_bytes{store="idempotency"}')
        entries = metric(text, 'toolfactory_store_entries{store="idempotency"}')
        assert 0 < held <= budget
        assert 0 < entries < len(ids)  # 40 results of ~30 KB do not fit in 400 KB: the oldest went
        # The newest result is still kept for a retry.
        replayed = httpx.post(srv.url + "/v1/calls", json={"calls": [calls[-1]]}).json()["results"][0]
        assert not replayed["is_error"]
        assert metric(httpx.get(srv.url + "/metrics").text, "toolfactory_idempotent_replays_total") == 1


@pytest.mark.parametrize("request_id", [{"a": 1}, [1], 1.5, True])
@pytest.mark.parametrize("version", [None, "2025-11-25", "2026-07-28"])
def test_json_rpc_request_with_an_id_of_the_wrong_type_gets_an_error_reply(server, request_id, version):
    headers = dict(MCP_HEADERS, **({"MCP-Protocol-Version": version} if version else {}))
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/list"}
    response = httpx.post(server.url + "/mcp", json=body, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32600


def test_mcp_call_id_and_session_in_meta_are_bounded_like_the_batch_api(server):
    async def scenario() -> list:
        async with Client(server.url + "/mcp", mode="2026-07-28") as client:
            metas = [
                {"toolfactory/call_id": "ok-" + uuid.uuid4().hex},
                {"toolfactory/call_id": "x" * 10_000},
                {"toolfactory/call_id": 5},
                {"toolfactory/session": ""},
            ]
            return [await client.call_tool("calculator", {"expression": "1+1"}, meta=m) for m in metas]

    ok, *refused = asyncio.run(scenario())
    assert not ok.is_error
    for result in refused:
        assert result.is_error and result.meta["toolfactory"]["error_kind"] == "bad_request"


@pytest.mark.parametrize("body", [b"[1,2]", b'"s"', b"3", b'{"session": 5}', b'{"session": ""}'])
def test_create_session_refuses_a_body_that_is_not_an_object_with_a_string_id(server, body):
    response = httpx.post(
        server.url + "/v1/sessions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["kind"] == "bad_request"


@pytest.mark.parametrize("path", ["%2e%2e%2f", "a/b", "%2F", "x%00"])
def test_release_of_an_odd_session_id_is_a_plain_404(server, path):
    response = httpx.delete(f"{server.url}/v1/sessions/{path}", follow_redirects=False)
    assert response.status_code == 404 and response.json()["error"]["kind"] == "unknown_session"


@pytest.mark.parametrize("path", [None, REPO / "compose" / "config.yaml"])
def test_shipped_configs_serve_no_test_tools(path):
    # sleep (600 s), big_output (50 M characters), echo, count and fail are for tests only.
    registry = build_registry(load_config(path, environ={}))
    assert not {"echo", "echo_async", "sleep", "count", "fail", "big_output"} & set(registry.entries)
    assert {"calculator", "search", "python"} <= set(registry.entries)
