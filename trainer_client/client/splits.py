"""Split POSTs: head-of-line relief for a batch that one slow call holds back.

A batch POST is answered when its slowest call ends, so one slow call would hold back the
fast calls of other trajectories that happened to share its POST. When a small batch is
still out after ``split_after_ms``, each of its pending calls gets a POST of its own with
the same call_id: the server joins the running call (or answers from its result store), so
nothing runs twice, and each caller gets its result as soon as its own call ends.

That helps only when one call is to blame. When the replica itself is slow (overloaded, so
every request queues; or every call it runs is slow), a split POST comes back no sooner and
is one more request per call on a replica with no room for it. So every answered batch of two
or more calls is asked: *would its fastest call, alone on a POST, have been back within
split_after_ms?* -- the round trip less the slowest call's run time (the server's
``elapsed_ms``) is the replica's own delay; add the fastest call's run time. A late batch is
split only while most of the replica's recent batches (a moving average over ~8) answered
yes; a replica nothing has been learned about yet gets no splits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from protocol import Result
from trainer_client.client.policies import BatchPolicy
from trainer_client.client.records import Metrics, Pending, Replica

__all__ = ["Splitter"]

Join = Callable[[Replica, Pending], Awaitable[None]]

_WEIGHT = 1 / 8  # moving average over ~8 batches
_UNKNOWN = 0.5  # a replica's start: undecided, so no split until one batch says it helps


class Splitter:
    """Decides which late batches get split POSTs, and sends them (through ``join``).

    Split POSTs each hold a connection for as long as their call runs; past a quarter of the
    pool they would queue for connections (httpcore's queue is quadratic) and slow every
    batch down, so beyond that a late batch simply stays whole.
    """

    def __init__(
        self,
        policy: BatchPolicy,
        max_connections: int,
        join: Join,
        metrics: Metrics,
        background: Callable[[asyncio.Task[Any]], None],
    ) -> None:
        """``join`` sends one call's split POST and settles it when it answers; must not raise."""
        self._after_s = policy.split_after_s
        self._max = policy.split_max
        self._join = join
        self._metrics = metrics
        self._background = background
        self._helps: dict[Replica, float] = {}  # moving share of batches a split would have helped
        self._joins = 0
        self._max_joins = max(1, max_connections // 4)

    def arm(self, replica: Replica, items: list[Pending]) -> asyncio.TimerHandle | None:
        """A timer that splits this batch if it is still out after ``split_after_ms``; None
        where it may not be split (too small or too big, or its replica is slow as a whole)."""
        if self._after_s <= 0 or not 1 < len(items) <= self._max or not self._would_help(replica):
            return None
        return asyncio.get_running_loop().call_later(self._after_s, self._split, replica, items)

    def answered(self, replica: Replica, round_trip_s: float, results: Sequence[Result]) -> None:
        """Learn from an answered batch whether splitting it would have helped (see above)."""
        if self._after_s <= 0 or len(results) < 2:
            return
        slowest = max(r.elapsed_ms for r in results) / 1000.0
        fastest = min(r.elapsed_ms for r in results) / 1000.0
        helps = max(0.0, round_trip_s - slowest) + fastest <= self._after_s
        share = self._helps.get(replica, _UNKNOWN)
        self._helps[replica] = share + _WEIGHT * ((1.0 if helps else 0.0) - share)

    def _would_help(self, replica: Replica) -> bool:
        return self._helps.get(replica, _UNKNOWN) > 0.5 and not replica.saturated

    def _split(self, replica: Replica, items: list[Pending]) -> None:
        if not self._would_help(replica):  # batches answered since it was sent say otherwise
            return
        loop = asyncio.get_running_loop()
        for item in items:
            if not item.future.done() and self._joins < self._max_joins:
                self._joins += 1
                self._metrics.splits += 1
                self._background(loop.create_task(self._post(replica, item)))

    async def _post(self, replica: Replica, item: Pending) -> None:
        try:
            await self._join(replica, item)
        finally:
            self._joins -= 1
