"""The stdio transport to an upstream: a subprocess speaking newline-delimited JSON-RPC, read with a bound.

The SDK's own stdio client re-joins its whole buffer for every chunk it reads (a long
line costs quadratic time) and holds a line of any length (a server that never writes
a newline grows our memory without limit). This one reads in linear time and holds at
most ``max_message_bytes`` of one message: a longer one is discarded as it arrives, up
to its newline, and the request it answers fails with an error that names the limit.
The connection survives it; the next message is read as usual.

It yields what the SDK's ``ClientSession`` expects of a transport: a stream of
``SessionMessage`` (or the ``Exception`` of a line that is not JSON-RPC) and a stream
it writes ``SessionMessage`` to. Shutdown follows the MCP spec: close stdin, wait,
then SIGTERM and SIGKILL the process group.

The command runs under ``reaper`` (a small process of its own group): every process the
server starts, even one that left the group, ends when the server's main process ends,
when the connection is shut down, and when the tool server dies, SIGKILL included.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from typing import Any, TextIO

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from tool_server.upstream.config import StdioSpec

__all__ = ["MESSAGE_TOO_LARGE", "LineSplitter", "Oversize", "bounded_stdio_client", "stand_in"]

logger = logging.getLogger("tool_server.upstream")

# The code of the error response put in place of a discarded one (JSON-RPC's server-error
# range, unused by the SDK): calls map it to ``too_large``.
MESSAGE_TOO_LARGE = -32010

_EXIT_GRACE_S = 2.0  # for the server to exit on its own once its stdin closes
_KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL
_FLUSH_S = 0.5  # for the writer to send what it already accepted
_HEAD_BYTES = 4096  # of an oversize message, kept to find the id of the request it answers
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_COLON = re.compile(rb"\s*:")
_ID_VALUE = re.compile(rb'\s*(-?\d+|"(?:[^"\\]|\\.)*")')
_REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")


class Oversize:
    """A message longer than the limit, cut: its first bytes, and the limit it broke."""

    __slots__ = ("head", "limit")

    def __init__(self, head: bytes, limit: int) -> None:
        self.head, self.limit = head, limit


class LineSplitter:
    """Splits a byte stream into lines, in time linear in its length, holding at most ``limit`` bytes.

    ``feed`` returns the lines a chunk completes (without their newline); a line that grows
    past ``limit`` is returned once, as an ``Oversize``, as soon as it does, and the rest of
    it is dropped as it arrives.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._skipping = False

    def feed(self, chunk: bytes) -> list[bytes | Oversize]:
        out: list[bytes | Oversize] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            cut = self._add(chunk[start:] if end < 0 else chunk[start:end])
            if cut is not None:
                out.append(cut)
            if end < 0:
                return out
            if not self._skipping:
                out.append(b"".join(self._parts))
            self._parts, self._size, self._skipping = [], 0, False
            start = end + 1

    def _add(self, piece: bytes) -> Oversize | None:
        if self._skipping or not piece:
            return None
        if self._size + len(piece) <= self.limit:
            self._parts.append(piece)
            self._size += len(piece)
            return None
        head = (b"".join(self._parts[:4]) + piece[:_HEAD_BYTES])[:_HEAD_BYTES]
        self._parts, self._size, self._skipping = [], 0, True
        return Oversize(head, self.limit)


@contextlib.asynccontextmanager
async def bounded_stdio_client(
    spec: StdioSpec, *, errlog: TextIO, max_message_bytes: int
) -> AsyncIterator[tuple[Any, Any]]:
    """Starts the server of ``spec`` and yields the SDK session's (read, write) streams to it."""
    env = get_default_environment() | spec.env
    _check_command(spec.command, env, spec.cwd)
    process = await anyio.open_process(
        # -I -S: the reaper needs the standard library only, and none of our environment's settings
        [sys.executable, "-I", "-S", _REAPER, str(os.getpid()), _as_user(spec), spec.command, *spec.args],
        env=env,
        stderr=errlog,
        cwd=spec.cwd,
        start_new_session=True,  # its own process group: shutdown kills the whole tree
    )
    # No await between the spawn and the task group: a cancellation there would leak the process.
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def read() -> None:
        assert process.stdout is not None
        lines = LineSplitter(max_message_bytes)
        try:
            async with to_session:
                async for chunk in process.stdout:
                    for line in lines.feed(chunk):
                        await to_session.send(_message(line))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session is gone, or shutdown closed the pipe
        finally:
            await _drain(process)

    async def write() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # the server stopped reading: end the session, not hang it
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield from_server, to_server
        finally:
            # Bounded, and shielded: a cancelled caller must not leave the process running.
            with anyio.CancelScope(shield=True):
                from_server.close()  # the reader drains stdout from here on
                to_server.close()
                with anyio.move_on_after(_FLUSH_S):
                    await writer_done.wait()
                await _stop(process)
            tasks.cancel_scope.cancel()


