"""Each process of a ``per_session`` upstream runs as a uid of its own, so no session's process
can read another session's files.

Before: every process ran as the tool server's uid, and a private directory (mode 0700) kept
out other users only: a tenant's own instance read another session's file by its absolute path.
Changing uids needs root, and a command other users can run: the venv's Python on this
machine lives under ``/root`` (mode 0700), so the files server runs on the system's Python 3.11
with the venv's packages on its path (in the container image Python is in ``/usr/local``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from protocol import decode_results
from tests.server.upstream.test_served import wait_for
from tests.support.server import REPO, running_server, server_config
from tool_server.upstream.hosting import UpstreamServer
from tools.sandbox.uids import DEFAULT_UIDS

FILES = str(REPO / "tests" / "support" / "files_upstream.py")
SYSTEM_PYTHON = "/usr/bin/python3.11"  # one other users can run; same minor version as the venv's
PACKAGES = next(Path(sys.prefix, "lib").glob("python3.*/site-packages"))
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="changing uids needs root (what holds without it: docs/security.md)"
    ),
    pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="needs a Python 3.11 other users can run"),
]


def files_server(**options: Any) -> dict[str, Any]:
    return {
        "command": SYSTEM_PYTHON,
        "args": [FILES, "--dir", "${session_dir}"],
        "env": {"PYTHONPATH": str(PACKAGES)},
        "per_session": True,
        **options,
    }


def run(url: str, name: str, arguments: dict[str, Any], session: str) -> Any:
    body = {
        "calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}]
    }
    (result,) = decode_results(httpx.post(url + "/v1/calls", json=body, timeout=120).content)
    assert not result.is_error, result.text
    return (
        result.structured["result"]
        if isinstance(result.structured, dict) and "result" in result.structured
        else result.structured
    )


def test_a_sessions_process_cannot_read_another_sessions_files() -> None:
    config = server_config(mcpServers={"files": files_server(session_uid=True)})
    with running_server(config) as srv:
        wait_for(
            lambda: httpx.get(srv.url + "/readyz").json()["checks"]["upstreams"]["ready"] == ["files"], 60
        )
        a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
        secret = run(srv.url, "files__keep", {"text": "a's secret"}, a)
        assert run(srv.url, "files__peek", {"path": secret}, a) == "read: a's secret"

        stolen = run(srv.url, "files__peek", {"path": secret}, b)
        assert stolen.startswith("refused: PermissionError"), stolen
        mine = run(srv.url, "files__keep", {"text": "b's own"}, b)
        assert run(srv.url, "files__peek", {"path": mine}, b) == "read: b's own"

        users = [run(srv.url, "files__who", {}, session) for session in (a, b)]
        assert users[0]["uid"] != users[1]["uid"]
        for user, path in zip(users, (secret, mine), strict=True):
            assert user["uid"] in DEFAULT_UIDS and user["gid"] == user["uid"] and user["groups"] == []
            assert user["home"] == str(Path(path).parent)  # its own directory, not the server's HOME
            assert Path(path).parent.stat().st_uid == user["uid"]

        # Released: the process and its directory go (removed by the server, whoever owned it).
        assert httpx.delete(f"{srv.url}/v1/sessions/{a}", timeout=30).status_code == 200
        wait_for(lambda: not Path(secret).parent.exists(), 30)


def test_a_tmpdir_other_users_cannot_enter_is_a_config_error(tmp_path: Path) -> None:
    closed = Path(tempfile.mkdtemp())  # mode 0700: a session's own uid could not reach its directory
    try:
        config = server_config(mcpServers={"files": files_server(session_uid=True)})
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        checked = subprocess.run(
            [sys.executable, "-m", "tool_server.cli", "check-config", "--config", str(path)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "TMPDIR": str(closed)},
            timeout=120,
        )
    finally:
        closed.rmdir()
    assert checked.returncode == 2, checked.stderr
    assert f"other users cannot enter '{closed}'" in checked.stderr
    assert "session_uid: false" in checked.stderr


def test_left_to_the_default_a_command_other_users_cannot_run_leaves_it_off_and_says_why(
    tmp_path: Path,
) -> None:
    closed = Path(tempfile.mkdtemp())  # mode 0700
    try:
        script = closed / "server.sh"
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
        spec = {"command": str(script), "args": ["${session_dir}"]}
        default = UpstreamServer("closed", spec, per_session=True)
        assert default.session_uid is False
        status = default.status()
        assert status["session_uid"] is False
        assert f"other users cannot run its command {str(script)!r}" in status["session_uid_off"]
        with pytest.raises(
            ValueError, match=r"^mcpServers.closed.session_uid: .* or set session_uid: false$"
        ):
            UpstreamServer("closed", spec, per_session=True, session_uid=True)
        assert (
            UpstreamServer("closed", spec, per_session=True, session_uid=False).status()["session_uid"]
            is False
        )
    finally:
        shutil.rmtree(closed)
