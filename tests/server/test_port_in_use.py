"""A taken port: refused before start-up, with who holds it; "ready" only once the socket listens.

A second ``tool-server serve`` on a taken port used to log "tool server ready", then fail to bind
(exit 3), and the README's readiness loop passed against the first server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from tests.support.server import REPO, running_server, server_config
from tool_server.listen import port_holder, port_in_use


def test_a_second_server_on_a_taken_port_says_who_holds_it_and_never_says_ready(tmp_path: Path) -> None:
    with running_server() as first:
        port = int(first.url.rsplit(":", 1)[1])
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump(server_config()))
        done = subprocess.run(
            [sys.executable, "-m", "tool_server.cli", "serve", "--config", str(config), "--port", str(port)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 3
        assert "tool server ready" not in done.stdout + done.stderr and "started" not in done.stderr
        assert done.stderr.strip().splitlines() == [
            f"tool-server: port {port} on 127.0.0.1 is already in use by pid {first.proc.pid} "
            f"({_short_command(first.proc.pid)}): stop that server, or pass --port "
            "(TOOLFACTORY__SERVER__PORT) for another"
        ]
        # the first server is the one that answers, and says which process it is
        assert httpx.get(first.url + "/readyz", timeout=10).json()["pid"] == first.proc.pid


def _short_command(pid: int) -> str:
    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return command if len(command) <= 80 else command[:77] + "..."


def test_ready_is_logged_after_the_socket_listens() -> None:
    with running_server() as server:
        httpx.get(server.url + "/readyz", timeout=10)
        output = server.output
    assert "tool server ready" in output
    assert output.index("Uvicorn running on") < output.index("tool server ready")


def test_a_free_port_and_port_zero_are_not_reported() -> None:
    assert port_in_use(["127.0.0.1"], 0) is None
    assert port_holder(1) is None  # nothing listens on tcp port 1 here
