"""Which replicas are up: failures mark one down, ``/healthz`` probes bring it back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from trainer_client.client.policies import HealthPolicy, RetryPolicy
from trainer_client.client.records import Metrics, Replica
from trainer_client.client.routing import INSTANCE_HEADER

log = logging.getLogger("trainer_client.client")


class HealthMonitor:
    """Marks replicas down and up; probes every ``interval_s`` and after each failure.

    ``on_up`` runs when a replica comes back, so that calls waiting out its outage go now;
    ``on_instance`` gets the server process each probe was answered from (a restart shows).
    """

    def __init__(
        self,
        replicas: list[Replica],
        http: httpx.AsyncClient,
        headers: dict[str, str],
        policy: HealthPolicy,
        retry: RetryPolicy,
        metrics: Metrics,
        on_up: Callable[[], None],
        on_instance: Callable[[Replica, str | None], None],
    ) -> None:
        self._replicas = replicas
        self._http = http
        self._headers = headers
        self._policy = policy
        self._retry = retry
        self._metrics = metrics
        self._on_up = on_up
        self._on_instance = on_instance
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        if self._loop_task is None and self._policy.interval_s > 0:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    def mark_down(self, replica: Replica, why: str) -> None:
        replica.failures += 1
        self._down(replica, why)
        self.schedule_probe(replica)

    def mark_up(self, replica: Replica) -> None:
        replica.failures = 0
        if not replica.healthy:
            replica.healthy = True
            replica.described = None  # maybe a new process with another config: learn again
            self._metrics.replica_up += 1
            log.info("replica %s is back up", replica.url)
            self._on_up()

    def schedule_probe(self, replica: Replica) -> None:
        """Probe a replica that just failed, and keep probing while it stays down."""
        if self._closed or replica.gone:  # gone: discovery dropped it for good
            return
        if replica.probing is not None and not replica.probing.done():
            return
        replica.probing = asyncio.get_running_loop().create_task(self._revive(replica))

    async def probe(self, replica: Replica) -> bool:
        try:
            response = await self._http.get(
                replica.url + "/healthz", headers=self._headers, timeout=self._policy.timeout_s
            )
            ok = response.status_code == 200
            self._on_instance(replica, response.headers.get(INSTANCE_HEADER))
        except httpx.HTTPError as exc:
            ok, why = False, f"/healthz failed: {exc!r}"
        except Exception as exc:  # a bug: say so, and count the replica as down
            log.error("unexpected error probing %s", replica.url, exc_info=exc)
            ok, why = False, f"/healthz probe crashed: {exc!r}"
        else:
            why = f"/healthz answered {response.status_code}"
        if ok:
            self.mark_up(replica)
        else:
            self._down(replica, why)
        return ok

    async def aclose(self) -> None:
        self._closed = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for replica in self._replicas:
            if replica.probing is not None:
                replica.probing.cancel()

    def _down(self, replica: Replica, why: str) -> None:
        if replica.healthy:
            replica.healthy = False
            self._metrics.replica_down += 1
            log.warning("replica %s marked down: %s", replica.url, why)

    async def _revive(self, replica: Replica) -> None:
        delay = self._retry.backoff_s
        while not self._closed:
            if await self.probe(replica):
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, max(self._retry.max_backoff_s, self._retry.backoff_s))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._policy.interval_s)
            await asyncio.gather(*(self.probe(r) for r in self._replicas))  # probe() never raises
