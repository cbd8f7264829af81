"""A token scoped to some toolsets gets one answer for a tool outside them, on /v1/calls and on
/mcp alike, and that answer is the one for a tool that does not exist: it learns nothing about
which other tools the server has (issue 27, point 11)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from protocol import decode_results
from tests.support.server import running_server, server_config

pytestmark = pytest.mark.timeout(300)

TOKEN_ALL = "all-tools-token-0123456789"
TOKEN_MATH = "math-only-token-0123456789"


def http_answer(url: str, name: str) -> tuple[str, str]:
    call = {"call_id": uuid.uuid4().hex, "name": name, "arguments": {}}
    response = httpx.post(
        url + "/v1/calls",
        json={"calls": [call]},
        headers={"Authorization": f"Bearer {TOKEN_MATH}"},
        timeout=30,
    )
    (result,) = decode_results(response.content)
    assert result.is_error and result.error is not None
    return result.error.kind.value, result.error.message


def mcp_answer(url: str, name: str, mode: str) -> tuple[str, str]:
    async def call() -> Any:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN_MATH}"}, timeout=60) as http:
            transport = streamable_http_client(url + "/mcp", http_client=http)
            async with Client(transport, mode=mode) as client:  # type: ignore[arg-type]
                return await client.call_tool(name, {})

    answer = anyio.run(call)
    assert answer.is_error
    return answer.meta["toolfactory"]["error_kind"], answer.content[0].text


def test_a_tool_outside_the_tokens_toolsets_is_unknown_on_every_endpoint() -> None:
    config = server_config(toolsets={"mathonly": ["calculator"]})
    env = {"TOOLFACTORY_TOKENS": f"{TOKEN_ALL},{TOKEN_MATH}:mathonly"}
    with running_server(config, env=env) as srv:
        answers = {
            (endpoint, name): answer(srv.url, name)
            for name in ("echo", "no_such_tool")  # echo exists, outside the token's toolset
            for endpoint, answer in (
                ("/v1/calls", http_answer),
                ("/mcp 2026-07-28", lambda url, n: mcp_answer(url, n, "2026-07-28")),
                ("/mcp legacy", lambda url, n: mcp_answer(url, n, "legacy")),
            )
        }
    for (endpoint, name), (kind, message) in answers.items():
        assert kind == "unknown_tool", (endpoint, name, message)
        # The same words as for a tool that does not exist, naming only the token's own tools.
        other = answers[(endpoint, "no_such_tool")][1].replace("no_such_tool", name)
        assert message == other, (endpoint, message)
        assert message.endswith("available tools include: calculator"), (endpoint, message)
