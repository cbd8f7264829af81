"""Session leases: the sessions of live trajectories are kept open while the policy generates.

A server closes a session nobody used for ``sessions.ttl_s`` (900 s by default): that is how
the worlds of a client that died are freed. A slow policy is not a dead client, though: a
trajectory whose next turn takes longer than the TTL to generate must find its interpreter
and its database as it left them. So the client holds a lease on the session of every live
trajectory (``ToolClient.lease_session``, called by the rollout core when a trajectory starts;
``release_session`` ends it) and renews them all in one ``POST /v1/sessions/renew`` per
replica every third of the TTL the server answers with.

Which sessions, and when:

* every held session a call was routed for, on the replica it went to: also one whose first
  call is still running (a call longer than the TTL would otherwise see its session closed
  under it), and one whose calls were all refused before they opened it (an unknown tool,
  invalid arguments) or answered from the cache: the server has no such session yet and says
  so (``unknown``), and the lease stays, because the trajectory's next call opens it;
* a lease ends only when the trajectory releases its session, or when the server says the
  session was ``closed`` (released, or idle past its TTL: gone for good, never reopened);
* rounds start every ``ttl_s / 3`` from the start of the previous one, and a round still
  unanswered when the next is due (a replica that accepts and does not answer) is abandoned:
  a slow replica never pushes the renewals of the others, or its own next one, back.

So a session is closed under a live trajectory only if no renewal reaches its replica for a
whole TTL: two rounds in a row lost, or this process's event loop blocked for more than
``2 * ttl_s / 3`` (generation runs in a thread; see ``backends.hf``).

Cost: one small request per replica per ``ttl_s / 3`` (300 s by default), whatever the
number of trajectories. A client that is gone renews nothing, and the server closes its
sessions one TTL later, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import httpx
import orjson

from trainer_client.client.records import Metrics, Replica, error_message
from trainer_client.client.routing import INSTANCE_HEADER, Router

log = logging.getLogger("trainer_client.client")

RENEW_PATH = "/v1/sessions/renew"
UNKNOWN_TTL_PERIOD_S = 5.0  # between rounds until a replica has said its TTL
MIN_PERIOD_S = 0.05  # a test server's TTL can be a fraction of a second
MAX_PERIOD_S = 300.0
CHUNK = 4096  # ids per request (~200 KB of JSON)


class SessionLeases:
    """The leased sessions and the task that renews them (running only while there are any)."""

    def __init__(
        self, http: httpx.AsyncClient, headers: dict[str, str], router: Router, metrics: Metrics
    ) -> None:
        self._http = http
        self._headers = headers
        self._router = router
        self._metrics = metrics
        self._held: set[str] = set()
        self._ttl: dict[Replica, float] = {}  # what each replica answered
        self._unsupported: set[Replica] = set()  # older servers without the endpoint
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, session: str) -> None:
        """Keep ``session`` open on its replica until ``drop``."""
        if self._closed:
            return
        self._held.add(session)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="session-leases")

    def drop(self, session: str) -> None:
        self._held.discard(session)

    async def aclose(self) -> None:
        """Stop renewing (the sessions then expire on the server after its TTL)."""
        self._closed = True
        self._held.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def period(self) -> float:
        """A third of the shortest TTL a replica answered: two renewals may fail before one expires."""
        if not self._ttl:
            return UNKNOWN_TTL_PERIOD_S
        return min(MAX_PERIOD_S, max(MIN_PERIOD_S, min(self._ttl.values()) / 3))

    async def _loop(self) -> None:
        # The first round goes out at once: it learns the TTL, which sets the pace.
        clock = asyncio.get_running_loop()
        while self._held:
            started, period = clock.time(), self.period()
            try:
                # Abandoned when the next round is due: a replica that does not answer must
                # not delay the next renewal of every session past the TTL.
                async with asyncio.timeout(period):
                    await self.renew()
            except TimeoutError:
                self._metrics.error("renew_timeout")
                log.info(
                    "a round of session renewals had no answer within %.1f s; the next one goes now", period
                )
            except Exception:  # a bug here must not end the leases of every trajectory
                log.exception("renewing sessions failed")
            await asyncio.sleep(max(0.0, started + self.period() - clock.time()))

    def _home(self, session: str) -> Replica | None:
        """The replica a call of the session went to (None: none yet, or that replica is lost)."""
        return None if self._router.lost(session) is not None else self._router.pinned(session)

    async def renew(self) -> None:
        """One round: every held session a call was routed for, in one request per replica
        (a replica whose TTL is not known yet gets an empty one, to learn it)."""
        by_replica: dict[Replica, list[str]] = {}
        for session in self._held:
            replica = self._home(session)
            if replica is not None:
                by_replica.setdefault(replica, []).append(session)
        if not self._ttl:
            by_replica.setdefault(self._router.least_loaded(), [])
        sends = [
            self._renew_on(replica, sessions[i : i + CHUNK] if sessions else [])
            for replica, sessions in by_replica.items()
            if replica not in self._unsupported and not replica.gone
            for i in range(0, max(1, len(sessions)), CHUNK)
        ]
        await asyncio.gather(*sends)

    async def _renew_on(self, replica: Replica, sessions: list[str]) -> None:
        try:
            response = await self._http.post(
                replica.url + RENEW_PATH,
                content=orjson.dumps({"sessions": sessions}),
                headers=self._headers,
                timeout=max(5.0, self.period()),
            )
        except httpx.HTTPError as exc:  # the calls see an outage for themselves; try again next round
            self._metrics.error("renew")
            log.info("renewing %d session(s) on %s failed: %r", len(sessions), replica.url, exc)
            return
        if response.status_code in (404, 405):  # a server from before leases: its TTL applies
            self._unsupported.add(replica)
            log.warning(
                "replica %s does not renew sessions (%s %s): a trajectory idle for longer than its "
                "sessions.ttl_s loses its session there; upgrade the server, or raise its sessions.ttl_s",
                replica.url,
                RENEW_PATH,
                response.status_code,
            )
            return
        if response.status_code != 200:
            self._metrics.error(f"renew_http_{response.status_code}")
            log.info(
                "renewing sessions on %s: %s %s", replica.url, response.status_code, error_message(response)
            )
            return
        self._router.seen(replica, response.headers.get(INSTANCE_HEADER))
        answer = orjson.loads(response.content)
        ttl = answer.get("ttl_s")
        if isinstance(ttl, int | float) and ttl > 0:
            self._ttl[replica] = float(ttl)
        renewed = answer.get("renewed")
        self._metrics.sessions_renewed += renewed if isinstance(renewed, int) else len(sessions)
        # Only ``closed`` ends a lease: an id that is merely unknown was not opened yet (its
        # calls were refused before they opened it, or answered from the cache), and the
        # trajectory's next call opens it. A server from before ``closed`` ends none.
        self._closed_on(replica, answer.get("closed") or ())

    def _closed_on(self, replica: Replica, closed: Iterable[str]) -> None:
        """Held sessions the replica closed (released, or idle past its TTL): their calls will
        fail ``unknown_session`` (the server says why); renewing them again would only repeat
        the question."""
        for session in closed:
            if session in self._held and self._home(session) is replica:
                self._held.discard(session)
                self._metrics.leases_expired += 1
                log.warning(
                    "session %s was closed on %s while its trajectory still runs: it was released by "
                    "another client with this token, or no renewal reached it for its sessions.ttl_s "
                    "(this process sends one every ttl_s/3: was its event loop blocked, or the replica "
                    "unreachable?); its trajectory's calls will fail with unknown_session",
                    session,
                    replica.url,
                )
