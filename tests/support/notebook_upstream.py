"""A small stateful MCP server over stdio (official SDK) for the upstream tests.

It keeps a notebook in process memory, as many stdio servers keep their state: every
client of one process shares it, so two trajectories see each other's notes unless each
gets a process of its own (``per_session``). Tools:

* ``write(text)`` appends a note; ``read()`` lists the notes and this process's pid;
* ``whoami()`` returns the ``_meta`` keys of the request (the session, the call id);
* ``get weather!`` and ``get_weather_``: two names that are the same once sanitised.

``--wait-for PATH``: exit at once (stderr says why) until PATH exists, like a server whose
backend is not up yet; its supervisor keeps restarting it, so it comes up late.

Run: ``python tests/support/notebook_upstream.py [--wait-for PATH]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notebook")
NOTES: list[str] = []


@server.tool(title="Write a note", description="Append a note to the notebook.")
def write(text: str) -> dict[str, Any]:
    NOTES.append(text)
    return {"notes": len(NOTES)}


@server.tool(description="The notes written so far, and the server's process id.")
def read() -> dict[str, Any]:
    return {"notes": list(NOTES), "pid": os.getpid()}


@server.tool(description="The toolfactory keys of this request's _meta.")
def whoami(ctx: Context) -> dict[str, Any]:
    meta = dict(ctx.request_context.meta or {})
    return {key: value for key, value in meta.items() if key.startswith("toolfactory/")}


@server.tool(name="get weather!", description="A name that needs sanitising.")
def weather_loud() -> str:
    return "loud"


@server.tool(name="get_weather_", description="A valid name that a sanitised one must not shadow.")
def weather_plain() -> str:
    return "plain"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wait-for", type=Path, default=None)
    args = parser.parse_args()
    if args.wait_for is not None and not args.wait_for.exists():
        sys.stderr.write(f"notebook: backend not ready ({args.wait_for} is missing)\n")
        sys.exit(1)
    server.run()


if __name__ == "__main__":
    main()
