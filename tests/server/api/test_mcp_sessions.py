"""MCP clients that cannot set ``_meta`` get a world of their own, as desktop apps use MCP.

A desktop app, or an agent framework's stock MCP client, connects to a URL and calls
tools: it sets no ``_meta``. Such a client now gets a trajectory session (a world):

* handshake era: its MCP session's. ``initialize`` is answered with an ``Mcp-Session-Id``;
  the client's ``DELETE`` (sent when it closes) releases the world;
* either era: the session in the URL, ``/mcp/{toolset}/s/{session}``, bound to a task and
  released with ``/v1/sessions`` like any session.

Clients: the official SDK (2.x, both eras, used without ``_meta``), the 1.x SDK most
desktop apps and frameworks are built on (its own venv, as in test_proxying.py), and the
OpenAI Agents SDK's stock ``MCPServerStreamableHttp`` (no hooks).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client

from protocol import decode_results
from tests.support.require import require
from tests.support.server import BASE_TOOLS, ServerProcess, running_server, server_config

NOTEBOOK = {"target": "tests.support.stateful_tools:notebook", "toolsets": ["test"]}
CONFIG = server_config(
    tools=[*BASE_TOOLS, NOTEBOOK], environments=[{"source": "tests.support.env_pack:pack"}]
)
TOKEN_A = "tenant-a-token-0123456789"
TOKEN_B = "tenant-b-token-0123456789"
HANDSHAKE = "2025-11-25"
UPSTREAM_VENV_SCRIPT = Path(__file__).resolve().parents[2] / "support" / "upstream_venv.sh"
pytestmark = pytest.mark.timeout(300)

# The 1.x SDK's client as apps use it: connect, initialize, call, close (which sends DELETE).
SDK_1X_CLIENT = """
import asyncio, json, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

async def main(url):
    async with streamablehttp_client(url) as (read, write, session_id):
        async with ClientSession(read, write) as session:
            await session.initialize()
            lines = [(await session.call_tool("notebook", {"put": put})).structuredContent["lines"]
                     for put in ("1", "2")]
            print(json.dumps({"session": session_id(), "lines": lines}))

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    with running_server(CONFIG) as proc:
        yield proc


def notebook(result: Any) -> tuple[str, list[str]]:
    assert not result.is_error, result.content
    return result.structured_content["session"], result.structured_content["lines"]


