"""A stdio MCP server (official SDK) that starts background processes, for the upstream cleanup tests.

Tool ``spawn()`` starts two processes that outlive the call, as real servers do (a
language server, a browser, a database), and returns their pids:

* ``child``: a plain background child, in the server's process group;
* ``daemon``: one that left the group the way daemons do (``setsid`` after a double
  fork), so killing the group does not reach it.

Both ignore SIGTERM and SIGHUP and close their stdio: they would live on forever unless
someone SIGKILLs them.

Run: ``python tests/support/spawning_upstream.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("spawning")

# Ignores the polite signals and sleeps; stdio closed so it holds no pipe of the server's.
_STUBBORN = "import signal, time; [signal.signal(s, signal.SIG_IGN) for s in (1, 15)]; time.sleep(3600)"


def _start(*, leave_group: bool) -> int:
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if not leave_group:
        return subprocess.Popen([sys.executable, "-c", _STUBBORN], **quiet).pid
    # Double fork with setsid: the daemon's parent exits at once, so it is nobody's child here.
    read, write = os.pipe()
    launcher = (
        "import os, subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {_STUBBORN!r}], start_new_session=True, "
        "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"os.write({write}, str(p.pid).encode())\n"
    )
    subprocess.run([sys.executable, "-c", launcher], pass_fds=[write], check=True, **quiet)
    os.close(write)
    with os.fdopen(read) as pipe:
        return int(pipe.read())


@server.tool(description="Start a background child and a daemon; their pids.")
def spawn() -> dict[str, Any]:
    return {"server": os.getpid(), "child": _start(leave_group=False), "daemon": _start(leave_group=True)}


if __name__ == "__main__":
    server.run()
