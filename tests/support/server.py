"""Start a real tool server (``tool-server serve``) in a subprocess on an ephemeral loopback port."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

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
        proc_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = subprocess.Popen(
            cmd + (extra_args or []),
            cwd=REPO,
            env=proc_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log: list[str] = []
        found: list[str] = []
        ready = threading.Event()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.append(line)
                match = re.search(r"Uvicorn running on (http://\S+)", line)
                if match and not found:
                    found.append(match.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        ready.wait(startup_timeout_s)
        if not found:
            proc.kill()
            raise RuntimeError("tool server did not start:\n" + "".join(log))
        server = ServerProcess(proc, found[0].replace("0.0.0.0", "127.0.0.1"), log)
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(server.url + "/readyz", timeout=2).status_code in (200, 503):
                    break
            time.sleep(0.05)
        try:
            yield server
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
