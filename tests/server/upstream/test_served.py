"""Upstream MCP servers behind a real server: mcp-server-time from PyPI over stdio, an SDK
server over loopback HTTP, a missing one, and name clashes of both kinds."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from mcp import Client

from protocol import META_KEY, decode_results
from tests.server.upstream.test_proxying import sdk_http_app
from tests.support.openai_server import serve_in_thread
from tests.support.require import require_program
from tests.support.server import BASE_TOOLS, running_server, server_config

TIME_SERVER = shutil.which("mcp-server-time") or str(Path(sys.executable).parent / "mcp-server-time")
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
require_program(TIME_SERVER, "mcp-server-time (dev extra)")


def call(url: str, name: str, arguments: dict[str, Any]) -> Any:
    body = {"calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments}]}
    return decode_results(httpx.post(url + "/v1/calls", json=body, timeout=30).content)[0]


def wait_for(predicate: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"condition not reached in {timeout_s} s (last: {value!r})")


def test_upstream_tools_on_batch_api_mcp_readyz_and_metrics():
    with serve_in_thread(sdk_http_app()) as web_url:
        config = server_config(
            tools=[*BASE_TOOLS, {"target": "tools.testing:echo", "name": "time__convert_time"}],
            mcpServers={
                "time": {"command": TIME_SERVER, "args": ["--local-timezone", "UTC"]},
                "broken": {"command": "/nonexistent/mcp-server", "args": []},
                "web": {"url": web_url + "/mcp"},
                # Same names as 'time', listed after it (the config file is written with sorted keys).
                "time2": {"command": TIME_SERVER, "namespace": "time"},
            },
        )
        with running_server(config) as srv:
            wait_for(lambda: _up(srv.url) == ["time", "time2", "web"])
            tools = {t["name"]: t for t in httpx.get(srv.url + "/v1/tools?toolset=*").json()["tools"]}
            check_served_tools(srv.url, tools)
            check_calls(srv.url)
            check_readiness_and_clashes(srv.url)
            assert "HTTP Request:" not in srv.output  # httpx2's INFO line per upstream call is muted


def _up(url: str) -> list[str]:
    return httpx.get(url + "/readyz").json()["checks"]["upstreams"]["ready"]


def check_served_tools(url: str, tools: dict[str, Any]) -> None:
    assert all(OPENAI_NAME.match(name) for name in tools), sorted(tools)
    assert {"calculator", "time__get_current_time", "web__add", "web__sleep"} <= set(tools)
    current = tools["time__get_current_time"]
    # The descriptor is the upstream's own (built once): its annotations, its tool name in _meta.
    assert current["annotations"] == {
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    }
    meta = current["_meta"][META_KEY]
    assert meta["upstream"] == "time" and meta["upstream_tool"] == "get_current_time"
    assert "default" in meta["toolsets"] and "upstream:time" in meta["toolsets"]
    assert tools["time__convert_time"]["_meta"][META_KEY]["kind"] == "program"  # the configured tool kept it


def check_calls(url: str) -> None:
    now = call(url, "time__get_current_time", {"timezone": "UTC"})
    assert not now.is_error and "UTC" in now.text
    mars = call(url, "time__get_current_time", {"timezone": "Mars/Olympus"})
    assert mars.is_error and mars.error.kind == "tool_error"  # the upstream's own error, as a result
    assert call(url, "web__add", {"a": 2, "b": 40}).structured == {"sum": 42}

    # Arguments are checked against the upstream's inputSchema before anything is sent.
    missing = call(url, "time__get_current_time", {})
    assert missing.error.kind == "invalid_arguments"
    assert (
        missing.error.message
        == "invalid arguments for time__get_current_time: missing required argument 'timezone'"
    )
    wrong = call(url, "web__add", {"a": "two", "b": 40})
    assert (
        wrong.error.kind == "invalid_arguments"
        and "'a': 'two' is not of type 'integer'" in wrong.error.message
    )

    async def over_mcp() -> tuple[set[str], Any, Any]:
        async with Client(url + "/mcp", mode="2026-07-28") as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            good = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
            bad = await client.call_tool("time__get_current_time", {"timezone": 5})
            return listed, good, bad

    listed, good, bad = asyncio.run(over_mcp())
    assert "time__get_current_time" in listed and not good.is_error
    assert bad.is_error and bad.meta[META_KEY]["error_kind"] == "invalid_arguments"


def check_readiness_and_clashes(url: str) -> None:
    ready = httpx.get(url + "/readyz")
    # 'broken' is down but not required: reported, and the replica stays ready.
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert checks["upstream:time"]["healthy"] is True
    broken = checks["upstream:broken"]
    assert broken["healthy"] is False and broken["required"] is False and broken["ok"] is True
    assert "command '/nonexistent/mcp-server' not found" in broken["last_error"]
    assert checks["upstreams"]["down"] == ["broken"]

    # A configured tool keeps its name; the upstream listed first keeps a shared one.
    assert checks["upstream:time"]["clashes"] == [
        "'time__convert_time' (tool 'convert_time') clashes with the configured tool of that name; "
        "not exposed: give mcpServers.time a namespace, or the tool another name"
    ]
    assert checks["upstream:time2"]["clashes"] == [
        "'time__get_current_time' (tool 'get_current_time') clashes with the same name from upstream "
        "'time', listed earlier in mcpServers; not exposed: give mcpServers.time2 another namespace",
        "'time__convert_time' (tool 'convert_time') clashes with the configured tool of that name; "
        "not exposed: give mcpServers.time2 a namespace, or the tool another name",
    ]

    metrics = httpx.get(url + "/metrics").text
    assert 'toolfactory_upstream_up{server="time"} 1.0' in metrics
    assert 'toolfactory_upstream_up{server="broken"} 0.0' in metrics
