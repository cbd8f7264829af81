"""Which replica a call goes to.

Calls that carry a session stick to one replica (the session's state lives there),
chosen by rendezvous hashing so that every client process picks the same one. Other
calls go to the least-loaded healthy replica.
"""

from __future__ import annotations

import hashlib
import logging

from trainer_client.client_records import Metrics, Pending, Replica

log = logging.getLogger("trainer_client.client")


class Router:
    def __init__(self, replicas: list[Replica], metrics: Metrics) -> None:
        self.replicas = replicas
        self._metrics = metrics
        self._sessions: dict[str, Replica] = {}

    def route(self, item: Pending, prefer: Replica | None) -> Replica:
        if item.pinned is not None:
            return item.pinned  # it may be running there: only that process can answer for it
        session = item.session
        if session is not None:
            pinned = self._sessions.get(session)
            if pinned is not None and (pinned.healthy or not any(r.healthy for r in self.replicas)):
                return pinned
            replica = self.hash_replica(session)
            if pinned is not None and replica is not pinned:
                self._metrics.session_moves += 1  # its state stayed behind on a dead replica
                log.warning("session %s moved from %s to %s", session, pinned.url, replica.url)
            self._sessions[session] = replica
            return replica
        if prefer is not None and prefer.healthy:
            return prefer  # a retry stays put, so the server's idempotency store sees it
        return self.least_loaded()

    def pin(self, session: str, replica: Replica) -> None:
        self._sessions[session] = replica

    def pinned(self, session: str) -> Replica | None:
        return self._sessions.get(session)

    def forget(self, session: str) -> Replica:
        """Stop tracking a session; returns the replica that holds (or would hold) it."""
        return self._sessions.pop(session, None) or self.hash_replica(session)

    def least_loaded(self) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        return min(self._candidates(), key=lambda r: r.load)

    def hash_replica(self, session: str) -> Replica:
        """Rendezvous hashing: every client process maps a session to the same replica."""

        def weight(replica: Replica) -> bytes:
            return hashlib.blake2b(f"{replica.url}|{session}".encode(), digest_size=8).digest()

        return max(self._candidates(), key=weight)

    def _candidates(self) -> list[Replica]:
        healthy = [r for r in self.replicas if r.healthy]
        return healthy or self.replicas  # all marked down: try anyway, a success marks it up
