"""``per_session`` upstreams: one process of the server per trajectory session, from a bounded pool.

For stdio servers that keep their state in process memory: each session gets an
instance of its own on its first call, stopped when the session closes (with the private
directory it ran in: ``server.spawn_instance``, ``${session_dir}``). At most
``max_sessions`` run at once, and one tenant (token) holds at most ``tenant_share`` of
them: however many sessions one tenant leaves open, the others still get instances.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from protocol import ErrorKind, SessionState, ToolError
from tool_server.executor.admission import ANONYMOUS_TENANT

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

    def spawn_instance(self, session_id: str) -> Instance: ...


class SessionPool:
    """The per-session instances of one upstream (``owner``)."""

    def __init__(self, owner: Owner, max_sessions: int, tenant_share: int | None = None) -> None:
        self.owner = owner
        self.max_sessions = max_sessions
        self.tenant_share = max_sessions if tenant_share is None else tenant_share
        self._instances: set[Instance] = set()
        self._held: dict[str, int] = {}  # tenant -> instances of its open sessions
        self._stopping: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Instances of open sessions (released ones still stopping not included)."""
        return len(self._instances)

    async def instance_for(self, session: SessionState, tenant: str = ANONYMOUS_TENANT) -> Instance:
        """The session's own instance, started on its first call; ToolError when there is none to give.

        ``tenant``: who owns the session; its instances count against its share.
        """
        key = f"upstream:{self.owner.name}"
        instance = session.data.get(key)
        if instance is None:
            await self._make_room(tenant)
            instance = session.data.get(key) or await self._start(session, key, tenant)
        if not await instance.wait_attempted(self.owner.connect_timeout_s + 5):
            # It goes on starting for this session: a retry may find it up.
            raise ToolError(f"{instance.label} is still starting; retry the call", ErrorKind.UNAVAILABLE)
        if not instance.healthy:  # it never restarts: the session's world is gone
            why = f": {instance.last_error}" if instance.last_error else ""
            raise ToolError(
                f"{instance.label} is {instance.state}{why}; start a new session", ErrorKind.UNAVAILABLE
            )
        return instance

    def _check_share(self, tenant: str) -> None:
        """Refuse a tenant that holds its share already (a server without tokens: all of it)."""
        if tenant == ANONYMOUS_TENANT or self._held.get(tenant, 0) < self.tenant_share:
            return
        raise ToolError(
            f"this token already holds {self.tenant_share} per-session instances of {self.owner.label}, "
            f"its share of {self.max_sessions} (max_sessions_per_tenant); release its finished sessions "
            "(DELETE /v1/sessions/{id}) or retry later",
            ErrorKind.OVERLOADED,
        )

    async def _make_room(self, tenant: str) -> None:
        """Wait until a new instance of ``tenant`` fits in ``max_sessions`` and in its share.

        Released instances count until their process is gone (a slow one takes seconds
        to exit); a session that comes meanwhile waits for one of them, not for a live one.
        """
        while True:
            if not self.owner.started:
                raise ToolError(f"{self.owner.label} is stopped", ErrorKind.UNAVAILABLE)
            self._check_share(tenant)
            if len(self._instances) + len(self._stopping) < self.max_sessions:
                return
            if len(self._instances) >= self.max_sessions:
                raise ToolError(
                    f"{self.owner.label} already runs {self.max_sessions} per-session instances "
                    "(max_sessions); release finished sessions (DELETE /v1/sessions/{id}) or retry later",
                    ErrorKind.OVERLOADED,
                )
            await asyncio.wait(set(self._stopping), return_when=asyncio.FIRST_COMPLETED)

    async def _start(self, session: SessionState, key: str, tenant: str) -> Instance:
        instance = session.data[key] = self.owner.spawn_instance(session.id)
        self._instances.add(instance)
        self._held[tenant] = self._held.get(tenant, 0) + 1
        session.on_close(lambda: self._release(instance, tenant))
        await instance.start(wait=False)
        return instance

    async def stop(self) -> None:
        """Stop every instance, and wait for those already stopping."""
        instances, self._instances = list(self._instances), set()
        self._held.clear()
        waits = [instance.stop() for instance in instances] + list(self._stopping)
        await asyncio.gather(*waits, return_exceptions=True)

    def _release(self, instance: Instance, tenant: str) -> None:
        """Its session closed: stop the instance in the background (closing must not wait for it)."""
        if instance not in self._instances:
            return  # the pool was stopped: stop() stops it
        self._instances.discard(instance)
        self._held[tenant] -= 1
        if not self._held[tenant]:
            del self._held[tenant]
        task = asyncio.get_running_loop().create_task(instance.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
