"""Upstreams that misbehave, as real subprocesses (tests/support/unruly_upstream.py): slow to
exit, flooding stderr. Whatever they do, the server's own resources stay bounded."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path

import httpx
import pytest

from protocol import ErrorKind, SessionState, decode_results
from tests.server.upstream.test_proxying import children, wait_until
from tests.server.upstream.test_served import wait_for
from tests.support.server import running_server, server_config
from tool_server.upstream.hosting import UpstreamServer

pytestmark = pytest.mark.timeout(120)

UNRULY = str(Path(__file__).resolve().parents[2] / "support" / "unruly_upstream.py")


async def test_per_session_processes_stay_within_max_sessions_while_released_ones_stop() -> None:
    # Each released instance takes seconds to exit (it ignores SIGTERM until it is killed).
    # Before: a released instance left the count at once, so sessions opened meanwhile
    # started more processes than max_sessions while the released ones were still alive.
    before = children()
    up = UpstreamServer(
        "slow",
        {"command": sys.executable, "args": [UNRULY, "--linger", "30"]},
        per_session=True,
        max_sessions=2,
    )
    await up.start()
    try:
        (parent,) = children() - before  # the server's own process: it lists the tools
        seen: list[int] = []
        for number in range(3):
            session = SessionState(f"s{number}")
            result = await up.call("pid", {}, session=session)
            assert not result.is_error, result.text
            seen.append(len(children() - before - {parent}))
            await session.close()  # the instance stops in the background
        assert max(seen) <= 2, seen  # at most max_sessions per-session processes at any time
    finally:
        await up.stop()
    assert children() - before == set()


def _written(pid: int) -> int:
    """Bytes the process has written so far (its stdout and stderr included)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/PID/io")


async def test_a_stderr_flood_is_not_kept() -> None:
    # Before: stderr went to a temporary file trimmed once per health interval (30 s):
    # a flooding server filled the disk by gigabytes in between.
    up = UpstreamServer("loud", {"command": sys.executable, "args": [UNRULY, "--flood"]})
    await up.start()
    try:
        pid = (await up.call("pid", {})).structured["result"]
        await wait_until(lambda: _written(pid) > 256 << 20, timeout_s=60)
        stderr = os.stat(f"/proc/{pid}/fd/2")  # what the child writes its stderr to
        kept = stderr.st_size if stat.S_ISREG(stderr.st_mode) else 0  # a file keeps it all; a pipe does not
        assert kept < 2 << 20, f"{kept} bytes of stderr kept"
        assert (await up.call("sleep", {"seconds": 0})).text == "slept 0.0"  # still answering
    finally:
        await up.stop()


