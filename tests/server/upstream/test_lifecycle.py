"""Upstreams start in the background and join as they come up; slow, hung and late ones
hold up neither start-up nor shutdown. Real servers, real subprocesses."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest
from mcp import Client

from tests.server.upstream.test_proxying import children
from tests.server.upstream.test_served import call, wait_for
from tests.support.require import require_program
from tests.support.server import running_server, server_config

TIME_SERVER = shutil.which("mcp-server-time") or str(Path(sys.executable).parent / "mcp-server-time")
NOTEBOOK = str(Path(__file__).resolve().parents[2] / "support" / "notebook_upstream.py")
require_program(TIME_SERVER, "mcp-server-time (dev extra)")
pytestmark = [
    pytest.mark.timeout(180),
]


def test_an_upstream_that_comes_up_late_joins_without_anyone_polling(tmp_path: Path) -> None:
    backend = tmp_path / "backend-up"
    config = server_config(
        mcpServers={
            "notes": {
                "command": sys.executable,
                "args": [NOTEBOOK, "--wait-for", str(backend)],
                "restart_backoff": [0.2, 0.5],
            }
        }
    )
    with running_server(config) as srv:
        wait_for(lambda: "backend not ready" in srv.output)  # its first start failed
        assert call(srv.url, "notes__read", {}).error.kind == "unknown_tool"
        backend.touch()
        # Only calls and listings from here on: no /readyz or /metrics poll registers anything.
        wait_for(lambda: call(srv.url, "notes__read", {}).error is None, timeout_s=30)
        names = {t["name"] for t in httpx.get(srv.url + "/v1/tools").json()["tools"]}
        assert {"notes__read", "notes__write"} <= names

        async def listed() -> set[str]:
            async with Client(srv.url + "/mcp", mode="2026-07-28") as client:
                return {t.name for t in (await client.list_tools()).tools}

        assert "notes__write" in asyncio.run(listed())
        status = httpx.get(srv.url + "/readyz").json()["checks"]["upstream:notes"]
        assert status["restarts"] >= 1 and "backend not ready" in status["last_error"]


def test_slow_and_hung_upstreams_hold_up_neither_start_nor_shutdown(tmp_path: Path) -> None:
    hung = tmp_path / "hung.py"
    hung.write_text("import time\ntime.sleep(600)\n")  # starts, then never answers the handshake
    slow = tmp_path / "slow.py"
    slow.write_text(f"import os, time\ntime.sleep(4)\nos.execv({TIME_SERVER!r}, [{TIME_SERVER!r}])\n")
    config = server_config(
        mcpServers={
            # Required: the replica is not ready while it is still coming (nor when it is down).
            "hung": {
                "command": sys.executable,
                "args": [str(hung)],
                "connect_timeout_s": 60,
                "required": True,
            },
            "slow1": {"command": sys.executable, "args": [str(slow)]},
            "slow2": {"command": sys.executable, "args": [str(slow)]},
        }
    )
    launched = time.monotonic()
    with running_server(config) as srv:
        # Before: the upstreams started one after another inside the lifespan, so /healthz
        # answered only after 4 + 4 + 60 s. Now they start in the background.
        assert httpx.get(srv.url + "/healthz").status_code == 200
        assert time.monotonic() - launched < 20
        ready = httpx.get(srv.url + "/readyz")
        assert ready.status_code == 503
        summary = ready.json()["checks"]["upstreams"]
        assert "hung" in summary["starting"] and summary["required"] == ["hung"]
        assert ready.json()["checks"]["upstream:hung"]["ok"] is False

        # The slow ones join (side by side) while the hung one is still in its handshake.
        for name in ("slow1__get_current_time", "slow2__get_current_time"):
            wait_for(lambda name=name: call(srv.url, name, {"timezone": "UTC"}).error is None, 30)
        assert httpx.get(srv.url + "/readyz").json()["checks"]["upstreams"]["starting"] == ["hung"]

        upstream_pids = children(srv.proc.pid)
        assert len(upstream_pids) == 3
        stopping = time.monotonic()
        srv.proc.terminate()  # mid-handshake for 'hung'
        srv.proc.wait(30)
        # Before: 15 s waiting for the handshake to give up, then one upstream after another.
        assert time.monotonic() - stopping < 10
        assert not [pid for pid in upstream_pids if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
