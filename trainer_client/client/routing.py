"""Which replica a call goes to.

Calls that carry a session stick to one replica (the session's state lives there),
chosen by rendezvous hashing so that every client process picks the same one. Other
calls go to the least-loaded healthy replica that is not draining.

A session never moves once a replica has answered for it: its state exists only in that
process, and another replica would silently start it from an empty state. When that
replica goes away (it refuses connections, or discovery dropped it) the session is
*lost*: its calls end ``unknown_session`` with a message that says so. A session that no
replica has answered for yet has nothing to lose and is simply re-homed.

A new process at the same address (a container restarted, a pod that kept its IP) is
told apart by the instance id every answer names (``INSTANCE_HEADER``): the sessions that
landed on the old process are lost, and every batch names the process its sessions are
expected on, so the new one refuses them rather than start them empty.
"""

from __future__ import annotations

import hashlib
import logging

from trainer_client.client.records import Metrics, Pending, Replica

log = logging.getLogger("trainer_client.client")
INSTANCE_HEADER = "x-toolfactory-instance"  # the server process that answered; on a request, the expected one


class SessionLost(Exception):
    """The replica holding a session's state went away; the message says which and what to do."""


class Router:
    def __init__(self, replicas: list[Replica], metrics: Metrics) -> None:
        self.replicas = replicas  # shared with the health monitor and discovery (changed in place)
        self._metrics = metrics
        self._sessions: dict[str, Replica] = {}
        # Sessions a replica has answered for -> the process (instance) that holds their state.
        self._landed: dict[str, str | None] = {}
        self._lost: dict[str, str] = {}  # session -> why its calls fail
        self._instances: dict[Replica, str] = {}  # the process each replica answered from last
        self._restarted: set[Replica] = set()  # replicas seen answering from a new process

    def route(self, item: Pending, prefer: Replica | None) -> Replica:
        """The replica for one call; raises ``SessionLost`` for a call of a lost session."""
        if item.pinned is not None:
            return item.pinned  # it may be running there: only that process can answer for it
        if item.session is not None:
            return self.home(item.session)
        if prefer is not None and prefer.healthy:
            return prefer  # a retry stays put, so the server's idempotency store sees it
        return self.least_loaded()

    def home(self, session: str) -> Replica:
        """The replica that holds (or will hold) a session's state."""
        why = self._lost.get(session)
        if why is not None:
            raise SessionLost(why)
        pinned = self._sessions.get(session)
        if pinned is not None:
            if session in self._landed:
                if pinned.gone:
                    raise SessionLost(self._lose(session, pinned, "left the replica set (dropped from DNS)"))
                return pinned  # even while marked down: a slow probe is no reason to lose its state
            if pinned.healthy and not pinned.draining and not pinned.gone:
                return pinned
        replica = self.hash_replica(session)
        if pinned is not None and replica is not pinned:
            self._metrics.session_moves += 1  # no replica had answered for it: nothing left behind
        self._sessions[session] = replica
        return replica

    def landed(self, session: str, replica: Replica) -> None:
        """A replica answered for the session: from now on it lives there and nowhere else."""
        self._landed.setdefault(session, self._instances.get(replica))

    def instance(self, replica: Replica) -> str | None:
        """The process a replica answered from last (None before it named one)."""
        return self._instances.get(replica)

    def seen(self, replica: Replica, instance: str | None) -> None:
        """A replica answered from process ``instance``; a new one means it restarted, and
        every session that lived in the process before is lost."""
        old = self._instances.get(replica)
        if instance is None or instance == old:
            return
        self._instances[replica] = instance
        if old is None:
            return
        self._restarted.add(replica)
        why = f"restarted (instance {old} is now {instance})"
        for session, landed_on in self._landed.items():
            if landed_on != instance and session not in self._lost and self._sessions.get(session) is replica:
                self._lose(session, replica, why)

    def restarted(self, replica: Replica) -> bool:
        """The replica has answered from more than one process: a batch placed before the
        new one was seen may hold calls of sessions lost since (``lost``)."""
        return replica in self._restarted

    def lost(self, session: str) -> str | None:
        """Why a session's calls fail, or None if it is not lost."""
        return self._lost.get(session)

    def fenced_new(self, session: str, sent: str | None, replica: Replica) -> bool:
        """A session no replica had answered for was refused because its batch named a process
        that is gone: nothing ran, and it had no state to lose, so it may be sent again."""
        return sent is not None and session not in self._landed and self._instances.get(replica) != sent

    def refused(self, session: str, replica: Replica) -> str | None:
        """``replica`` refused a connection: the process is gone, and with it the state of any
        session that lived there. Returns why the session is lost, or None if it had no state there."""
        if session in self._landed and self._sessions.get(session) is replica:
            return self._lose(session, replica, "refused the connection (its process is gone)")
        return None

    def pin(self, session: str, replica: Replica) -> None:
        """An explicit ``POST /v1/sessions`` was answered by ``replica``."""
        self._sessions[session] = replica
        self._landed[session] = self._instances.get(replica)

    def pinned(self, session: str) -> Replica | None:
        return self._sessions.get(session)

    def landed_on(self, session: str) -> Replica | None:
        """The replica holding the session's state (None: no replica answered for it yet, or it is lost)."""
        if session not in self._landed or session in self._lost:
            return None
        return self._sessions.get(session)

    def forget(self, session: str) -> Replica | None:
        """Stop tracking a session; returns the replica to release it on (None: it is gone)."""
        self._landed.pop(session, None)
        lost = self._lost.pop(session, None)
        replica = self._sessions.pop(session, None)
        if lost is not None or (replica is not None and replica.gone):
            return None
        return replica or self.hash_replica(session)

    def sessions_on(self, replica: Replica) -> int:
        return sum(1 for r in self._sessions.values() if r is replica)

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
        serving = [r for r in self.replicas if not r.draining] or self.replicas
        healthy = [r for r in serving if r.healthy]
        return healthy or serving  # all marked down: try anyway, a success marks it up

    def _lose(self, session: str, replica: Replica, why: str) -> str:
        message = (
            f"session {session} lived on replica {replica.url}, which {why}: its state went with it, "
            "so its calls fail rather than go on from an empty state (on another replica, or on a new "
            "process at that address); "
            "start the trajectory again with a new session"
        )
        self._lost[session] = message
        self._metrics.sessions_lost += 1
        log.warning("session %s lost: replica %s %s", session, replica.url, why)
        return message
