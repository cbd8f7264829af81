"""Per-trajectory sessions: owned by a tenant, created on first use, closed on release or expiry.

The guarantees, in the order a caller meets them:

* a session belongs to the tenant (bearer token) whose call or ``POST /v1/sessions``
  created it; to every other tenant its id is unknown (``unknown_session``), for calls
  and for ``DELETE`` alike, so no tenant can read, use or close another's state;
* a released or expired id stays dead: a late call with it gets ``unknown_session``
  instead of silently starting a fresh, empty world (ids are remembered for
  ``closed_ttl_s``);
* a session lives in this process only: a client that names the process its sessions were
  opened on (``fence``: the ``X-Toolfactory-Instance`` header, ``_meta["toolfactory/instance"]``
  on MCP) and reaches another one (the replica restarted at the same address) gets
  ``unknown_session`` for every session this process does not hold, never an empty one;
* a session lives while it is used: every call, ``POST /v1/sessions`` of its id and
  ``POST /v1/sessions/renew`` (what the trainer client sends for the sessions of live
  trajectories, every third of the TTL) restart its ``ttl_s``; one idle longer is closed, so
  the sessions of a client that is gone are closed within ``ttl_s`` plus one sweep. A renewal
  says which of the caller's ids were closed (gone for good) apart from those not opened yet;
* a session with a call in flight (admitted: queued or running) is never closed for being
  idle, however long the call takes, and its ``ttl_s`` restarts when that call ends: a call
  longer than the TTL (an MCP client sends no renewals) never lands in a released world;
* at most ``max_sessions`` are open, and one tenant holds at most its share
  (``max_per_tenant``, 3/4 of them by default; all of them on a server without tokens,
  which has one tenant); beyond either, new ones are refused as ``overloaded``, so no
  tenant can take the last free session from the others.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

from protocol import ErrorKind, SessionState, ToolError, new_session_id
from tool_server.config import ConfigError
from tool_server.stores import TTLStore

log = logging.getLogger(__name__)
CLOSED_TTL_S = 24 * 3600.0  # how long a released id is remembered as released
INSTANCE_HEADER = "x-toolfactory-instance"  # this process's instance id; on a request, the one expected


def tenant_session_share(max_sessions: int, max_per_tenant: int | None) -> int:
    """Open sessions one token may hold: the configured share, or 3/4 of ``max_sessions``.

    3/4 by default (as for admitted calls): one busy tenant still gets most of the table,
    while a quarter stays open to the others however many sessions it opens.
    """
    if max_per_tenant is not None and max_per_tenant < 1:
        raise ConfigError(
            f"sessions.max_sessions_per_tenant must be at least 1 (or null), got {max_per_tenant}"
        )
    if max_per_tenant is not None:
        return min(max_sessions, max_per_tenant)
    return max(1, max_sessions * 3 // 4)


class SessionStore:
    def __init__(
        self,
        ttl_s: float,
        max_sessions: int,
        max_per_tenant: int | None = None,
        *,
        sole_tenant: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sole_tenant``: the one tenant of a server without tokens, which may fill the
        whole table (the executor names ``ANONYMOUS_TENANT``). ``clock``: what idle times are
        measured with (a test moves its own)."""
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_sessions = max_sessions
        self.tenant_share = tenant_session_share(max_sessions, max_per_tenant)
        self.sole_tenant = sole_tenant
        self._sessions: dict[str, SessionState] = {}
        self._owners: dict[str, str] = {}
        self._last_used: dict[str, float] = {}
        self._by_tenant: dict[str, int] = {}  # open sessions per owner, against its share
        # (tenant, session id) -> its calls in flight; keyed by tenant too, so that another
        # token's calls naming the id (refused when they run) do not keep it open.
        self._in_flight: dict[tuple[str, str], int] = {}
        # Released ids -> owner: a late call must not resurrect them.
        self._closed: TTLStore[str, str] = TTLStore(4 * max_sessions, CLOSED_TTL_S)
        # Drawn anew by every process: a restarted replica at the same address is told apart.
        self.instance = secrets.token_hex(8)
        self._started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def open(self, tenant: str, session_id: str) -> SessionState:
        """The tenant's session of that id, created on first use. Raises ToolError otherwise."""
        state = self._sessions.get(session_id)
        if state is not None and self._owners[session_id] == tenant:
            self._last_used[session_id] = self.clock()
            return state
        if state is None and self._closed.get(session_id) is None:
            return self._add(tenant, session_id)
        raise ToolError(
            f"no open session {session_id!r}: it was released or expired (its state is gone), "
            "or it belongs to another token; start the trajectory with a new session id",
            ErrorKind.UNKNOWN_SESSION,
        )

    def peek(self, tenant: str, session_id: str) -> SessionState | None:
        """The tenant's open session of that id, or None: opens nothing and renews nothing."""
        state = self._sessions.get(session_id)
        return state if state is not None and self._owners.get(session_id) == tenant else None

    def renew(self, tenant: str, session_ids: list[str]) -> tuple[list[str], list[str]]:
        """Restart the TTL of the tenant's open sessions among ``session_ids``; a renewal
        never opens a session.

        Returns ``(unknown, closed)``: the ids the tenant holds no open session of (released,
        expired, not opened yet, or another tenant's), and among them the ones it held and
        that were closed (released or expired: gone for good). The rest may still open: a
        call refused before it opened its session (an unknown tool, invalid arguments) or
        answered from the cache leaves none, and its trajectory's next call opens it. Another
        tenant's closed id is only ``unknown``: the answer tells nothing of other tokens.
        """
        now = self.clock()
        unknown, closed = [], []
        for session_id in session_ids:
            if self._owners.get(session_id) == tenant:
                self._last_used[session_id] = now
                continue
            unknown.append(session_id)
            if self._closed.get(session_id) == tenant:
                closed.append(session_id)
        return unknown, closed

    def call_began(self, key: tuple[str, str]) -> None:
        """A call of session ``key`` = (tenant, session id) was admitted: until it ends, the
        session is not swept (it may not be open yet: its first call opens it)."""
        in_flight = self._in_flight
        in_flight[key] = in_flight.get(key, 0) + 1

    def call_ended(self, key: tuple[str, str]) -> None:
        """The call ``call_began`` counted has ended: its session's TTL restarts now."""
        in_flight = self._in_flight
        left = in_flight[key] - 1
        if left:
            in_flight[key] = left
        else:
            del in_flight[key]  # no entry for a session without calls: the table stays small
        tenant, session_id = key
        if self._owners.get(session_id) == tenant:
            self._last_used[session_id] = self.clock()

    def share(self, tenant: str) -> int:
        # A server without tokens has one tenant: it may fill the whole table.
        return self.max_sessions if tenant == self.sole_tenant else self.tenant_share

    def fence(self, expected: str | None, session_id: str) -> str | None:
        """Why a call of ``session_id`` must be refused, when the client expects its sessions
        on process ``expected``; None when it may go on.

        A client names the process that answered its session before. If that is another
        process, one this process holds (opened here since it started) goes on; any other
        lived in a process that is gone, and creating it here would hand the trajectory an
        empty state, so it is refused. (A brand-new session is refused too: the client
        sends it again naming this process, and then it is created.)
        """
        if expected is None or expected == self.instance or session_id in self._sessions:
            return None
        return (
            f"session {session_id!r} is not on this replica: the process it was opened on "
            f"(instance {expected}) is gone, and this one (instance {self.instance}, started "
            f"{self._started}) never held it, so its state is lost; it is not started again "
            "empty. Start the trajectory again with a new session"
        )

    def create(self, tenant: str, session_id: str | None = None) -> SessionState:
        """Explicit creation (``POST /v1/sessions``); idempotent for the owner.

        The owner may reopen an id it released; an id another tenant holds is refused.
        """
        session_id = session_id or new_session_id()
        state = self._sessions.get(session_id)
        if state is not None:
            if self._owners[session_id] != tenant:
                raise _taken(session_id)
            self._last_used[session_id] = self.clock()
            return state
        closed_by = self._closed.get(session_id)
        if closed_by is not None and closed_by != tenant:
            raise _taken(session_id)
        return self._add(tenant, session_id)

    def _add(self, tenant: str, session_id: str) -> SessionState:
        if len(self._sessions) >= self.max_sessions:
            raise ToolError(
                f"too many open sessions ({self.max_sessions}); release finished trajectories "
                "with DELETE /v1/sessions/{id}",
                ErrorKind.OVERLOADED,
            )
        held = self._by_tenant.get(tenant, 0)
        if held >= self.share(tenant):
            raise ToolError(
                f"your token holds {held} open sessions, as many as one token may "
                f"(sessions.max_sessions_per_tenant); release finished trajectories with "
                "DELETE /v1/sessions/{id}, or ask for a larger share",
                ErrorKind.OVERLOADED,
            )
        state = SessionState(session_id)
        self._sessions[session_id] = state
        self._owners[session_id] = tenant
        self._last_used[session_id] = self.clock()
        self._by_tenant[tenant] = held + 1
        return state

    async def release(self, tenant: str | None, session_id: str) -> bool:
        """Close a session; ``tenant=None`` (expiry, shutdown) closes whoever owns it."""
        owner = self._owners.get(session_id)
        if owner is None or (tenant is not None and owner != tenant):
            return False
        state = self._sessions.pop(session_id)
        del self._owners[session_id], self._last_used[session_id]
        left = self._by_tenant[owner] - 1
        if left:
            self._by_tenant[owner] = left
        else:
            del self._by_tenant[owner]  # no entry for a token without sessions: it stays small
        self._closed.put(session_id, owner)
        await _close_quietly(state)
        return True

    async def sweep(self) -> int:
        """Close sessions idle for longer than the TTL; returns how many were closed.

        A session with a call in flight is not idle, whenever it was last used.
        """
        deadline = self.clock() - self.ttl_s
        closed = 0
        for sid in [sid for sid in self._last_used if self._idle_since(sid, deadline)]:
            # Checked again: a call may have come for it while an earlier one was closing.
            if self._idle_since(sid, deadline):
                await self.release(None, sid)
                closed += 1
        return closed

    def _idle_since(self, session_id: str, deadline: float) -> bool:
        """The session is open, last used before ``deadline`` and has no call in flight."""
        used = self._last_used.get(session_id)
        if used is None or used >= deadline:
            return False
        return (self._owners[session_id], session_id) not in self._in_flight

    async def run_sweeper(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            closed = await self.sweep()
            if closed:
                log.info("closed %d idle session(s)", closed)

    async def close_all(self) -> None:
        for sid in list(self._sessions):
            await self.release(None, sid)


def _taken(session_id: str) -> ToolError:
    return ToolError(
        f"session id {session_id!r} is taken; choose another, or omit it to get a fresh one",
        ErrorKind.BAD_REQUEST,
    )


async def _close_quietly(state: SessionState) -> None:
    try:
        await state.close()
    except Exception:  # a tool's cleanup must not break the server
        log.exception("closing session %s failed", state.id)
