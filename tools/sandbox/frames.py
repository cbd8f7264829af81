"""The control channel between the server and a worker: frames, and what a reply may hold.

One frame is a 4-byte big-endian length and that many bytes of JSON; the server sends a
request per call, the worker a ``ready`` frame once confined and then one reply per request.
Both sides use this module (the worker imports it as a sibling; standard library only).

Nothing in a reply is trusted beyond display: the code that ran can write frames to its own
control pipe (``parse_reply``).
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any

__all__ = ["HEADER", "encode", "parse_reply", "read_frame", "write_frame"]

HEADER = 4  # bytes of length before each frame's JSON


def encode(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj).encode()
    return len(data).to_bytes(HEADER, "big") + data


def write_frame(fd: int, obj: dict[str, Any]) -> None:
    """Send one frame on a blocking fd."""
    view = memoryview(encode(obj))
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            poller = select.poll()  # no fd of its own (a selector's epoll would take one)
            poller.register(fd, select.POLLIN)
            if remaining <= 0 or not poller.poll(remaining * 1000):
                return None
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(fd: int, timeout_s: float | None = None) -> dict[str, Any] | None:
    """One frame from a blocking fd, or None on EOF (or once ``timeout_s`` has passed)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    head = _read_exact(fd, HEADER, deadline)
    body = head and _read_exact(fd, int.from_bytes(head, "big"), deadline)
    return None if body is None else json.loads(body)


def parse_reply(body: bytes, cap: int) -> dict[str, Any] | None:
    """A reply frame checked for shape, or None when it is not one the bootstrap could send.

    Nothing in a reply is trusted beyond display: the code that ran can write frames to its
    own control pipe, so a reply only ever becomes that call's shown output (value, error,
    exit status, truncation flag; strings cut to ``cap``). Whether the worker is alive, what
    it costs and which processes it has come from the kernel (waitpid, /proc, signals), and
    ``seq`` only tells a stale frame from the current one.
    """
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(reply, dict):
        return None
    seq, code = reply.get("seq"), reply.get("exit_code", 0)
    value, error = reply.get("value"), reply.get("error")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (seq, code)):
        return None
    if not all(x is None or isinstance(x, str) for x in (value, error)):
        return None
    truncated = reply.get("truncated") is True or len(value or "") > cap or len(error or "") > cap
    return {
        "seq": seq,
        "exit_code": max(-(1 << 31), min(code, (1 << 31) - 1)),
        "value": None if value is None else value[:cap],
        "error": None if error is None else error[:cap],
        "truncated": truncated,
    }
