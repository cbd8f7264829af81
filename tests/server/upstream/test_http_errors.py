"""An HTTP upstream that refuses us says why: a wrong token is named as the 401 it is, and a
legacy SSE endpoint is named as unsupported (at check-config for a ``.../sse`` URL, and at
connect for one that does not say it). Before, both were "Server returned an error response",
restarted forever; real servers on loopback, our UpstreamServer in front."""

from __future__ import annotations

import pytest
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.openai_server import serve_in_thread
from tool_server.upstream.hosting import UpstreamServer, parse_spec

pytestmark = pytest.mark.timeout(120)


async def refuse(request: Request) -> JSONResponse:
    return JSONResponse(
        {"error": "invalid_token"},
        status_code=401,
        headers={"www-authenticate": 'Bearer error="invalid_token", resource_metadata="/.well-known/x"'},
    )


async def test_a_wrong_token_is_named_as_the_servers_401() -> None:
    app = Starlette(routes=[Route("/mcp", refuse, methods=["GET", "POST", "DELETE"])])
    with serve_in_thread(app) as base:
        spec = {"url": base + "/mcp", "headers": {"Authorization": "Bearer wrong"}}
        up = UpstreamServer("guarded", spec, connect_timeout_s=20, restart_backoff=(30, 60))
        try:
            await up.start()
            assert not up.healthy
            assert up.last_error is not None
            assert up.last_error.startswith(
                f"upstream 'guarded' refused our credentials: HTTP 401 to POST {base}/mcp "
                '(WWW-Authenticate: Bearer error="invalid_token"'
            ), up.last_error
            assert "mcpServers.guarded.headers" in up.last_error
        finally:
            await up.stop()


def legacy_sse_app() -> object:
    legacy = MCPServer("legacy")

    @legacy.tool()
    def add(a: int, b: int) -> int:
        return a + b

    return legacy.sse_app()


def test_a_legacy_sse_url_is_refused_by_check_config() -> None:
    with pytest.raises(ValueError, match=r"ends in /sse, the legacy SSE transport, which is not supported"):
        parse_spec("old", {"url": "http://127.0.0.1:9/sse"})
    assert parse_spec("old", {"url": "http://127.0.0.1:9/sse", "type": "http"}).url.endswith("/sse")


async def test_a_legacy_sse_endpoint_is_named_at_connect() -> None:
    with serve_in_thread(legacy_sse_app()) as base:
        spec = {"url": base + "/sse", "type": "http"}  # said to be streamable HTTP: it is not
        up = UpstreamServer("old", spec, connect_timeout_s=20, restart_backoff=(30, 60))
        try:
            await up.start()
            assert not up.healthy and up.last_error is not None
            assert up.last_error.startswith(f"upstream 'old' answered HTTP 405 to POST {base}/sse"), (
                up.last_error
            )
            assert "legacy SSE endpoint (often .../sse) is not supported" in up.last_error
        finally:
            await up.stop()
