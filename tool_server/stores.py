"""Small bounded stores with a fixed TTL: idempotency results and the result cache.

With one TTL for every entry, insertion order is expiry order, so an OrderedDict
evicts expired and excess entries from its front in O(1) amortised time.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from itertools import islice
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TTLStore(Generic[K, V]):
    __slots__ = ("_items", "_puts", "max_entries", "ttl_s")

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._puts = 0
        self.max_entries = max_entries
        self.ttl_s = ttl_s

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] < time.monotonic():
            del self._items[key]
            return None
        return item[1]

    def put(self, key: K, value: V) -> None:
        items = self._items
        now = time.monotonic()
        if key in items:
            del items[key]
        items[key] = (now + self.ttl_s, value)
        if len(items) > self.max_entries:
            items.popitem(last=False)
        self._puts += 1
        if self._puts & 63 == 0:  # now and then, drop expired entries from the front
            expired = [k for k in islice(items, 128) if items[k][0] < now]
            for key in expired:
                del items[key]