def test_a_schema_whose_ref_leads_nowhere_is_not_a_server_error() -> None:
    # lookup's inputSchema has {"$ref": "#/$defs/Item"} and no $defs. Before: checking the
    # arguments raised jsonschema's RefResolutionError, which no one caught: HTTP 500.
    config = server_config(mcpServers={"unruly": {"command": sys.executable, "args": [UNRULY]}})
    with running_server(config) as srv:
        wait_for(lambda: "unruly__lookup" in httpx.get(srv.url + "/v1/tools").text)
        body = {"calls": [{"call_id": "c1", "name": "unruly__lookup", "arguments": {"item": 7}}]}
        response = httpx.post(srv.url + "/v1/calls", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert decode_results(response.content)[0].text == "item 7"
        assert "inputSchema cannot be checked" in srv.output


async def test_a_cancelled_call_is_cancelled_upstream(tmp_path: Path) -> None:
    # The caller gives up (a client disconnects, a batch is cancelled), or the deadline
    # passes: the upstream's request is cancelled too; the connection stays up.
    log = tmp_path / "events"
    spec = {"command": sys.executable, "args": [UNRULY], "env": {"UNRULY_LOG": str(log)}}
    up = UpstreamServer("unruly", spec)
    await up.start()
    try:
        waiting = asyncio.create_task(up.call("sleep", {"seconds": 60}))
        await wait_until(lambda: log.exists() and "started" in log.read_text())
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await wait_until(lambda: "cancelled" in log.read_text())
        late = await up.call("sleep", {"seconds": 60}, timeout_s=0.5)  # so is one past its deadline
        assert late.error is not None and late.error.kind == ErrorKind.TIMEOUT
        await wait_until(lambda: log.read_text().count("cancelled") == 2)
        assert up.healthy and (await up.call("sleep", {"seconds": 0})).text == "slept 0.0"
    finally:
        await up.stop()


async def test_a_per_session_call_keeps_its_deadline_while_the_instance_starts() -> None:
    # The executor gives upstream calls no deadline of its own: call() must keep it.
    # Before: the first call of a session waited up to connect_timeout_s + 5 s for its
    # instance to start, then the whole call deadline again.
    spec = {"command": sys.executable, "args": [UNRULY, "--start-delay", "4"]}
    up = UpstreamServer("late", spec, per_session=True, connect_timeout_s=30)
    await up.start()
    session = SessionState("s")
    try:
        first = await up.call("pid", {}, timeout_s=1, session=session)
        assert first.error is not None and first.error.kind == ErrorKind.TIMEOUT, first.text
        assert "still starting" in first.error.message
        # The instance goes on starting for the session; a later call finds it up.
        await wait_until(lambda: session.data["upstream:late"].healthy, timeout_s=60)
        assert not (await up.call("pid", {}, timeout_s=5, session=session)).is_error
    finally:
        await session.close()
        await up.stop()


async def test_a_changed_tool_list_is_followed_at_once() -> None:
    # No health probe here: before, the list was read once, at connect, and the tool the
    # server added was never offered (with the default probe, up to 30 s later).
    up = UpstreamServer("unruly", {"command": sys.executable, "args": [UNRULY]}, health_interval_s=None)
    changes: list[set[str]] = []
    up.on_tools_changed = lambda server: changes.append({tool["name"] for tool in server.tools})
    await up.start()
    try:
        assert (await up.call("grow", {"name": "extra"})).text == "added extra"
        await wait_until(lambda: any("unruly__extra" in names for names in changes))
        assert (await up.call("extra", {})).text == "hello from extra"
        await up.call("grow", {"name": "another"})  # announced on the subscription, now surely up
        await wait_until(lambda: any("unruly__another" in names for names in changes))
    finally:
        await up.stop()


async def test_a_per_session_instance_slow_to_start_is_waited_for_not_given_up() -> None:
    # It needs longer than the pool waits for it (connect_timeout_s + 5 s). Before: the
    # call said "start a new session", though the instance went on starting for this one.
    spec = {"command": sys.executable, "args": [UNRULY, "--start-delay", "7"]}
    up = UpstreamServer("late", spec, per_session=True, connect_timeout_s=0.5, call_timeout_s=60)
    await up.start(wait=False)
    session = SessionState("s")
    try:
        first = await up.call("pid", {}, session=session)
        assert first.error is not None and first.error.kind == ErrorKind.UNAVAILABLE, first.text
        assert "still starting" in first.error.message and "new session" not in first.error.message
        await wait_until(lambda: session.data["upstream:late"].healthy, timeout_s=60)
        assert not (await up.call("pid", {}, session=session)).is_error
    finally:
        await session.close()
        await up.stop()


def test_limits_max_timeout_s_bounds_upstream_calls_too() -> None:
    # The upstream's own call timeout (call_timeout_s, 60 s) is above the server's ceiling on
    # any tool's timeout (limits.max_timeout_s, 1 s). Before: upstream calls were given their
    # own timeout unchanged, so a hung upstream call held its slot past the ceiling.
    config = server_config(
        limits={"max_timeout_s": 1},
        mcpServers={"unruly": {"command": sys.executable, "args": [UNRULY], "call_timeout_s": 60}},
    )
    with running_server(config) as srv:
        wait_for(lambda: "unruly__sleep" in httpx.get(srv.url + "/v1/tools").text)
        body = {"calls": [{"call_id": "c1", "name": "unruly__sleep", "arguments": {"seconds": 30}}]}
        response = httpx.post(srv.url + "/v1/calls", json=body, timeout=20)  # 30 s sleep: not waited for
        (result,) = decode_results(response.content)
        assert result.error is not None and result.error.kind == ErrorKind.TIMEOUT, result.text
