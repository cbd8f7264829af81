"""Per-trajectory sessions: created on first use, closed on release or after an idle TTL."""

from __future__ import annotations

import asyncio
import logging
import time

from protocol import ErrorKind, SessionState, ToolError, new_session_id

log = logging.getLogger(__name__)


class SessionStore:
    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, SessionState] = {}
        self._last_used: dict[str, float] = {}
        self._closed: set[str] = set()  # released ids: a late call must not resurrect them

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def create(self, session_id: str | None = None) -> SessionState:
        session_id = session_id or new_session_id()
        if session_id in self._sessions:
            return self.touch(session_id)
        if len(self._sessions) >= self.max_sessions:
            raise ToolError(
                f"too many open sessions ({self.max_sessions}); release finished trajectories "
                "with DELETE /v1/sessions/{id}",
                ErrorKind.OVERLOADED,
            )
        self._closed.discard(session_id)
        state = SessionState(session_id)
        self._sessions[session_id] = state
        self._last_used[session_id] = time.monotonic()
        return state

    def touch(self, session_id: str) -> SessionState:
        self._last_used[session_id] = time.monotonic()
        return self._sessions[session_id]

    def get_or_create(self, session_id: str) -> SessionState:
        state = self._sessions.get(session_id)
        if state is not None:
            self._last_used[session_id] = time.monotonic()
            return state
        return self.create(session_id)

    async def release(self, session_id: str) -> bool:
        state = self._sessions.pop(session_id, None)
        self._last_used.pop(session_id, None)
        if state is None:
            return False
        self._closed.add(session_id)
        if len(self._closed) > 4 * self.max_sessions:
            self._closed.clear()
        await _close_quietly(state)
        return True

    async def sweep(self) -> int:
        """Close sessions idle for longer than the TTL; returns how many were closed."""
        deadline = time.monotonic() - self.ttl_s
        expired = [sid for sid, used in self._last_used.items() if used < deadline]
        for sid in expired:
            await self.release(sid)
        return len(expired)

    async def run_sweeper(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            closed = await self.sweep()
            if closed:
                log.info("closed %d idle session(s)", closed)

    async def close_all(self) -> None:
        for sid in list(self._sessions):
            await self.release(sid)


async def _close_quietly(state: SessionState) -> None:
    try:
        await state.close()
    except Exception:  # a tool's cleanup must not break the server
        log.exception("closing session %s failed", state.id)
