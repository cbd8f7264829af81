"""A stdio MCP server (official SDK) that keeps a file in its session's directory and reads any
path it is given, for the tests that sessions' processes cannot read each other's files.

* ``keep(text)``: writes ``text`` to ``secret.txt`` in the directory given as ``--dir``
  (``${session_dir}``) and answers the file's absolute path;
* ``peek(path)``: answers the text of ``path``, or why it could not be read;
* ``who()``: the uid, gid and groups this process runs as, and its ``HOME``.

Run: ``python tests/support/files_upstream.py --dir DIRECTORY``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

DIRECTORY = Path(sys.argv[sys.argv.index("--dir") + 1])

server = MCPServer("files")


@server.tool(description="Keep a text in this session's directory; answers its path.")
def keep(text: str) -> str:
    path = DIRECTORY / "secret.txt"
    path.write_text(text)
    return str(path.resolve())


@server.tool(description="Read any file.")
def peek(path: str) -> str:
    try:
        return "read: " + Path(path).read_text()
    except OSError as exc:
        return f"refused: {type(exc).__name__}: {exc.strerror}"


@server.tool(description="Who this process runs as.")
def who() -> dict[str, Any]:
    return {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "home": os.environ.get("HOME")}


if __name__ == "__main__":
    server.run()
