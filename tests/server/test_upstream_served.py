"""An upstream MCP server (mcp-server-time from PyPI, over stdio) behind our endpoints."""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from mcp import Client

from protocol import decode_results
from tests.support.server import running_server, server_config

TIME_SERVER = shutil.which("mcp-server-time") or str(Path(sys.executable).parent / "mcp-server-time")
pytestmark = pytest.mark.skipif(not Path(TIME_SERVER).exists(), reason="mcp-server-time is not installed")


def test_upstream_tools_on_batch_api_mcp_readyz_and_metrics():
    config = server_config(
        mcpServers={
            "time": {"command": TIME_SERVER, "args": ["--local-timezone", "UTC"]},
            "broken": {"command": "/nonexistent/mcp-server", "args": []},
        }
    )
    with running_server(config) as srv:
        tools = httpx.get(srv.url + "/v1/tools").json()["tools"]
        names = {t["name"] for t in tools}
        assert "time.get_current_time" in names and "calculator" in names
        calls = [
            {"call_id": uuid.uuid4().hex, "name": "time.get_current_time", "arguments": {"timezone": "UTC"}},
            {
                "call_id": uuid.uuid4().hex,
                "name": "time.get_current_time",
                "arguments": {"timezone": "Mars/Olympus"},
            },
        ]
        results = decode_results(httpx.post(srv.url + "/v1/calls", json={"calls": calls}, timeout=30).content)
        assert not results[0].is_error and "UTC" in results[0].text
        assert results[1].is_error  # the upstream's own error, as a result

        async def over_mcp():
            async with Client(srv.url + "/mcp", mode="2026-07-28") as client:
                listed = {t.name for t in (await client.list_tools()).tools}
                result = await client.call_tool("time.get_current_time", {"timezone": "UTC"})
                return listed, result

        listed, result = asyncio.run(over_mcp())
        assert "time.get_current_time" in listed and not result.is_error

        ready = httpx.get(srv.url + "/readyz")
        checks = ready.json()["checks"]
        assert checks["upstream:time"]["ok"] is True
        assert checks["upstream:broken"]["ok"] is False and checks["upstream:broken"]["last_error"]
        assert ready.status_code == 503  # one upstream is down: not ready, but still serving
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'toolfactory_upstream_up{server="time"} 1.0' in metrics
        assert 'toolfactory_upstream_up{server="broken"} 0.0' in metrics
