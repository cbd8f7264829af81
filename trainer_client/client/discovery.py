"""Replicas found in DNS: every A/AAAA record of one name is a tool-server replica.

A headless Kubernetes Service (``clusterIP: None``) or a compose service name resolves to
one address per ready replica. Give ``ToolClient`` (or ``trainer-client rollout --server``)
``dns://NAME:PORT`` instead of replica URLs, and the client resolves NAME when it is made
(one blocking lookup; a name without any address is a ``ValueError``: start the trainer
once the replicas are ready), then again in the background every ``refresh_s`` seconds
(``dns://NAME:PORT?refresh_s=2``; default 5). ``dns+https://`` makes the replica URLs https.

What a new lookup changes:

* an address that appears becomes a replica at once: new sessions and stateless calls
  may go there, and calls waiting for any replica to come back go now;
* an address that vanished is *drained*: it gets no new session and no stateless call,
  while the sessions that live there keep going to it (their state is there). It is
  dropped once none of them is left and nothing is in flight there, or as soon as it is
  marked down. Calls of a session still on a dropped replica end ``unknown_session`` with
  a message naming the replica (``routing``): never sent to another replica, where
  the session would silently start from an empty state;
* an address that comes back while draining serves again;
* a failed lookup changes nothing (a DNS hiccup must not drain the fleet).

Kubernetes removes a pod from the headless Service when it stops being ready (and when it
starts terminating), so a replica's sessions get ``terminationGracePeriodSeconds`` (and a
``preStop`` pause) to finish: see ``compose/k8s/`` and ``docs/scaling.md``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from trainer_client.client.records import Replica
from trainer_client.client.routing import Router

__all__ = ["DnsName", "Discovery", "dns_name", "resolve"]

log = logging.getLogger("trainer_client.client")

SCHEMES = {"dns": "http", "dns+http": "http", "dns+https": "https"}  # -> the replicas' scheme
DEFAULT_REFRESH_S = 5.0


@dataclass(frozen=True, slots=True)
class DnsName:
    """``dns://NAME:PORT[?refresh_s=S]``: the replicas are ``http://ADDRESS:PORT`` for every address."""

    host: str
    port: int
    scheme: str = "http"
    refresh_s: float = DEFAULT_REFRESH_S

    @classmethod
    def parse(cls, url: str) -> DnsName:
        parts = urlsplit(url)
        scheme = SCHEMES.get(parts.scheme)
        if scheme is None:
            raise ValueError(f"a discovery URL starts with dns://, dns+http:// or dns+https://, got {url!r}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            raise ValueError(
                f"a discovery URL is dns://NAME:PORT (the port the replicas listen on), got {url!r}"
            )
        if parts.path not in ("", "/") or parts.fragment or parts.username:
            raise ValueError(f"a discovery URL has only a name, a port and ?refresh_s=S, got {url!r}")
        refresh_s = DEFAULT_REFRESH_S
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key != "refresh_s":
                raise ValueError(f"unknown option {key!r} in {url!r} (the only one is refresh_s)")
            try:
                refresh_s = float(value)
            except ValueError:
                refresh_s = -1.0
            if not refresh_s > 0:
                raise ValueError(f"refresh_s must be a number of seconds > 0, got {value!r} in {url!r}")
        return cls(parts.hostname, port, scheme, refresh_s)

    def urls(self, infos: Sequence[tuple]) -> list[str]:
        """Replica URLs of ``getaddrinfo`` answers: one per distinct address, sorted."""
        hosts = {str(info[4][0]) for info in infos}
        return sorted(f"{self.scheme}://{f'[{h}]' if ':' in h else h}:{self.port}" for h in hosts)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def dns_name(urls: Sequence[str]) -> DnsName | None:
    """The name to discover replicas from, if ``urls`` is one discovery URL; None for plain URLs."""
    discovery = [u for u in urls if urlsplit(u).scheme in SCHEMES]
    if not discovery:
        return None
    if len(urls) > 1:
        raise ValueError(f"a dns:// URL stands for every replica: give it alone, got {list(urls)!r}")
    return DnsName.parse(discovery[0])


def resolve(name: DnsName) -> list[str]:
    """The replica URLs ``name`` resolves to now (blocking); ValueError if it has no address."""
    try:
        infos = socket.getaddrinfo(name.host, name.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"no tool-server replica found: {name.host} does not resolve ({exc})") from exc
    return name.urls(infos)


class Discovery:
    """Keeps a client's replica list equal to what a name resolves to (see the module docstring).

    ``replicas`` is the client's own list, shared with its router and health monitor, and
    changed in place; ``on_added`` runs when a lookup brought a new replica.
    """

    def __init__(
        self, name: DnsName, replicas: list[Replica], router: Router, on_added: Callable[[], None]
    ) -> None:
        self.name = name
        self.lookups = 0
        self.failed_lookups = 0
        self._replicas = replicas
        self._router = router
        self._on_added = on_added
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def refresh(self) -> None:
        """Look the name up once and apply the answer; a failed lookup keeps the replicas."""
        self.lookups += 1
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                self.name.host, self.name.port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            self.failed_lookups += 1
            log.warning(
                "looking up %s failed (%s): keeping the %d replicas known",
                self.name,
                exc,
                len(self._replicas),
            )
            self._drop_drained()
            return
        self.apply(self.name.urls(infos))

    def apply(self, urls: Sequence[str]) -> None:
        """Make the replica set follow one lookup's answer: add, drain, bring back, drop."""
        known = {r.url: r for r in self._replicas}
        added = False
        for url in urls:
            replica = known.get(url)
            if replica is None:
                self._replicas.append(Replica(url))
                added = True
                log.info("replica %s found in DNS (%s)", url, self.name)
            elif replica.draining:
                replica.draining = False
                log.info("replica %s is back in DNS (%s): serving again", url, self.name)
        listed = set(urls)
        for replica in self._replicas:
            if replica.url not in listed and not replica.draining:
                replica.draining = True
                log.info("replica %s left DNS (%s): draining", replica.url, self.name)
        self._drop_drained()
        if added:
            self._on_added()

    def _drop_drained(self) -> None:
        """Drop draining replicas that are down, or have no session and nothing in flight."""
        for replica in [r for r in self._replicas if r.draining]:
            if replica.healthy and (replica.load or self._router.sessions_on(replica)):
                continue
            self._replicas.remove(replica)
            replica.gone = True
            if replica.probing is not None:
                replica.probing.cancel()
            log.info("replica %s dropped (%s)", replica.url, "down" if not replica.healthy else "drained")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.name.refresh_s)
            try:
                await self.refresh()
            except Exception as exc:  # a bug must not stop discovery for the client's lifetime
                log.error("replica discovery for %s failed", self.name, exc_info=exc)
