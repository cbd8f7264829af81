"""Opening the port: refuse a taken one before anything starts, and say "ready" only once it listens.

uvicorn runs the app's start-up (tools, corpus, sandbox) before it binds, so a second server on a
taken port used to log "tool server ready" and then die on the bind (exit 3), while a readiness
loop polling that port passed against the first server. ``port_in_use`` tries the bind first and
names who holds the port where /proc says; ``AnnouncingServer`` logs ready after the bind.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path
from typing import Any

import uvicorn

__all__ = ["AnnouncingServer", "port_holder", "port_in_use"]

log = logging.getLogger("tool_server")


def port_in_use(addresses: list[str], port: int) -> str | None:
    """Why ``port`` cannot be bound on one of ``addresses`` (a sentence), or None when it can.

    The test bind sets SO_REUSEADDR as uvicorn does, so a port in TIME_WAIT is not reported."""
    if port == 0:
        return None
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    return None  # not ours to explain here: uvicorn's own bind reports it
                holder = port_holder(port)
                by = f" by {holder}" if holder else ""
                return (
                    f"port {port} on {address} is already in use{by}: stop that server, or pass "
                    "--port (TOOLFACTORY__SERVER__PORT) for another"
                )
    return None


def port_holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """``pid 1234 (tool-server serve ...)`` for the process listening on TCP ``port``, where /proc
    shows it (Linux; another user's processes are not readable: None)."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])  # state 0A: LISTEN
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if not any(os.readlink(fd) in targets for fd in (pid_dir / "fd").iterdir()):
                continue
            command = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        return f"pid {pid_dir.name} ({_short(command)})"
    return None


def _short(command: str, limit: int = 80) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server, logging "tool server ready" once its sockets listen, not before."""

    def __init__(self, config: uvicorn.Config, tools: Any) -> None:
        super().__init__(config)
        self._tools = tools  # how many tools it serves: a callable, read after start-up

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            log.info("tool server ready: %d tools, listening", self._tools())
