"""Upstream MCP servers through ``UpstreamServer``: a real third-party server over stdio
(``mcp-server-time`` from PyPI), SDK servers in subprocesses and on loopback HTTP,
crashes, restarts, timeouts and configuration errors."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse

from protocol import META_KEY, ErrorKind, ToolMeta
from tests.support.openai_server import dead_url, serve_in_thread
from tool_server.upstream.hosting import (
    HttpSpec,
    StdioSpec,
    UpstreamServer,
    load_upstreams,
    parse_spec,
    relevant_stderr,
)

pytestmark = pytest.mark.timeout(120)

VENV_BIN = Path(sys.executable).parent
TIME_SERVER = shutil.which("mcp-server-time") or str(VENV_BIN / "mcp-server-time")
FAST = {"restart_backoff": (0.1, 1.0), "connect_timeout_s": 20.0}

# A small MCP server of our own, run as a real stdio subprocess: a slow tool for timeouts,
# and a tool whose name is not a valid MCP tool name (it must be re-exported sanitised).
SDK_SERVER = """
import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("slowpoke")

@server.tool(description="Sleep, then say so.")
async def sleep(seconds: float) -> str:
    await anyio.sleep(seconds)
    return f"slept {seconds}"

@server.tool(name="shout out", description="Upper-case the text.")
def shout(text: str) -> str:
    return text.upper()

server.run()
"""


# A server on the legacy-era SDK (1.x), which knows only the initialize handshake.
LEGACY_SERVER = """
from mcp.server.fastmcp import Context, FastMCP

mcp = FastMCP("legacy")

@mcp.tool()
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.\"\"\"
    return a + b

@mcp.tool()
async def grow(name: str, ctx: Context) -> str:
    \"\"\"Add a tool, and send notifications/tools/list_changed.\"\"\"
    mcp.add_tool(lambda: f"hello from {name}", name=name, description="Added at run time.")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"

mcp.run()
"""
UPSTREAM_VENV_SCRIPT = Path(__file__).resolve().parents[2] / "support" / "upstream_venv.sh"


def children(parent: int | None = None) -> set[int]:
    """Live child processes of this test process (read from /proc)."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


async def wait_until(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await anyio.sleep(0.05)


@pytest.fixture
def sdk_server_script(tmp_path: Path) -> Path:
    path = tmp_path / "slowpoke.py"
    path.write_text(SDK_SERVER)
    return path


@pytest.fixture
async def time_server() -> Any:
    before = children()
    up = UpstreamServer(
        "time", {"command": TIME_SERVER, "args": ["--local-timezone", "UTC"]}, call_timeout_s=10, **FAST
    )
    await up.start()
    yield up, children() - before, before
    await up.stop()


# ----------------------------------------------------------------------- config


def test_spec_shapes_of_desktop_clients() -> None:
    stdio = parse_spec("t", {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}})
    assert stdio == StdioSpec("uvx", ["mcp-server-time"], {"TZ": "UTC"})
    http = parse_spec("d", {"url": "http://127.0.0.1:9/mcp", "headers": {"X-K": "v"}})
    assert http == HttpSpec("http://127.0.0.1:9/mcp", {"X-K": "v"})
    assert isinstance(parse_spec("d", {"type": "http", "url": "https://x/mcp"}), HttpSpec)