def _as_user(spec: StdioSpec) -> str:
    """The reaper's USER argument: the uid the command runs as, or ``-`` for the server's own."""
    return "-" if spec.uid is None else str(spec.uid)


def _check_command(command: str, env: dict[str, str], cwd: str | None) -> None:
    """Raise what starting ``command`` directly would (FileNotFoundError, PermissionError):
    the reaper starts it, and the operator's message must still say which is wrong."""
    if os.sep in command:
        path = os.path.join(cwd or os.getcwd(), command)
        if not os.path.isfile(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        if not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
    elif shutil.which(command, path=env.get("PATH", os.defpath)) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)


def _message(line: bytes | Oversize) -> SessionMessage | Exception:
    """One line as the session takes it: a message, the error that stands for one, or a parse error."""
    if isinstance(line, Oversize):
        return stand_in(line)
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        logger.warning("upstream wrote a line that is not a JSON-RPC message: %s", exc)
        return exc


def stand_in(cut: Oversize) -> SessionMessage | Exception:
    """What stands for a discarded message: an error response to the request it answered when
    its head shows that request's id, else an exception (no call is failed at once)."""
    text = f"upstream message larger than the {cut.limit} byte limit (max_message_bytes); discarded"
    logger.warning("%s", text)
    keys = _top_level_keys(cut.head)
    if "id" not in keys or "method" in keys:  # id not in the head, or a request of its own
        return ValueError(text)
    error = types.JSONRPCError(
        jsonrpc="2.0", id=keys["id"], error=types.ErrorData(code=MESSAGE_TOO_LARGE, message=text)
    )
    return SessionMessage(error)


def _top_level_keys(head: bytes) -> dict[str, Any]:
    """The keys of the outer JSON object that the head shows, with the value of ``id``.

    Only the outer object's ``id`` is the request's: a result holding ``{"id": 0}`` (a search
    hit, a row) must not fail request 0. Strings are skipped whole, so text cannot pose as a key.
    """
    keys: dict[str, Any] = {}
    depth, pos = 0, 0
    while pos < len(head):
        byte = head[pos]
        if byte == 0x22:  # '"': skip the whole string
            string = _STRING.match(head, pos)
            if string is None:  # cut off by the head's end
                break
            pos = string.end()
            colon = _COLON.match(head, pos)
            if depth == 1 and colon is not None:  # a key of the outer object
                name = string.group()[1:-1].decode(errors="replace")
                value = _ID_VALUE.match(head, colon.end()) if name == "id" else None
                keys[name] = json.loads(value.group(1)) if value is not None else None
            continue
        if byte in b"{[":
            depth += 1
        elif byte in b"}]":
            depth -= 1
        pos += 1
    return keys


async def _drain(process: Process) -> None:
    """Reads and drops what the server still writes, so it is not blocked on a full pipe at exit."""
    assert process.stdout is not None
    with (
        anyio.CancelScope(shield=True),
        contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError),
    ):
        while True:
            await process.stdout.receive()


async def _stop(process: Process) -> None:
    """Close stdin, give the server a grace period, then end its process group."""
    assert process.stdin is not None and process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, _EXIT_GRACE_S):
        await terminate_posix_process_tree(process, _KILL_GRACE_S)
        if not await _exited(process, _KILL_GRACE_S):
            logger.warning("upstream process %d survived SIGKILL; abandoning it", process.pid)
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()  # a survivor holding the pipe must not keep the reader waiting


async def _exited(process: Process, within_s: float) -> bool:
    # Polls returncode: process.wait() also waits for the pipes, which a child may hold open.
    with anyio.move_on_after(within_s):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None
