"""A stdio upstream's stderr: captured per connection, and quoted on one line when it fails.

``StderrCapture`` is where the process writes its stderr: a pipe read on the event loop,
of which only the last bytes are kept, so a server that floods stderr costs neither
disk nor memory. ``excerpt`` is what it said since the connection came up (or, before
that, since it started), minus log chatter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from typing import IO

__all__ = ["StderrCapture", "relevant_stderr"]

_STDERR_TAIL = 600
_STDERR_KEEP = 64 * 1024  # the last bytes of stderr kept, searched for the excerpt
_READ_CHUNK = 64 * 1024

# "[11/23/25 13:59:01] INFO ...", "INFO:root:...", "2025-01-01 12:00:00,000 DEBUG ...": chatter.
_LOG_CHATTER = re.compile(
    r"^[\s\[]*(?:[\d/:.,T\]-]+\s+){0,3}[\s\[]*(?:DEBUG|INFO)\b|^Processing request of type "
)
_VALIDATION_HEADER = re.compile(r"\d+ validation errors? for ")
_PYDANTIC_LOCATION = re.compile(r"[A-Za-z_][\w.\[\]-]*")


def relevant_stderr(text: str) -> str:
    """What of a server's stderr says why it failed, on one line.

    Left out: INFO/DEBUG log lines, and the validation error a handshake-era server
    prints for our ``server/discover`` probe (the SDK client tries it first).
    """
    lines = text.splitlines()
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if _VALIDATION_HEADER.search(lines[i]):
            end = i + 1
            while end < len(lines) and (lines[end][:1].isspace() or _PYDANTIC_LOCATION.fullmatch(lines[end])):
                end += 1
            block = lines[i:end]
            if not any("server/discover" in line for line in block):
                kept += block
            i = end
            continue
        if not _LOG_CHATTER.search(lines[i]):
            kept.append(lines[i])
        i += 1
    return " ".join(" ".join(kept).split())[-_STDERR_TAIL:]


class StderrCapture:
    """The read end of the process's stderr pipe, drained on the event loop into a bounded tail.

    Draining keeps the process from blocking on a full pipe; whatever is older than the
    last ``_STDERR_KEEP`` bytes is dropped as it arrives.
    """

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        self._read_fd = read_fd
        self._write: IO[str] | None = os.fdopen(write_fd, "w")
        self._tail = bytearray()
        self._total = 0  # bytes received
        self._mark = 0  # ``_total`` when the connection came up
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(read_fd, self._read)

    @property
    def file(self) -> IO[str]:
        """What the subprocess gets as its stderr (the write end of the pipe)."""
        assert self._write is not None, "the capture is closed"
        return self._write

    def mark(self) -> None:
        """The connection is up: what it said while starting is not news later."""
        self._drain()
        self._mark = self._total

    def excerpt(self) -> str:
        """What the process wrote since the mark, on one line, chatter left out."""
        self._drain()
        fresh = min(self._total - self._mark, len(self._tail))
        return relevant_stderr(bytes(self._tail[len(self._tail) - fresh :]).decode("utf-8", "replace"))

    def close(self) -> None:
        if self._write is None:
            return
        self._loop.remove_reader(self._read_fd)
        os.close(self._read_fd)
        self._write.close()
        self._write = None

    def _read(self) -> bool:
        """Take one chunk from the pipe; False when there was nothing to take."""
        try:
            chunk = os.read(self._read_fd, _READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            chunk = b""
        if not chunk:  # every write end is closed (not while ours is open): nothing more will come
            self._loop.remove_reader(self._read_fd)
            return False
        self._total += len(chunk)
        self._tail += chunk
        del self._tail[: max(0, len(self._tail) - _STDERR_KEEP)]
        return True

    def _drain(self) -> None:
        """Take what is in the pipe now (a bounded amount): the excerpt must not miss the last words."""
        with contextlib.suppress(OSError):
            for _ in range(64):
                if not self._read():
                    return