def test_environment_references_are_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_TOKEN", "s3cret")
    spec = parse_spec("d", {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${UPSTREAM_TOKEN}"}})
    assert spec.headers == {"Authorization": "Bearer s3cret"}
    monkeypatch.delenv("UPSTREAM_TOKEN")
    with pytest.raises(
        ValueError, match=r"mcpServers\.d\.headers\.Authorization refers to \$\{UPSTREAM_TOKEN\}"
    ):
        parse_spec("d", {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${UPSTREAM_TOKEN}"}})


def test_environment_references_with_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # Claude Code's ${NAME:-default}; before, it was passed on as literal text.
    entry = {"command": "x", "args": ["--tz=${UPSTREAM_TZ:-UTC}"], "env": {"LEVEL": "${UPSTREAM_LEVEL:-}"}}
    monkeypatch.delenv("UPSTREAM_TZ", raising=False)
    monkeypatch.setenv("UPSTREAM_LEVEL", "debug")
    spec = parse_spec("t", entry)
    assert spec.args == ["--tz=UTC"] and spec.env == {"LEVEL": "debug"}
    monkeypatch.setenv("UPSTREAM_TZ", "Asia/Tokyo")
    monkeypatch.setenv("UPSTREAM_LEVEL", "")  # set but empty takes the default, as in a shell
    spec = parse_spec("t", entry)
    assert spec.args == ["--tz=Asia/Tokyo"] and spec.env == {"LEVEL": ""}


@pytest.mark.parametrize("reference", ["${UPSTREAM TZ}", "${1TZ}", "${TZ:=UTC}", "${}"])
def test_environment_references_that_mean_nothing_are_refused(reference: str) -> None:
    # Before: passed on to the server as literal text, to fail there with a puzzling message.
    with pytest.raises(ValueError, match=r"mcpServers\.t\.args .*\$\{NAME\}"):
        parse_spec("t", {"command": "x", "args": [f"--tz={reference}"]})


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({}, "needs 'command'"),
        ("mcp-server-time", "must be an object"),
        ({"command": ""}, "command must be a non-empty string"),
        ({"command": "x", "args": "a b"}, "args must be a list"),
        ({"command": "x", "comand": "y"}, "unknown keys ['comand']"),
        ({"command": "x", "type": "websocket"}, "type must be stdio, http or streamable-http"),
        ({"command": "x", "url": "http://h/mcp"}, "both 'command' (stdio) and 'url' (HTTP)"),
        ({"type": "stdio", "command": "x", "url": "http://h/mcp"}, "unknown keys ['url']"),
        ({"url": "ftp://h/mcp"}, "must be an http(s) URL"),
        ({"type": "sse", "url": "http://h/sse"}, "SSE transport is not supported"),
        ({"url": "http://h/mcp", "env": {}}, "unknown keys ['env']"),
    ],
)
def test_bad_specs_name_server_and_key(spec: Any, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_spec("srv", spec)
    assert "mcpServers.srv" in str(err.value) and needle in str(err.value)


def test_load_upstreams_applies_overrides_and_skips_disabled() -> None:
    servers = load_upstreams(
        {
            "time": {"command": "mcp-server-time", "namespace": "clock", "call_timeout_s": 3},
            "off": {"command": "x", "disabled": True},
            "web": {"url": "http://127.0.0.1:9/mcp", "restart_backoff": [1, 4]},
        },
        separator="__",
    )
    assert [s.name for s in servers] == ["time", "web"]
    assert servers[0].qualified("now") == "clock__now" and servers[0].call_timeout_s == 3
    assert servers[1].restart_backoff == (1.0, 4.0) and servers[1].transport == "http"
    with pytest.raises(ValueError, match="must match"):
        UpstreamServer("bad name", {"command": "x"})


@pytest.mark.parametrize(
    ("option", "needle"),
    [
        ({"restart_backoff": ["1s", 5]}, "restart_backoff must be [first, max]"),
        ({"restart_backoff": [5, 1]}, "restart_backoff must be [first, max]"),
        ({"health_interval_s": "30"}, "health_interval_s must be a positive number of seconds or null"),
        ({"namespace": 5}, "namespace must be a string"),
        ({"separator": None}, "separator must be a string"),
        ({"required": "no"}, "required must be true or false"),
        ({"per_session": "false"}, "per_session must be true or false"),
        ({"session_meta": 0}, "session_meta must be true or false"),
        ({"disabled": "no"}, "disabled must be true or false"),
        ({"max_sessions_per_tenant": 0}, "max_sessions_per_tenant must be a positive integer (or null)"),
    ],
)
def test_options_of_the_wrong_type_are_config_errors(option: dict[str, Any], needle: str) -> None:
    # Before: a TypeError (a traceback, not a config error), or "no" read as true.
    with pytest.raises(ValueError) as err:
        load_upstreams({"t": {"command": "x", **option}})
    assert f"mcpServers.t.{needle}" in str(err.value)


# --------------------------------------------------------- a real PyPI MCP server


async def test_lists_and_calls_a_third_party_server(time_server: Any) -> None:
    up, pids, _ = time_server
    assert up.healthy and len(pids) == 1
    assert up.status()["protocol_version"] == "2026-07-28"
    tools = {t["name"]: t for t in up.tools}
    assert set(tools) == {"time__get_current_time", "time__convert_time"}
    current = tools["time__get_current_time"]
    assert current["inputSchema"]["required"] == ["timezone"]
    assert "datetime" in current["outputSchema"]["properties"]
    assert current["annotations"]["readOnlyHint"] is True
    meta = current["_meta"][META_KEY]
    assert meta["kind"] == "upstream" and meta["upstream"] == "time" and meta["idempotent"] is True
    assert up.local_name("time__get_current_time") == "get_current_time"
    assert up.local_name("other__get_current_time") is None

    now = await up.call("get_current_time", {"timezone": "UTC"}, call_id="c1")
    assert not now.is_error and now.call_id == "c1"
    assert now.structured["timezone"] == "UTC"
    stamp = datetime.fromisoformat(now.structured["datetime"])
    assert abs(stamp.timestamp() - time.time()) < 120
    assert '"timezone": "UTC"' in now.text  # the upstream's own text block, passed through

    converted = await up.call(
        "convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    )
    assert converted.structured["time_difference"] == "+9.0h"
    assert converted.structured["target"]["datetime"].endswith("21:00:00+09:00")


async def test_upstream_errors_become_results(time_server: Any) -> None:
    up, _, _ = time_server
    bad_zone = await up.call("get_current_time", {"timezone": "Mars/Olympus"})
    assert bad_zone.is_error and bad_zone.error.kind == ErrorKind.TOOL_ERROR
    assert "Invalid timezone" in bad_zone.text
    unknown = await up.call("get_weather", {})
    assert unknown.is_error and unknown.error.kind == ErrorKind.UNKNOWN_TOOL
    assert "no tool named 'get_weather'" in unknown.error.message
    assert up.healthy  # none of this hurt the connection


async def test_killed_subprocess_is_restarted(time_server: Any) -> None:
    up, pids, before = time_server
    (reaper,) = pids
    (pid,) = children(reaper)  # the server itself, under its reaper (tool_server/upstream/reaper.py)
    os.kill(pid, signal.SIGKILL)
    during = await up.call("get_current_time", {"timezone": "UTC"})
    assert during.is_error and during.error.kind == ErrorKind.UNAVAILABLE
    assert "'time'" in during.error.message

    await wait_until(lambda: up.healthy)
    status = up.status()
    assert status["restarts"] == 1 and status["state"] == "ready"
    assert "connection" in status["last_error"] or "closed" in status["last_error"]
    replacement = children() - before
    assert len(replacement) == 1 and reaper not in replacement  # one new process took the dead one's place
    after = await up.call("get_current_time", {"timezone": "Europe/Paris"})
    assert not after.is_error and after.structured["timezone"] == "Europe/Paris"


async def test_hung_subprocess_is_found_by_the_health_probe_and_replaced() -> None:
    before = children()
    up = UpstreamServer(
        "time",
        {"command": TIME_SERVER},
        health_interval_s=0.3,
        connect_timeout_s=1.0,
        restart_backoff=(0.1, 1.0),
    )
    await up.start()
    try:
        (reaper,) = children() - before
        (pid,) = children(reaper)  # the server runs under its reaper (tool_server/upstream/reaper.py)
        os.kill(pid, signal.SIGSTOP)  # alive, pipes open, but it answers nothing
        await wait_until(lambda: up.status()["restarts"] >= 1 and up.healthy, timeout_s=30)
        assert up.status()["last_error"].startswith("health check failed: no answer to tools/list within 1 s")
        await wait_until(lambda: not Path(f"/proc/{pid}").exists())  # the hung process was killed, not leaked
        assert not (await up.call("get_current_time", {"timezone": "UTC"})).is_error
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        await up.stop()


async def test_calls_during_a_restart_fail_fast() -> None:
    # A long backoff: if calls waited for the reconnect, they could not finish before it.
    up = UpstreamServer("time", {"command": TIME_SERVER}, restart_backoff=(60.0, 60.0))
    before = children()
    await up.start()
    try:
        (pid,) = children() - before
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: not up.healthy)
        results = [await up.call("get_current_time", {"timezone": "UTC"}) for _ in range(20)]
        assert all(r.error is not None and r.error.kind == ErrorKind.UNAVAILABLE for r in results)
        assert "restarting" in results[0].error.message
        assert up.status()["state"] == "restarting" and up.status()["restarts"] == 0  # still backing off
    finally:
        await up.stop()  # interrupts the backoff


async def test_stop_ends_the_subprocess() -> None:
    before = children()
    up = UpstreamServer("time", {"command": TIME_SERVER})
    await up.start()
    assert len(children() - before) == 1
    await up.stop()
    assert children() - before == set()
    assert up.status()["state"] == "stopped"
    stopped = await up.call("get_current_time", {"timezone": "UTC"})
    assert stopped.error.kind == ErrorKind.UNAVAILABLE


@pytest.fixture(scope="module")
def legacy_python() -> str:
    """The python of .cache/upstream-venv (MCP SDK 1.x), created on first use (needs PyPI)."""
    done = subprocess.run(["bash", str(UPSTREAM_VENV_SCRIPT)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.skip(f"cannot create the legacy MCP venv (no package index?): {done.stderr[-500:]}")
    return done.stdout.strip().splitlines()[-1]


async def test_legacy_sdk_server_is_reached_through_the_handshake(legacy_python: str, tmp_path: Path) -> None:
    script = tmp_path / "legacy.py"
    script.write_text(LEGACY_SERVER)
    spec = {"command": legacy_python, "args": [str(script)]}
    up = UpstreamServer("legacy", spec, health_interval_s=None, **FAST)  # no probe: changes are announced
    before = children()
    await up.start()
    try:
        assert up.healthy, up.status()
        assert up.status()["protocol_version"] == "2025-11-25"  # not the stateless 2026-07-28
        assert [t["name"] for t in up.tools] == ["legacy__add", "legacy__grow"]
        added = await up.call("add", {"a": 2, "b": 3})
        assert added.text == "5" and added.structured == {"result": 5}
        assert (await up.call("grow", {"name": "extra"})).text == "added extra"
        await wait_until(lambda: "legacy__extra" in {t["name"] for t in up.tools})
        assert (await up.call("extra", {})).text == "hello from extra"

        # It printed a validation error for our server/discover probe, and an INFO line per
        # request; when it dies, last_error quotes what it said since it came up, minus chatter.
        (pid,) = children() - before
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: up.status()["restarts"] >= 1)
        assert up.status()["last_error"] == "the connection ended (process exited?)"
    finally:
        await up.stop()


def test_stderr_excerpt_leaves_out_chatter_and_our_probe() -> None:
    stderr = (
        "[11/23/26 13:59:01] INFO     Processing request of type ListToolsRequest\n"
        "Failed to validate request: 2 validation errors for ClientRequest\n"
        "PingRequest.method\n"
        "  Input should be 'ping' [type=literal_error, input_value='server/discover', input_type=str]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/literal_error\n"
        "InitializeRequest.params.protocolVersion\n"
        "  Field required [type=missing, input_value={'_meta': {}}, input_type=dict]\n"
        "INFO:root:listening\n"
        "2026-11-23 14:19:14,476 DEBUG asyncio: using selector\n"
        "Processing request of type CallToolRequest\n"
        "Traceback (most recent call last):\n"
        '  File "server.py", line 3, in <module>\n'
        "KeyError: 'DATABASE_URL'\n"
    )
    assert relevant_stderr(stderr) == (
        "Traceback (most recent call last): File \"server.py\", line 3, in <module> KeyError: 'DATABASE_URL'"
    )


# ---------------------------------------------------------------- broken servers


async def test_missing_command_is_unavailable_with_a_clear_message() -> None:
    up = UpstreamServer("ghost", {"command": "no-such-mcp-server-xyz"}, **FAST)
    await up.start()
    try:
        assert not up.healthy and up.tools == []
        result = await up.call("anything", {})
        assert result.is_error and result.error.kind == ErrorKind.UNAVAILABLE
        assert "command 'no-such-mcp-server-xyz' not found" in result.error.message
        await wait_until(lambda: up.status()["restarts"] >= 2)  # it keeps trying, backing off
    finally:
        await up.stop()


async def test_server_that_crashes_at_start_reports_its_stderr() -> None:
    script = "import sys; sys.stderr.write('fatal: no config file\\n'); sys.exit(3)"
    up = UpstreamServer("crashy", {"command": sys.executable, "args": ["-c", script]}, **FAST)
    await up.start()
    try:
        assert not up.healthy
        assert "fatal: no config file" in up.status()["last_error"]
        assert "during the handshake" in up.status()["last_error"]
    finally:
        await up.stop()


async def test_call_timeout_gives_a_timeout_result(sdk_server_script: Path) -> None:
    up = UpstreamServer("slow", {"command": sys.executable, "args": [str(sdk_server_script)]}, **FAST)
    await up.start()
    try:
        assert {t["name"] for t in up.tools} == {"slow__sleep", "slow__shout_out"}
        late = await up.call("sleep", {"seconds": 30}, timeout_s=0.5)
        assert late.is_error and late.error.kind == ErrorKind.TIMEOUT
        assert "0.5 s" in late.error.message
        quick = await up.call("sleep", {"seconds": 0.01}, timeout_s=5)
        assert quick.text == "slept 0.01"
        shouted = await up.call("shout_out", {"text": "hi"})  # sanitised name maps back to "shout out"
        assert shouted.text == "HI"
        assert up.healthy
    finally:
        await up.stop()


# ---------------------------------------------------------------- HTTP transport


def sdk_http_app(required_token: str | None = None) -> Any:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("web")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    @server.tool(description="Sleep, then say so.")
    async def sleep(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "done"

    app = server.streamable_http_app()
    if required_token is None:
        return app

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and Request(scope).headers.get("authorization") != f"Bearer {required_token}"
        ):
            await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


@pytest.fixture
def http_upstream() -> Iterator[str]:
    with serve_in_thread(sdk_http_app()) as url:
        yield url + "/mcp"


async def test_http_transport_lists_calls_and_times_out(http_upstream: str) -> None:
    up = UpstreamServer("web", {"url": http_upstream}, namespace="w", separator="_", **FAST)
    await up.start()
    try:
        assert up.healthy and up.transport == "http"
        assert {t["name"] for t in up.tools} == {"w_add", "w_sleep"}
        added = await up.call("add", {"a": 2, "b": 40})
        assert not added.is_error and added.structured == {"sum": 42}
        late = await up.call("sleep", {"seconds": 20}, timeout_s=0.5)
        assert late.error.kind == ErrorKind.TIMEOUT
        assert (await up.call("add", {"a": 1, "b": 1})).structured == {"sum": 2}
    finally:
        await up.stop()


async def test_http_headers_are_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEB_TOKEN", "t0k")
    with serve_in_thread(sdk_http_app(required_token="t0k")) as url:
        good = UpstreamServer(
            "web", {"url": url + "/mcp", "headers": {"Authorization": "Bearer ${WEB_TOKEN}"}}
        )
        bare = UpstreamServer("bare", {"url": url + "/mcp"}, **FAST)
        await good.start()
        await bare.start()
        try:
            assert good.healthy
            assert (await good.call("add", {"a": 1, "b": 2})).structured == {"sum": 3}
            assert not bare.healthy and bare.status()["last_error"]
            assert (await bare.call("add", {"a": 1, "b": 2})).error.kind == ErrorKind.UNAVAILABLE
        finally:
            await good.stop()
            await bare.stop()


async def test_http_upstream_going_away_and_coming_back() -> None:
    url = dead_url()
    port = int(url.rsplit(":", 1)[1])
    up = UpstreamServer("web", {"url": url + "/mcp"}, health_interval_s=0.2, **FAST)
    await up.start()
    try:
        assert not up.healthy
        assert "cannot reach upstream 'web'" in up.status()["last_error"]
        with serve_in_thread(sdk_http_app(), port=port):
            await wait_until(lambda: up.healthy)
            assert (await up.call("add", {"a": 3, "b": 4})).structured == {"sum": 7}
        await wait_until(lambda: not up.healthy)  # noticed by the health probe, before any call
        gone = await up.call("add", {"a": 3, "b": 4})
        assert gone.is_error and gone.error.kind == ErrorKind.UNAVAILABLE
        assert not up.healthy
        with serve_in_thread(sdk_http_app(), port=port):
            await wait_until(lambda: up.healthy)
            assert (await up.call("add", {"a": 5, "b": 5})).structured == {"sum": 10}
        assert up.status()["restarts"] >= 2
    finally:
        await up.stop()


def test_registry_follows_the_upstream_tool_lists() -> None:
    # The registry side of late registration: tools appear, and tools an upstream stops
    # offering disappear (from toolsets and listings too), others stay. A configured tool
    # keeps its name; between upstreams the one listed first wins, whatever order they come in.
    from tool_server.registry import Registry, ToolEntry
    from tool_server.upstream.hosting import Upstreams
    from tool_server.upstream.tools import build_catalog

    files, other = (UpstreamServer(n, {"command": "x"}, namespace="files") for n in ("files", "other"))

    def offer(server: UpstreamServer, *names: str) -> None:
        server._catalog = build_catalog(
            server, [{"name": n, "inputSchema": {"type": "object"}} for n in names]
        )
        server.tools_changed()

    registry = Registry()
    registry.add(ToolEntry("files__mine", ToolMeta(), "", {}, None, dict, print, False, toolsets={"default"}))
    upstreams = Upstreams([files, other], registry, ["default"])
    changes: list[int] = []
    upstreams.listeners.append(lambda: changes.append(registry.version))
    offer(other, "read", "ping")  # the later server comes up first and takes files__read
    offer(files, "read", "list", "mine")
    assert registry.get("files__read").upstream is files and registry.get("files__ping").upstream is other
    assert registry.get("files__mine").upstream is None
    assert upstreams.clashes(files) == [
        "'files__mine' (tool 'mine') clashes with the configured tool of that name; not exposed: "
        "give mcpServers.files a namespace, or the tool another name"
    ]
    assert upstreams.clashes(other) == [
        "'files__read' (tool 'read') clashes with the same name from upstream 'files', listed earlier in "
        "mcpServers; not exposed: give mcpServers.other another namespace"
    ]
    version = registry.version

    offer(files, "list", "stat")  # read goes: other's read takes the name back
    assert set(registry.entries) == {
        "files__mine",
        "files__list",
        "files__stat",
        "files__read",
        "files__ping",
    }
    assert registry.get("files__read").upstream is other and upstreams.clashes(other) == []
    assert registry.toolsets["upstream:files"] == {"files__list", "files__stat"}
    assert registry.version > version  # cached MCP listings are rebuilt
    version = registry.version
    offer(files, "list", "stat")  # the same list again changes nothing, and tells nobody
    assert registry.version == version and changes[-1] == version and len(changes) == 3
