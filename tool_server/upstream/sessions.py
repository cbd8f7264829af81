"""``per_session`` upstreams: one process of the server per trajectory session, from a bounded pool.

For stdio servers that keep their state in process memory: each session gets an
instance of its own on its first call, stopped when the session closes. At most
``max_sessions`` run at once.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from protocol import ErrorKind, SessionState, ToolError

__all__ = ["SessionPool"]


class Instance(Protocol):
    """One per-session process of an upstream (an ``UpstreamServer`` of ``server``)."""

    label: str
    healthy: bool
    state: str
    last_error: str | None

    async def start(self, *, wait: bool = True) -> None: ...

    async def wait_attempted(self, timeout_s: float) -> bool: ...

    async def stop(self) -> None: ...


class Owner(Protocol):
    """The upstream whose per-session instances a pool holds (``server.UpstreamServer``)."""

    name: str
    label: str
    started: bool
    connect_timeout_s: float

    def spawn_instance(self) -> Instance: ...


class SessionPool:
    """The per-session instances of one upstream (``owner``)."""

    def __init__(self, owner: Owner, max_sessions: int) -> None:
        self.owner = owner
        self.max_sessions = max_sessions
        self._instances: set[Instance] = set()
        self._stopping: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Instances of open sessions (released ones still stopping not included)."""
        return len(self._instances)

    async def instance_for(self, session: SessionState) -> Instance:
        """The session's own instance, started on its first call; ToolError when there is none to give."""
        key = f"upstream:{self.owner.name}"
        instance = session.data.get(key)
        if instance is None:
            await self._make_room()
            instance = session.data.get(key) or await self._start(session, key)
        if not await instance.wait_attempted(self.owner.connect_timeout_s + 5):
            # It goes on starting for this session: a retry may find it up.
            raise ToolError(f"{instance.label} is still starting; retry the call", ErrorKind.UNAVAILABLE)
        if not instance.healthy:  # it never restarts: the session's world is gone
            why = f": {instance.last_error}" if instance.last_error else ""
            raise ToolError(
                f"{instance.label} is {instance.state}{why}; start a new session", ErrorKind.UNAVAILABLE
            )
        return instance

    async def _make_room(self) -> None:
        """Wait until a new instance fits in ``max_sessions``.

        Released instances count until their process is gone (a slow one takes seconds
        to exit); a session that comes meanwhile waits for one of them, not for a live one.
        """
        while True:
            if not self.owner.started:
                raise ToolError(f"{self.owner.label} is stopped", ErrorKind.UNAVAILABLE)
            if len(self._instances) + len(self._stopping) < self.max_sessions:
                return
            if len(self._instances) >= self.max_sessions:
                raise ToolError(
                    f"{self.owner.label} already runs {self.max_sessions} per-session instances "
                    "(max_sessions); release finished sessions (DELETE /v1/sessions/{id}) or retry later",
                    ErrorKind.OVERLOADED,
                )
            await asyncio.wait(set(self._stopping), return_when=asyncio.FIRST_COMPLETED)

    async def _start(self, session: SessionState, key: str) -> Instance:
        instance = session.data[key] = self.owner.spawn_instance()
        self._instances.add(instance)
        session.on_close(lambda: self._release(instance))
        await instance.start(wait=False)
        return instance

    async def stop(self) -> None:
        """Stop every instance, and wait for those already stopping."""
        instances, self._instances = list(self._instances), set()
        waits = [instance.stop() for instance in instances] + list(self._stopping)
        await asyncio.gather(*waits, return_exceptions=True)

    def _release(self, instance: Instance) -> None:
        """Its session closed: stop the instance in the background (closing must not wait for it)."""
        self._instances.discard(instance)
        task = asyncio.get_running_loop().create_task(instance.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
