"""Verifiers on MCP take exactly what /v1/verify takes; a 401 on /mcp is a JSON-RPC error."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from protocol import VerifyRequest
from tests.support.server import ServerProcess, running_server, server_config

TOKEN = "verify-test-token-0123456789"


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    config = server_config(verifiers=[{"target": "tools.verifiers.match:exact_match"}])
    with running_server(config, env={"TOOLFACTORY_TOKENS": TOKEN}) as proc:
        yield proc


def mcp_client(srv: ServerProcess, path: str) -> tuple[httpx2.AsyncClient, Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"})
    return http, Client(streamable_http_client(srv.url + path, http_client=http), mode="2026-07-28")


def test_verify_tool_schema_is_the_verify_request_minus_its_name(srv):
    async def scenario():
        http, client = mcp_client(srv, "/mcp/verifiers")
        async with http, client:
            tools = (await client.list_tools()).tools
            messages = [
                {"role": "user", "content": "say 4 (the prompt: never the model's answer)"},
                {"role": "assistant", "content": "4"},
            ]
            scored = await client.call_tool(
                "verify_exact_match",
                {"messages": messages, "ground_truth": "4", "response_start": 1, "request_id": "r1"},
            )
            bad = await client.call_tool("verify_exact_match", {"response": "4", "response_begin": 1})
            past_end = await client.call_tool(
                "verify_exact_match", {"messages": messages, "response_start": 5}
            )
            return tools, scored, bad, past_end

    tools, scored, bad, past_end = asyncio.run(scenario())
    schema = next(t for t in tools if t.name == "verify_exact_match").input_schema
    expected = {f.name for f in dataclasses.fields(VerifyRequest)} - {"verifier"}
    assert set(schema["properties"]) == expected and schema["additionalProperties"] is False
    assert not scored.is_error and scored.structured_content["score"] == 1.0
    assert bad.is_error and bad.meta["toolfactory"]["error_kind"] == "invalid_arguments"
    assert "response_begin" in bad.content[0].text
    assert past_end.is_error and "response_start" in past_end.content[0].text


def test_a_401_on_mcp_is_a_json_rpc_error_the_client_can_show(srv):
    response = httpx.post(
        srv.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
    body = response.json()
    assert body["jsonrpc"] == "2.0" and "bearer token" in body["error"]["message"]

    async def without_token() -> str:
        async with Client(srv.url + "/mcp", mode="2026-07-28") as client:
            await client.list_tools()
        return ""

    with pytest.raises(Exception) as raised:
        asyncio.run(without_token())
    assert "bearer token" in repr(raised.value) or "bearer token" in str(raised.value.__cause__)
    # The batch API keeps its own error shape.
    assert httpx.get(srv.url + "/v1/tools").json()["error"]["kind"] == "unauthorized"
