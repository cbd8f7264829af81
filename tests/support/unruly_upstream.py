"""A stdio MCP server (official SDK) that misbehaves on request, for the upstream failure tests.

Tools: ``pid()`` (this process's id), ``sleep(seconds)`` (it notes when it starts and
when it is cancelled in the file named by ``UNRULY_LOG``), ``grow(name)`` (adds a tool
and sends the tools list-changed event to ``subscriptions/listen`` streams), and ``lookup(item)``, whose
published ``inputSchema`` points (``$ref``) at a definition it does not have, as
hand-written schemas sometimes do. ``big(megabytes)`` answers that many MiB of text;
``stdout_flood(megabytes)`` first writes that many MiB to stdout with no newline (a
server printing garbage into the protocol stream), then answers on the same line.

* ``--linger SECONDS``: once its stdin closes, ignore SIGTERM and stay alive that long,
  like a server with a slow shutdown; only SIGKILL ends it sooner.
* ``--flood``: write to stderr as fast as it can, from the start.
* ``--start-delay SECONDS``: take that long to start (as ``uvx`` or ``npx`` fetching a package).

Run: ``python tests/support/unruly_upstream.py [--linger S] [--flood] [--start-delay S]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("unruly")


@server.tool(description="This server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="Sleep, then say so.")
async def sleep(seconds: float) -> str:
    _note("started")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _note("cancelled")
        raise
    return f"slept {seconds}"


def _note(event: str) -> None:
    """Append ``event`` to the file named by UNRULY_LOG, if any (how a test sees inside)."""
    path = os.environ.get("UNRULY_LOG")
    if path:
        with open(path, "a") as log:
            log.write(event + "\n")


@server.tool(description="Echo the item.")
def lookup(item: int) -> str:
    return f"item {item}"


# Published with a $ref to a definition the schema lacks (the tool itself still works).
server._tool_manager.get_tool("lookup").parameters = {  # type: ignore[union-attr]
    "type": "object",
    "properties": {"item": {"$ref": "#/$defs/Item"}},
    "required": ["item"],
}


@server.tool(description="Add a tool named `name` (it says hello) and tell subscribed clients.")
async def grow(name: str, ctx: Context) -> str:
    server.add_tool(lambda: f"hello from {name}", name=name, description="Added at run time.")
    await ctx.notify_tools_changed()
    return f"added {name}"


@server.tool(description="Return `megabytes` MiB of text.")
def big(megabytes: float) -> str:
    return "x" * int(megabytes * (1 << 20))


@server.tool(description="Write `megabytes` MiB to stdout with no newline, then answer.")
def stdout_flood(megabytes: float) -> str:
    chunk = memoryview(b"x" * (1 << 16))
    for _ in range(int(megabytes * 16)):
        sent = 0
        while sent < len(chunk):
            sent += os.write(_wire, chunk[sent:])
    return "flooded"


# The SDK's stdio server points fd 1 at stderr while it serves (stray prints must not
# corrupt the stream): a copy taken before it starts is the protocol stream itself.
_wire = 1


def _flood() -> None:
    chunk = ("x" * 1023 + "\n") * 64
    while True:
        sys.stderr.write(chunk)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--flood", action="store_true")
    parser.add_argument("--start-delay", type=float, default=0.0)
    args = parser.parse_args()
    time.sleep(args.start_delay)
    global _wire
    _wire = os.dup(1)
    if args.flood:
        threading.Thread(target=_flood, daemon=True).start()
    server.run()
    if args.linger:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(args.linger)


if __name__ == "__main__":
    main()
