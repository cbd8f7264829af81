"""Give freed heap memory back to the OS once the server has gone idle (glibc's ``malloc_trim``).

After a burst (a soak, large frames, a full idempotency store that then expires), Python frees
its objects but glibc keeps the freed pages of its heap and arenas for reuse: the process stayed
at its peak RSS (118 -> 329 MB, still 329 MB idle). ``malloc_trim(0)`` hands the free pages back.
It walks the heap, so it runs in a worker thread, and only once the server is idle after something
happened; on a libc without it (musl, macOS) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import platform
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)

GROWTH_BYTES = 8 * 1024 * 1024  # grown less than this since the last trim: not worth a walk
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def malloc_trim_function() -> Callable[[], int] | None:
    """``malloc_trim(0)`` of glibc, or None where the C library is another."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


def rss_bytes() -> int:
    """This process's resident set size (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class IdleTrimmer:
    """Trims once the server has been idle for ``idle_s`` (``activity()`` unchanged over it),
    if anything happened since the last trim (``activity()`` changed: calls, expired results
    swept) or the process grew since (what ``activity()`` does not see: connections, frames)."""

    def __init__(
        self,
        idle_s: float,
        activity: Callable[[], Hashable],
        trim: Callable[[], int] | None,
        rss: Callable[[], int] = rss_bytes,
    ) -> None:
        self.idle_s = idle_s
        self.activity = activity
        self.trim = trim
        self.rss = rss
        self.trims = 0
        self._seen: Hashable = None
        self._at_trim: Hashable = None
        self._after_trim = rss()

    def due(self) -> bool:
        """Whether to trim now: idle since the last look, and changed or grown since the last trim."""
        seen, self._seen = self._seen, self.activity()
        if self.trim is None or seen != self._seen:
            return False
        return seen != self._at_trim or self.rss() > self._after_trim + GROWTH_BYTES

    def trimmed(self) -> None:
        self.trims += 1
        self._at_trim = self._seen
        self._after_trim = self.rss()

    async def run(self) -> None:
        if self.trim is None or self.idle_s <= 0:
            return
        while True:
            await asyncio.sleep(self.idle_s)
            if self.due():
                before = self.rss()
                await asyncio.to_thread(self.trim)
                self.trimmed()
                log.info(
                    "idle: returned %.0f MB of freed memory to the OS", (before - self._after_trim) / 1e6
                )
