"""Start a real tool server (``tool-server serve``) in a subprocess on an ephemeral loopback port."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.processes import started

REPO = Path(__file__).resolve().parents[2]

# A light config for tests: no corpus or sandbox start-up unless a test asks for them.
BASE_TOOLS: list[dict[str, Any]] = [
    {"target": "tools.calculator:calculator", "toolsets": ["default", "math"]},
    {"target": "tools.testing:echo", "toolsets": ["test"]},
    {"target": "tools.testing:echo_async", "toolsets": ["test"]},
    {"target": "tools.testing:sleep", "toolsets": ["test"]},
    {"target": "tools.testing:count", "toolsets": ["test"]},
    {"target": "tools.testing:fail", "toolsets": ["test"]},
    {"target": "tools.testing:big_output", "toolsets": ["test"]},
]


def server_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"tools": list(BASE_TOOLS), "server": {"shutdown_grace_s": 2}}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


class ServerProcess:
    def __init__(self, proc: subprocess.Popen[str], url: str, log: list[str]) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    @property
    def output(self) -> str:
        return "".join(self.log)


@contextlib.contextmanager
def running_server(
    config: dict[str, Any] | str | Path | None = None,
    *,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    extra_args: list[str] | None = None,
    startup_timeout_s: float = 120.0,
) -> Iterator[ServerProcess]:
    """Yields a ServerProcess whose ``url`` is ``http://127.0.0.1:PORT``; stops it afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        if config is None:
            config = server_config()
        if isinstance(config, dict):
            path = Path(tmp) / "config.yaml"
            path.write_text(yaml.safe_dump(config))
        else:
            path = Path(config)
        cmd = [
            sys.executable,
            "-m",
            "tool_server.cli",
            "serve",
            "--config",
            str(path),
            "--host",
            host,
            "--port",
            "0",
        ]
        with started(
            cmd + (extra_args or []),
            ready_line=r"Uvicorn running on (http://\S+)",
            timeout_s=startup_timeout_s,
            cwd=REPO,
            env=env,
        ) as process:
            assert process.match is not None
            server = ServerProcess(
                process.proc, process.match.group(1).replace("0.0.0.0", "127.0.0.1"), process.log
            )
            deadline = time.monotonic() + startup_timeout_s
            while not _answers(server.url):
                if process.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("tool server did not answer /readyz:\n" + process.output)
                time.sleep(0.05)
            yield server


def _answers(url: str) -> bool:
    """The server answers ``/readyz`` (503 too: ready is the server's own view of its tools)."""
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/readyz", timeout=2).status_code in (200, 503)
    return False
