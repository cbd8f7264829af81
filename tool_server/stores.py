"""Small bounded stores with a fixed TTL: idempotency results and the result cache.

With one TTL for every entry, put order is expiry order: a deque of puts tells which
entries to drop first, in O(1) amortised time per put and without an ordered dict's
per-entry links (the idempotency store takes one put per call on the hot path).

A store is bounded three ways: age (``ttl_s``), count (``max_entries``) and size
(``max_bytes``, the sum of the sizes given with each put). The oldest entries go first
whichever bound is hit, so a burst of large results shortens how long results are kept
instead of growing the process.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TTLStore(Generic[K, V]):
    """Values kept ``ttl_s`` seconds after their put, within ``max_entries`` and ``max_bytes``."""

    __slots__ = ("_items", "_puts", "max_entries", "max_bytes", "ttl_s", "puts_total", "bytes")

    def __init__(self, max_entries: int, ttl_s: float, max_bytes: int | None = None) -> None:
        self._items: dict[K, tuple[float, V, int]] = {}  # key -> (expiry, value, size)
        self._puts: deque[tuple[float, K]] = deque()  # (expiry, key), oldest first
        self.max_entries = max_entries
        self.max_bytes = max_bytes if max_bytes is not None else float("inf")
        self.ttl_s = ttl_s
        self.puts_total = 0  # puts ever made: how many values were kept, for GC decisions
        self.bytes = 0  # sum of the sizes of the entries held now

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] < time.monotonic():
            del self._items[key]
            self.bytes -= item[2]
            return None
        return item[1]

    def put(self, key: K, value: V, size: int = 0) -> None:
        now = time.monotonic()
        expiry = now + self.ttl_s
        items, puts = self._items, self._puts
        old = items.get(key)
        if old is not None:
            self.bytes -= old[2]
        if size > self.max_bytes:  # it could never fit: keeping it would first evict everything else
            if old is not None:
                del items[key]
            return
        items[key] = (expiry, value, size)
        self.bytes += size
        puts.append((expiry, key))
        self.puts_total += 1
        if len(puts) > self.max_entries or puts[0][0] < now or self.bytes > self.max_bytes:
            self._evict(now)

    def sweep(self) -> int:
        """Drop the entries that have expired; how many went. Puts and gets only drop what they
        meet, so an idle store held its expired results (and their memory) until the next put:
        the owner calls this every few seconds."""
        before = len(self._items)
        puts = self._puts
        if puts and puts[0][0] < time.monotonic():
            self._evict(time.monotonic())
        return before - len(self._items)

    def _evict(self, now: float) -> None:
        """Drop puts from the front while there are too many, too large, or expired.

        Too many: down to a 256th below ``max_entries`` at once, so that a full store (the
        idempotency store in steady state) runs this once per 256th of its size, not per put.
        """
        items, puts = self._items, self._puts
        most = self.max_entries
        if len(puts) > most:
            most -= max(1, most // 256)
        while puts and (len(puts) > most or puts[0][0] < now or self.bytes > self.max_bytes):
            expiry, key = puts.popleft()
            item = items.get(key)
            if item is not None and item[0] == expiry:  # not put again since: this is its entry
                del items[key]
                self.bytes -= item[2]
