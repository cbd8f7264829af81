"""Per-session order: a session's stateful calls run one at a time, in the order they arrive.

Each such call takes a ``Turn`` at the end of its session's queue when it is admitted
(batch order, then arrival order), waits for the call before it to end, and passes the
turn on when it ends itself, however it ends. Sessions are independent of each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

__all__ = ["SessionOrder", "Turn"]


class Turn:
    """A stateful call's place in its session's queue: it runs once the call before it ended.

    ``end`` passes the turn on. A call cancelled while still waiting passes it on only
    when its own predecessor ends, so the order holds across cancellations.
    """

    __slots__ = ("previous", "finished")

    def __init__(self, previous: asyncio.Future[None] | None, finished: asyncio.Future[None]) -> None:
        self.previous = previous
        self.finished = finished

    async def wait(self) -> None:
        if self.previous is not None and not self.previous.done():
            await asyncio.shield(self.previous)

    def end(self) -> None:
        if self.previous is None or self.previous.done():
            _resolve(self.finished)
        else:
            self.previous.add_done_callback(lambda _: _resolve(self.finished))


class SessionOrder:
    """The queues of stateful calls, one per session; a session without calls holds nothing."""

    __slots__ = ("_tails",)

    def __init__(self) -> None:
        # session key -> the end of its last stateful call: the next one waits for it.
        self._tails: dict[Hashable, asyncio.Future[None]] = {}

    def __len__(self) -> int:
        """Sessions with a stateful call admitted and not yet ended."""
        return len(self._tails)

    def take(self, session_key: Hashable) -> Turn:
        """A place at the end of the session's queue of stateful calls."""
        tails = self._tails
        turn = Turn(tails.get(session_key), asyncio.get_running_loop().create_future())
        tails[session_key] = turn.finished

        def forget(finished: asyncio.Future[None]) -> None:
            if tails.get(session_key) is finished:  # nobody queued behind it
                del tails[session_key]

        turn.finished.add_done_callback(forget)
        return turn


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
