"""The calls a client has not settled yet, grouped by deadline: one timer per 10 ms, not per call.

A timer per call (``loop.call_later``) cost a heap push, a cancel and, in asyncio's heap, a
Python-level comparison per step: a visible share of the client's CPU per call at thousands of
calls a second. Calls whose deadlines fall in the same ``GRAIN_S`` share a bucket and one timer;
a call leaves its bucket when it settles, and whatever is left when the timer fires expires
(at most ``GRAIN_S`` after its deadline).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["GRAIN_S", "Deadlines"]


class Expiring(Protocol):
    """What ``Deadlines`` keeps: ``records.Pending`` (ToolClient), ``stream._Pending`` (StreamClient)."""

    deadline: float  # time.monotonic()
    future: asyncio.Future[Any]
    bucket: set[Any] | None  # set by Deadlines while the item is in one of its buckets


Pending = TypeVar("Pending", bound=Expiring)

GRAIN_S = 0.01
_PER_S = round(1 / GRAIN_S)


class Deadlines(Generic[Pending]):
    """Pending items by deadline bucket; ``expire(item)`` runs for each one still here at its deadline."""

    def __init__(self, expire: Callable[[Pending], None]) -> None:
        self._expire = expire
        self._buckets: dict[int, set[Pending]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets.values())

    def add(self, item: Pending) -> None:
        key = int(item.deadline * _PER_S) + 1  # the first tick after the deadline
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = set()
            delay = max(0.0, key * GRAIN_S - time.monotonic())
            self._timers[key] = asyncio.get_running_loop().call_later(delay, self._fire, key)
        bucket.add(item)
        item.bucket = bucket

    def discard(self, item: Pending) -> None:
        if item.bucket is not None:
            item.bucket.discard(item)
            item.bucket = None

    def drain(self) -> Iterator[Pending]:
        """Every pending item, taken out (the client is closing)."""
        buckets, self._buckets = self._buckets, {}
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for bucket in buckets.values():
            for item in list(bucket):
                item.bucket = None
                yield item

    def _fire(self, key: int) -> None:
        self._timers.pop(key, None)
        bucket = self._buckets.pop(key, None)
        for item in list(bucket or ()):
            item.bucket = None
            if not item.future.done():
                self._expire(item)
