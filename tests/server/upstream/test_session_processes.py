"""What a ``per_session`` upstream starts ends with its session and with the server; its
instances are shared out between tenants.

tests/support/spawning_upstream.py starts, on request, a background child in its process
group and a daemon that left the group (``setsid``); both ignore SIGTERM. Before: releasing
the session stopped the server process only (it exits when its stdin closes, so its group
was never killed), and when the tool server was SIGKILLed nothing ended anything: both
processes lived on, an hour each. Per-session instances were first come, first served:
one token's idle sessions held them all, and another token's first call was ``overloaded``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol import Result, decode_results
from tests.server.upstream.test_served import wait_for
from tests.support.server import running_server, server_config

SUPPORT = Path(__file__).resolve().parents[2] / "support"
SPAWNING = str(SUPPORT / "spawning_upstream.py")
NOTEBOOK = str(SUPPORT / "notebook_upstream.py")
TOKEN_A = "per-session-tenant-a-0123456789"
TOKEN_B = "per-session-tenant-b-0123456789"

pytestmark = pytest.mark.timeout(240)


def call(url: str, name: str, session: str | None, token: str | None = None) -> Result:
    body = {"calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": {}, "session": session}]}
    response = httpx.post(url + "/v1/calls", json=body, headers=auth(token) if token else {}, timeout=90)
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def killed_afterwards(pids: list[int]) -> Iterator[list[int]]:
    """Whatever the test finds, no process it made outlives it (they would sleep for an hour)."""
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def spawn(url: str, name: str, session: str | None) -> list[int]:
    result = call(url, name, session)
    assert not result.is_error, result.text
    pids = [result.structured[key] for key in ("server", "child", "daemon")]
    assert all(alive(pid) for pid in pids)
    return pids


def wait_until_ready(url: str, names: list[str], token: str | None = None) -> None:
    def ready() -> list[str]:
        checks = httpx.get(url + "/readyz", headers=auth(token) if token else {}).json()["checks"]
        return checks["upstreams"]["ready"]

    wait_for(lambda: ready() == names, 60)


def spawner_config() -> dict[str, Any]:
    return server_config(
        mcpServers={
            "mine": {"command": sys.executable, "args": [SPAWNING], "per_session": True},
            "shared": {"command": sys.executable, "args": [SPAWNING]},
        }
    )


def test_processes_of_a_session_end_with_its_release() -> None:
    with running_server(spawner_config()) as srv, killed_afterwards([]) as pids:
        wait_until_ready(srv.url, ["mine", "shared"])
        session = f"s-{uuid.uuid4().hex}"
        pids += spawn(srv.url, "mine__spawn", session)
        assert httpx.delete(f"{srv.url}/v1/sessions/{session}").status_code == 200
        wait_for(lambda: not any(alive(pid) for pid in pids), 30)


def test_processes_of_upstreams_end_when_the_server_is_killed() -> None:
    with running_server(spawner_config()) as srv, killed_afterwards([]) as pids:
        wait_until_ready(srv.url, ["mine", "shared"])
        pids += spawn(srv.url, "mine__spawn", f"s-{uuid.uuid4().hex}")
        pids += spawn(srv.url, "shared__spawn", None)
        srv.proc.kill()  # SIGKILL: nothing of the server runs to clean up
        srv.proc.wait(30)
        wait_for(lambda: not any(alive(pid) for pid in pids), 30)


def test_one_tenants_idle_sessions_leave_instances_for_another() -> None:
    config = server_config(
        mcpServers={
            "notes": {"command": sys.executable, "args": [NOTEBOOK], "per_session": True, "max_sessions": 4}
        }
    )
    env = {"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}
    with running_server(config, env=env) as srv:
        wait_until_ready(srv.url, ["notes"], TOKEN_A)
        # Tenant A opens sessions and leaves them idle: it gets its share, 3 of 4, no more.
        held = [call(srv.url, "notes__read", f"a{n}-{uuid.uuid4().hex}", TOKEN_A) for n in range(4)]
        assert [r.error is None for r in held] == [True, True, True, False], [r.text for r in held]
        assert held[3].error.kind == "overloaded" and "max_sessions_per_tenant" in held[3].error.message
        # Before: A's four sessions took all four instances and B's first call was overloaded.
        first = call(srv.url, "notes__read", f"b-{uuid.uuid4().hex}", TOKEN_B)
        assert first.error is None, first.text
        assert first.structured["notes"] == []
        status = httpx.get(srv.url + "/readyz", headers=auth(TOKEN_A)).json()["checks"]["upstream:notes"]
        assert status["sessions"] == 4 and status["max_sessions_per_tenant"] == 3