def calls(url: str, *batch: dict[str, Any], token: str | None = None) -> list[Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.post(url + "/v1/calls", json={"calls": list(batch)}, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return decode_results(response.content)


def call(name: str, arguments: dict[str, Any], session: str | None = None) -> dict[str, Any]:
    return {"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}


def rpc(
    url: str, method: str, params: dict[str, Any], *, mcp_session: str | None = None, token: str | None = None
) -> httpx.Response:
    """One handshake-era JSON-RPC request, as a client without an SDK sends it."""
    headers = {"Accept": "application/json, text/event-stream"}
    if method != "initialize":
        headers["MCP-Protocol-Version"] = HANDSHAKE
    if mcp_session is not None:
        headers["Mcp-Session-Id"] = mcp_session
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return httpx.post(url, json=body, headers=headers, timeout=60)


def initialize(url: str, token: str | None = None) -> httpx.Response:
    params = {"protocolVersion": HANDSHAKE, "capabilities": {}, "clientInfo": {"name": "app", "version": "1"}}
    return rpc(url, "initialize", params, token=token)


def tool_result(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return response.json()["result"]


def error_kind(result: dict[str, Any]) -> str | None:
    return result["_meta"]["toolfactory"].get("error_kind")


# ------------------------------------------------------------------ handshake era


async def test_each_mcp_session_of_a_desktop_client_is_a_world_released_when_it_closes(
    srv: ServerProcess,
) -> None:
    async with (
        Client(srv.url + "/mcp/test", mode="legacy") as one,
        Client(srv.url + "/mcp/test", mode="legacy") as two,
    ):
        first = notebook(await one.call_tool("notebook", {"put": "a"}))
        second = notebook(await one.call_tool("notebook", {"put": "b"}))
        other = notebook(await two.call_tool("notebook", {"put": "c"}))
        echoed = await one.call_tool("echo", {"text": "x"})
    session = first[0]
    assert first == (session, ["a"]) and second == (session, ["a", "b"])  # one world per MCP session
    assert other[0] != session and other[1] == ["c"]  # and another for the other connection
    assert session.startswith("mcp-")
    assert "session" not in echoed.meta["toolfactory"]  # a stateless tool needs no world

    # Closing the client sent DELETE: the world is released, and stays released.
    gone = httpx.delete(f"{srv.url}/v1/sessions/{session}", timeout=30)
    assert gone.status_code == 404, gone.text
    (late,) = calls(srv.url, call("notebook", {"put": "late"}, session))
    assert late.error.kind == "unknown_session"


async def test_environment_tools_play_in_the_mcp_session(srv: ServerProcess) -> None:
    async with (
        Client(srv.url + "/mcp/shop", mode="legacy") as one,
        Client(srv.url + "/mcp/shop", mode="legacy") as two,
    ):
        cancelled = await one.call_tool("cancel_order", {"order_id": "o1"})  # bad_request before
        assert not cancelled.is_error, cancelled.content
        mine = await one.call_tool("get_order", {"order_id": "o1"})
        theirs = await two.call_tool("get_order", {"order_id": "o1"})
    assert mine.structured_content["status"] == "cancelled"
    assert theirs.structured_content["status"] == "pending"


@pytest.fixture(scope="module")
def sdk_1x_python() -> str:
    """The python of .cache/upstream-venv (MCP SDK 1.x), created on first use (needs PyPI)."""
    done = subprocess.run(["bash", str(UPSTREAM_VENV_SCRIPT)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.skip(f"cannot create the legacy MCP venv (no package index?): {done.stderr[-500:]}")
    return done.stdout.strip().splitlines()[-1]


def test_a_1x_sdk_client_keeps_its_world_and_releases_it_on_close(
    srv: ServerProcess, sdk_1x_python: str, tmp_path: Path
) -> None:
    script = tmp_path / "app.py"
    script.write_text(SDK_1X_CLIENT)
    done = subprocess.run(
        [sdk_1x_python, str(script), srv.url + "/mcp/test"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["lines"] == [["1"], ["1", "2"]]
    assert httpx.delete(f"{srv.url}/v1/sessions/{seen['session']}", timeout=30).status_code == 404


def test_an_mcp_session_id_the_server_did_not_issue_here_gets_no_empty_world(srv: ServerProcess) -> None:
    url = srv.url + "/mcp/test"
    issued = initialize(url).headers["mcp-session-id"]
    # Another process's id (a restarted replica, or another one behind a proxy): its world is lost.
    elsewhere = "mcp-0123456789abcdef-" + "0" * 24
    assert issued.split("-")[1] != "0123456789abcdef"
    lost = tool_result(rpc(url, "tools/call", {"name": "notebook", "arguments": {}}, mcp_session=elsewhere))
    assert error_kind(lost) == "unknown_session"
    assert "opened on instance 0123456789abcdef" in lost["content"][0]["text"]
    assert "Reconnect" in lost["content"][0]["text"]
    echoed = tool_result(rpc(url, "tools/call", {"name": "echo", "arguments": {}}, mcp_session=elsewhere))
    assert error_kind(echoed) is None  # stateless calls go on, on any replica
    # A released one stays released, and the message says what such a client can do.
    opened = tool_result(rpc(url, "tools/call", {"name": "notebook", "arguments": {}}, mcp_session=issued))
    assert opened["structuredContent"]["session"] == issued
    deleted = httpx.delete(url, headers={"Mcp-Session-Id": issued}, timeout=30)
    assert deleted.status_code == 200 and deleted.json() == {"session": issued, "released": True}
    late = tool_result(rpc(url, "tools/call", {"name": "notebook", "arguments": {}}, mcp_session=issued))
    assert error_kind(late) == "unknown_session" and "released or expired" in late["content"][0]["text"]
    assert "Reconnect" in late["content"][0]["text"]
    # No server-initiated stream on a stateless endpoint: 405, as the spec allows.
    stream = httpx.get(url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": issued}, timeout=30)
    assert stream.status_code == 405


def test_an_mcp_session_belongs_to_the_token_that_opened_it() -> None:
    env = {"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}
    with running_server(CONFIG, env=env) as srv:
        url = srv.url + "/mcp/test"
        a = initialize(url, TOKEN_A).headers["mcp-session-id"]
        put = {"name": "notebook", "arguments": {"put": "a's line"}}
        written = tool_result(rpc(url, "tools/call", put, mcp_session=a, token=TOKEN_A))
        assert written["structuredContent"]["lines"] == ["a's line"]
        # B with A's id: another tenant's session is an unknown one, to use or to close.
        read = {"name": "notebook", "arguments": {}}
        stolen = tool_result(rpc(url, "tools/call", read, mcp_session=a, token=TOKEN_B))
        assert error_kind(stolen) == "unknown_session"
        closed = httpx.delete(url, headers={"Mcp-Session-Id": a, "Authorization": f"Bearer {TOKEN_B}"})
        assert closed.status_code == 200 and closed.json()["released"] is False
        kept = tool_result(rpc(url, "tools/call", read, mcp_session=a, token=TOKEN_A))
        assert kept["structuredContent"]["lines"] == ["a's line"]


# ------------------------------------------------------------------ the session in the URL


async def test_the_session_in_the_url_is_bound_and_released_like_any_session(srv: ServerProcess) -> None:
    session = f"harness-{uuid.uuid4().hex}"
    bound = httpx.post(
        srv.url + "/v1/sessions",
        json={"session": session, "environment": {"pack": "shop", "task": "cancel_patched"}},
        timeout=30,
    )
    assert bound.status_code == 201, bound.text
    url = f"{srv.url}/mcp/shop/s/{session}"
    async with Client(url, mode="2026-07-28") as agent:
        seen = await agent.call_tool("get_order", {"order_id": "o9"})  # o9 exists in this task only
        assert seen.structured_content["status"] == "pending", seen.content
        assert not (await agent.call_tool("cancel_order", {"order_id": "o9"})).is_error
    async with Client(url, mode="legacy") as again:  # the same world in the handshake era
        seen = await again.call_tool("get_order", {"order_id": "o9"})
        assert seen.structured_content["status"] == "cancelled"
        assert seen.meta["toolfactory"]["session"] == session
    assert "mcp-session-id" not in initialize(url).headers  # the URL names the world: no MCP session
    async with Client(f"{srv.url}/mcp/shop/s/other-{uuid.uuid4().hex}", mode="2026-07-28") as unbound:
        missing = await unbound.call_tool("get_order", {"order_id": "o9"})
        assert missing.is_error  # a world from the pack's initial state: no o9 there

    assert httpx.delete(f"{srv.url}/v1/sessions/{session}", timeout=30).status_code == 200
    async with Client(url, mode="2026-07-28") as late:
        after = await late.call_tool("get_order", {"order_id": "o9"})
    assert after.is_error and after.meta["toolfactory"]["error_kind"] == "unknown_session"


def test_a_url_session_is_released_by_delete_on_its_url(srv: ServerProcess) -> None:
    session = f"s-{uuid.uuid4().hex}"
    url = f"{srv.url}/mcp/test/s/{session}"
    put = tool_result(rpc(url, "tools/call", {"name": "notebook", "arguments": {"put": "x"}}))
    assert put["structuredContent"] == {"session": session, "lines": ["x"]}
    deleted = httpx.delete(url, timeout=30)
    assert deleted.status_code == 200 and deleted.json() == {"session": session, "released": True}
    too_long = httpx.post(
        f"{srv.url}/mcp/test/s/{'x' * 300}", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    )
    assert too_long.status_code == 400 and "at most 256" in too_long.json()["error"]["message"]


async def test_a_stock_agent_framework_client_gets_its_world_from_the_url(srv: ServerProcess) -> None:
    """The OpenAI Agents SDK's MCP client, as its docs show it: a URL, no hooks, no ``_meta``."""
    agents_mcp = require("agents.mcp", reason="openai-agents (dev extra)")
    session = f"agent-{uuid.uuid4().hex}"
    params = {"url": f"{srv.url}/mcp/test/s/{session}"}
    async with agents_mcp.MCPServerStreamableHttp(params=params, name="toolfactory") as server:
        assert "notebook" in {tool.name for tool in await server.list_tools()}
        first = notebook(await server.call_tool("notebook", {"put": "plan"}))
        second = notebook(await server.call_tool("notebook", {"put": "act"}))
    assert first == (session, ["plan"]) and second == (session, ["plan", "act"])
    # The same client on the plain URL: no world carries over from one call to the next.
    async with agents_mcp.MCPServerStreamableHttp(params={"url": srv.url + "/mcp/test"}, name="tf") as plain:
        lone = [notebook(await plain.call_tool("notebook", {"put": p}))[1] for p in ("x", "y")]
    assert lone == [["x"], ["y"]]
