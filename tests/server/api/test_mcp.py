"""The MCP endpoint with the official SDK client, in the stateless 2026-07-28 and legacy modes."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from mcp import Client

MODES = ["2026-07-28", "legacy"]


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("mode", MODES)
def test_list_tools_with_input_and_output_schemas(server, mode):
    async def scenario():
        async with Client(server.url + "/mcp", mode=mode) as client:
            default = (await client.list_tools()).tools
            async with Client(server.url + "/mcp/test", mode=mode) as test_client:
                test = (await test_client.list_tools()).tools
            return default, test

    default, test = run(scenario())
    assert [t.name for t in default] == ["calculator"]
    calculator = default[0]
    assert calculator.input_schema["properties"]["expression"]["type"] == "string"
    assert calculator.meta["toolfactory"]["kind"] == "program"
    echo = next(t for t in test if t.name == "echo")
    assert echo.output_schema is not None and echo.output_schema["type"] == "object"
    assert {"echo", "sleep", "count"} <= {t.name for t in test}


@pytest.mark.parametrize("mode", MODES)
def test_call_success_structured_and_error(server, mode):
    async def scenario():
        async with Client(server.url + "/mcp/test", mode=mode) as client:
            ok = await client.call_tool("echo", {"text": "hello", "data": {"k": [1, 2]}})
            failed = await client.call_tool("fail", {"message": "nope"})
            bad_args = await client.call_tool("sleep", {"seconds": "long"})
            unknown = await client.call_tool("calculator", {"expression": "1+1"})  # not in the test toolset
            return ok, failed, bad_args, unknown

    ok, failed, bad_args, unknown = run(scenario())
    assert not ok.is_error
    assert ok.structured_content == {"text": "hello", "data": {"k": [1, 2]}}
    assert '"hello"' in ok.content[0].text
    assert failed.is_error and "nope" in failed.content[0].text
    assert failed.meta["toolfactory"]["error_kind"] == "tool_error"
    assert bad_args.is_error and bad_args.meta["toolfactory"]["error_kind"] == "invalid_arguments"
    assert unknown.is_error and unknown.meta["toolfactory"]["error_kind"] == "unknown_tool"


@pytest.mark.parametrize("mode", MODES)
def test_session_id_travels_in_meta_and_call_id_is_idempotent(server, mode):
    async def scenario():
        async with Client(server.url + "/mcp/test", mode=mode) as client:
            meta = {"toolfactory/session": f"mcp-session-{mode}", "toolfactory/call_id": f"mcp-call-{mode}"}
            first = await client.call_tool("count", {"key": f"mcp-{mode}"}, meta=meta)
            again = await client.call_tool("count", {"key": f"mcp-{mode}"}, meta=meta)
            return first, again

    first, again = run(scenario())
    assert first.structured_content["count"] == 1
    assert again.structured_content["count"] == 1  # same call_id: stored result, tool not run again
    assert first.meta["toolfactory"]["call_id"] == f"mcp-call-{mode}"
    # The session was created by the call (stateful state lives server-side until released).
    released = httpx.delete(f"{server.url}/v1/sessions/mcp-session-{mode}")
    assert released.status_code == 200


def test_unknown_toolset_is_a_404_naming_the_known_ones(server):
    # Like GET /v1/tools?toolset=...: a typo is not an endpoint with no tools.
    response = httpx.post(
        server.url + "/mcp/verifier",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
    )
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert "no toolset named 'verifier'" in message and "test" in message
    listed = httpx.get(server.url + "/v1/tools", params={"toolset": "verifier"})
    assert listed.status_code == 404 and "no toolset named 'verifier'" in listed.json()["error"]["message"]


def test_unknown_tool_hint_names_only_this_endpoints_tools(server):
    async def scenario():
        async with Client(server.url + "/mcp", mode="2026-07-28") as client:
            return await client.call_tool("ech", {})

    result = run(scenario())
    assert result.is_error and result.meta["toolfactory"]["error_kind"] == "unknown_tool"
    assert "calculator" in result.content[0].text and "echo" not in result.content[0].text


def test_mcp_rejects_foreign_host_header(server):
    response = httpx.post(
        server.url + "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Host": "evil.example:80", "Accept": "application/json, text/event-stream"},
    )
    assert response.status_code in (403, 421)


def test_sdk_resolves_input_schemas_without_a_tools_list_per_call():
    # The SDK checks Mcp-Param headers of every tools/call against the tool's input
    # schema; without this hook it runs (and serialises) a whole tools/list to find it.
    from tests.support.server import server_config
    from tool_server.api.mcp import McpEndpoint
    from tool_server.api.queued_bytes import QueuedBytes
    from tool_server.app import build_registry
    from tool_server.config import config_from_dict
    from tool_server.executor.executor import Executor

    config = config_from_dict(server_config(), environ={})
    registry = build_registry(config)
    endpoint = McpEndpoint(Executor(registry, config), config, "127.0.0.1", QueuedBytes(config.limits))
    lookup = endpoint.server.get_tool_input_schema
    assert lookup("echo") == registry.entries["echo"].input_schema
    assert lookup("echo")["properties"]["text"]["type"] == "string"
    assert lookup("no_such_tool") is None


def test_results_convert_to_sdk_objects_for_every_block_kind():
    import mcp_types as types

    from protocol import Result
    from tool_server.api.mcp import _to_call_tool_result

    blocks = [
        {"type": "text", "text": "plain"},
        {"type": "text", "text": "noted", "annotations": {"priority": 0.5}},
        {"type": "image", "data": "aGk=", "mimeType": "image/png"},
    ]
    converted = _to_call_tool_result(Result("c1", blocks, structured=[1, 2]))
    text, annotated, image = converted.content
    assert isinstance(text, types.TextContent) and text.text == "plain"
    assert annotated.annotations is not None and annotated.annotations.priority == 0.5
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
    assert converted.structured_content == {"result": [1, 2]}  # MCP needs an object
    assert converted.meta["toolfactory"]["call_id"] == "c1"
    empty = _to_call_tool_result(Result("c2", []))
    assert [b.text for b in empty.content] == [""]


def test_calls_without_a_client_id_get_distinct_ids():
    from tests.support.server import server_config
    from tool_server.api.mcp import McpEndpoint
    from tool_server.api.queued_bytes import QueuedBytes
    from tool_server.app import build_registry
    from tool_server.config import config_from_dict
    from tool_server.executor.executor import Executor

    config = config_from_dict(server_config(), environ={})
    registry = build_registry(config)
    first = McpEndpoint(Executor(registry, config), config, "127.0.0.1", QueuedBytes(config.limits))
    second = McpEndpoint(Executor(registry, config), config, "127.0.0.1", QueuedBytes(config.limits))
    ids = {first._new_call_id() for _ in range(1000)} | {second._new_call_id() for _ in range(1000)}
    assert len(ids) == 2000
