"""A stdio upstream's stderr: captured per connection, and quoted on one line when it fails.

``StderrCapture`` is where the process writes its stderr; ``excerpt`` is what it said
since the connection came up (or, before that, since it started), minus log chatter.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from typing import Any

__all__ = ["StderrCapture", "relevant_stderr"]

_STDERR_TAIL = 600
_STDERR_READ = 64 * 1024  # how much of the captured stderr is searched for the excerpt
_STDERR_MAX_BYTES = 1 << 20  # the captured stderr file is trimmed past this size

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
    """A temporary file the process writes its stderr to, kept from growing without bound."""

    def __init__(self) -> None:
        self._file: Any = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._mark = 0  # stderr before this offset predates the current connection

    @property
    def file(self) -> Any:
        """What the subprocess gets as its stderr."""
        return self._file

    def mark(self) -> None:
        """The connection is up: what it said while starting is not news later."""
        self._mark = self._size()

    def excerpt(self) -> str:
        """What the process wrote since the mark, on one line, chatter left out."""
        try:
            self._file.flush()
            size = self._file.seek(0, os.SEEK_END)
            self._file.seek(max(self._mark, size - _STDERR_READ))
            return relevant_stderr(self._file.read())
        except (OSError, ValueError):
            return ""

    def trim(self) -> None:
        """Keep a chatty upstream's captured stderr from growing without bound over a long run."""
        with contextlib.suppress(OSError, ValueError):
            if self._file.seek(0, os.SEEK_END) > _STDERR_MAX_BYTES:
                self._file.seek(0)  # the child shares this file offset, so it writes from 0 again
                self._file.truncate()
                self._mark = 0

    def close(self) -> None:
        self._file.close()

    def _size(self) -> int:
        try:
            return self._file.seek(0, os.SEEK_END)
        except (OSError, ValueError):
            return 0
