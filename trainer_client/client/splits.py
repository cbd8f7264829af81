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

A late batch is not split either when nothing says one of its calls is to blame:

* its answer has begun to arrive (the server is done with every call in it);
* the split's timer ran late by more than half of ``split_after_ms``: the client's event loop
  is behind (its own CPU is the limit), and answers may only be waiting to be read;
* other batches to the replica are out too, and none sent after it has come back: the replica
  may just be working through its queue, which a split POST would join. (Once a later batch
  is back, the replica is not queueing behind this one: a call in it is slow.)

A client busy enough would otherwise find its batches "late" only because it had not read
their answers yet, and split them: one more POST per call, more CPU, later still (hundreds of
split POSTs per run at ``max_batch=64``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from protocol import Result
from trainer_client.client.policies import BatchPolicy
from trainer_client.client.records import Metrics, Pending, Replica
from trainer_client.client.transport import Exchange

__all__ = ["Splitter"]

Join = Callable[[Replica, Pending], Awaitable[None]]

_WEIGHT = 1 / 8  # moving average over ~8 batches
_UNKNOWN = 0.5  # a replica's start: undecided, so no split until one batch says it helps


class Splitter:
    """Decides which late batches get split POSTs, and sends them (through ``join``).

    Split POSTs each hold a connection for as long as their call runs; past a quarter of the
    pool they would make the batches queue for connections, so beyond that a late batch simply
    stays whole.
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
        self._answered: dict[Replica, int] = {}  # the latest batch (``Replica.batches`` number) answered
        self._joins = 0
        self._max_joins = max(1, max_connections // 4)

    def arm(
        self, replica: Replica, number: int, items: list[Pending], exchange: Exchange
    ) -> asyncio.TimerHandle | None:
        """A timer that splits batch ``number`` (of the replica's) if it is still out after
        ``split_after_ms`` and nothing else explains it (see above); None where it may not be
        split (too small or too big, or its replica is slow as a whole)."""
        if self._after_s <= 0 or not 1 < len(items) <= self._max or not self._would_help(replica):
            return None
        loop = asyncio.get_running_loop()
        due = loop.time() + self._after_s
        return loop.call_later(self._after_s, self._split, replica, number, items, exchange, due)

    def answered(self, replica: Replica, number: int, round_trip_s: float, results: Sequence[Result]) -> None:
        """Learn from answered batch ``number`` whether splitting it would have helped (see above)."""
        if number > self._answered.get(replica, 0):
            self._answered[replica] = number
        if self._after_s <= 0 or len(results) < 2:
            return
        slowest = max(r.elapsed_ms for r in results) / 1000.0
        fastest = min(r.elapsed_ms for r in results) / 1000.0
        helps = max(0.0, round_trip_s - slowest) + fastest <= self._after_s
        share = self._helps.get(replica, _UNKNOWN)
        self._helps[replica] = share + _WEIGHT * ((1.0 if helps else 0.0) - share)

    def _would_help(self, replica: Replica) -> bool:
        return self._helps.get(replica, _UNKNOWN) > 0.5 and not replica.saturated

    def _split(
        self, replica: Replica, number: int, items: list[Pending], exchange: Exchange, due: float
    ) -> None:
        loop = asyncio.get_running_loop()
        if exchange.answering:  # answered: its results are only waiting for the event loop
            return
        if loop.time() - due > self._after_s / 2:  # the loop runs late: the client is the bottleneck
            return
        if replica.outstanding > len(items) and self._answered.get(replica, 0) < number:
            return  # other batches are out, none sent later is back: the replica may be queueing
        if not self._would_help(replica):  # batches answered since it was sent say otherwise
            return
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
