"""Execution slots shared fairly between tenants.

A FIFO semaphore lets one tenant that queued 16k slow calls make every other tenant's
call wait behind its whole backlog. ``FairSlots`` keeps one FIFO queue per tenant and
hands a freed slot to the tenants with waiting calls in turn (round-robin): a tenant's
call waits for at most one call of each other waiting tenant. With one tenant it is a
plain FIFO semaphore, and a slot free with nobody waiting is taken without a future.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["FairSlots"]


class FairSlots:
    """``limit`` slots; ``acquire(tenant)`` waits for one, ``release()`` gives it back."""

    __slots__ = ("_free", "_queues", "_turns")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"FairSlots needs at least one slot, got {limit}")
        self._free = limit
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}  # tenants with waiting calls
        self._turns: deque[str] = deque()  # those tenants, next to be served first

    @property
    def free(self) -> int:
        """Slots neither held nor handed to a waiter."""
        return self._free

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    async def acquire(self, tenant: str) -> None:
        if self._free and not self._turns:  # the hot path: a free slot and nobody before us
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
            self._turns.append(tenant)
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():  # still queued: leave the queue
                self._forget(tenant, waiter)
            else:  # handed a slot, then cancelled before it ran: pass the slot on
                self.release()
            raise

    def release(self) -> None:
        self._free += 1
        # Hand the slot over directly (the free count never shows it), so that a new caller
        # cannot overtake the waiters: the order stays FIFO within a tenant.
        while self._free and self._turns:
            tenant = self._turns.popleft()
            queue = self._queues[tenant]
            waiter = queue.popleft()
            if queue:
                self._turns.append(tenant)  # its next call waits for the others' turns
            else:
                del self._queues[tenant]
            if not waiter.done():  # a cancelled waiter not yet removed by its task
                waiter.set_result(None)
                self._free -= 1

    def _forget(self, tenant: str, waiter: asyncio.Future[None]) -> None:
        queue = self._queues.get(tenant)
        if queue is None or waiter not in queue:  # release() already dropped it
            return
        queue.remove(waiter)
        if not queue:
            del self._queues[tenant]
            self._turns.remove(tenant)
