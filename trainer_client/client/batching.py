"""Coalescing calls into batch POSTs, one ``Batcher`` per (replica, endpoint) pair."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from trainer_client.client.policies import BatchPolicy
from trainer_client.client.records import Endpoint, Pending, Replica

SendBatch = Callable[[Replica, Endpoint, list[Pending]], Awaitable[None]]


class Batcher:
    """Coalesces items for one (replica, endpoint) pair into POSTs.

    While a POST of this pair is in flight, the first item of a new batch arms a
    ``batch_window`` timer and the batch goes out when it fires or reaches
    ``max_batch``; when the pair is idle the batch goes out on the next event-loop
    pass (so a lone call pays no window, and calls made together still share a POST).
    At most ``max_inflight_batches`` POSTs are outstanding per pair: beyond that,
    new items keep accumulating, so batches grow under load on their own.

    Sends also obey the replica's admission control: nothing goes out while it is held
    back after a 429, and once it has a window, only what fits (``window - outstanding``
    calls); an answer from the replica frees room and flushes its batchers again.
    """

    def __init__(self, replica: Replica, endpoint: Endpoint, policy: BatchPolicy, send: SendBatch) -> None:
        """``send`` posts one batch and settles every item in it; it must not raise."""
        self._policy = policy
        self._send_batch = send
        self._replica = replica
        self._endpoint = endpoint
        self._items: list[Pending] = []
        self._timer: asyncio.Handle | None = None
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        replica.batchers.append(self)

    @property
    def waiting(self) -> bool:
        return bool(self._items)

    def add(self, item: Pending) -> None:
        self._items.append(item)
        if len(self._items) >= self._policy.max_batch:
            self._flush()
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            if self._inflight == 0:
                # Idle: send on the next loop pass (calls made in this pass still join),
                # so a lone call pays no window. Under load, wait for company.
                self._timer = loop.call_soon(self._flush)
            else:
                self._timer = loop.call_later(self._policy.window_s, self._flush)

    def add_front(self, items: list[Pending]) -> None:
        """Put refused items back at the head of the line: they are older than the rest."""
        self._items[0:0] = items
        self.resume()

    def resume(self) -> None:
        """Room may have opened: items that already waited go out without a second window."""
        if self._items and self._timer is None:
            self._flush()

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        policy, replica = self._policy, self._replica
        held = replica.hold_until - time.monotonic()
        if held > 0:
            if self._items:
                self._timer = asyncio.get_running_loop().call_later(held, self._flush)
            return
        while self._items and self._inflight < policy.max_inflight_batches:
            room = policy.max_batch if replica.window is None else int(replica.window) - replica.outstanding
            if room <= 0:
                return  # a POST to this replica is out: its answer frees room and flushes again
            batch = self._take(min(room, policy.max_batch))
            if batch:
                self.launch(batch)

    def _take(self, count: int) -> list[Pending]:
        """The next ``count`` items, less those already settled (deadline, close)."""
        batch, self._items = self._items[:count], self._items[count:]
        live = []
        for item in batch:
            if not item.future.done():
                item.error = None  # on its way again
                live.append(item)
        return live

    def launch(self, batch: list[Pending]) -> None:
        """Send a batch now; it counts against the replica's window until answered."""
        self._inflight += 1
        self._replica.outstanding += len(batch)
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[Pending]) -> None:
        try:
            await self._send_batch(self._replica, self._endpoint, batch)
        finally:
            self._inflight -= 1
            self._replica.outstanding -= len(batch)
            for batcher in self._replica.batchers:
                batcher.resume()

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
