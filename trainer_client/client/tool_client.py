"""Async HTTP client for the tool server's batch API: coalescing, retries, replicas.

Why it looks like this: a trainer runs hundreds or thousands of trajectories at
once, and each makes a few tool calls per turn. One HTTP request per call would
cost more client and server CPU than most tools do, so calls that arrive within
``batch_window_ms`` of each other (from any trajectory) go out together in one
``POST /v1/calls``; each caller still awaits only its own result. Calls that carry
a session stick to one replica (the session's state lives there; when that replica
goes away or restarts, the session's calls end ``unknown_session``, see ``routing``); stateless
calls go to the least-loaded healthy replica. ``dns://NAME:PORT`` finds the replicas in
DNS (``discovery``).

Delivery guarantee. A call is only ever re-sent with its own ``call_id``, and a
server answers a ``call_id`` it has seen from its idempotency store (or joins the
running call), so within one replica process a call runs at most once. That store
lives in one process: it is not shared by replicas and does not survive a restart.
So what happens after a failed attempt depends on whether it may have reached a server:

* **Not delivered** -- the connection was refused or never established, HTTP 429, a
  503 with ``Retry-After``, an ``overloaded`` result: nothing ran. The call is re-sent,
  to any replica, until its deadline.
* **Maybe delivered** -- the connection broke after the request was sent (the replica
  died mid-call), a 5xx without ``Retry-After`` (e.g. a proxy's 502/504: its backend may
  have died), no answer within ``request_timeout_s``. A tool that declares itself
  idempotent (``_meta.toolfactory.idempotent`` in ``GET /v1/tools``, else the MCP hints
  ``idempotentHint`` / ``readOnlyHint``; learned once per replica) is re-sent to any
  replica and may run more than once. Any other tool, or one not known, is re-sent
  only after a timeout (the connection was intact, so the process is up) and only to
  the same replica, which joins the running call. After a broken connection, or once
  that replica refuses connections, the call ends ``outcome_unknown``: it ran at most
  once, maybe not at all, and is never run again elsewhere or on a restarted replica.

So a non-idempotent call runs at most once, and exactly once when it succeeds. (One
gap: a replica restarted on the same address within ``backoff_s`` of a timed-out
attempt would be taken for the old process.)

Retries spend the call's deadline, not a count: transport failures back off
exponentially with jitter, capped at ``max_backoff_s`` (a replica coming back up ends
the wait). A replica that answers 429 is held back: nothing goes to it until its
``Retry-After`` has passed, then only as many calls as it had taken when it refused
(a window that grows while it keeps up), so a saturated server gets a stream it can
admit, not a retry storm.

Only ``protocol`` and HTTP connect this module to the server.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson

from protocol import (
    Call,
    Result,
    VerifyRequest,
    VerifyResult,
    encode,
    new_call_id,
    new_session_id,
)
from trainer_client.client.discovery import Discovery, dns_name, resolve
from trainer_client.client.dispatch import Dispatcher
from trainer_client.client.health import HealthMonitor
from trainer_client.client.idempotency import IdempotencyCatalog
from trainer_client.client.leases import SessionLeases
from trainer_client.client.policies import BatchPolicy, HealthPolicy, RetryPolicy, policies_from_keywords
from trainer_client.client.records import (
    CALLS,
    VERIFY,
    Metrics,
    Replica,
    error_message,
    retry_after,
)
from trainer_client.client.routing import INSTANCE_HEADER, Router, SessionLost
from trainer_client.client.transport import HttpxTransport, Pool, Transport, env_proxy

log = logging.getLogger("trainer_client.client")  # one logger for the client

TOKEN_ENV = "TOOLFACTORY_TOKEN"  # read when no token is passed explicitly
KEEPALIVE_CONNECTIONS = 32  # idle connections httpx keeps for the plain requests (all replicas together)
KEEPALIVE_S = 1.0  # how long an idle connection is kept (under the server's keep_alive_s, 5 s by default)
_REQUEST_RETRIES = 6  # plain requests (tool lists, sessions) when max_retries is None


class ToolServerError(RuntimeError):
    """A non-batched request (list tools, sessions) failed; the message says why and where."""


# --------------------------------------------------------------------------- client


class ToolClient:
    """Batched, retrying client for one or more tool-server replicas.

    Implements the rollout core's ``ToolInvoker`` protocol (``call_tools`` and
    ``release_session``, plus ``lease_session``: the sessions of live trajectories are
    renewed, so a slow policy never loses its world to the server's TTL). Use it as an
    async context manager, or call ``aclose()`` when done. All methods must run on one
    event loop.

    Delivery (details in the module docstring): a call is re-sent only under its own
    call_id, until its deadline. A call that never reached a server is re-sent anywhere;
    one that may have (the connection broke mid-call) is re-sent anywhere only if its
    tool declares itself idempotent. Otherwise it ends ``outcome_unknown``, having run
    at most once: the server's record of call_ids lives and dies with one replica
    process. A non-idempotent call that succeeds ran exactly once. After a 429 a replica
    gets nothing until its ``Retry-After`` has passed, then only what it had admitted.

    Args:
        urls: base URL of a server (``http://host:port``), a list of replicas, or
            ``dns://NAME:PORT``: every address NAME resolves to is a replica, looked up
            now and periodically (``discovery``).
        token: bearer token; defaults to the ``TOOLFACTORY_TOKEN`` environment variable.
        batch / retry / health: the tunables (``policies``: their defaults are
            documented there). The older flat keywords (``batch_window_ms=``, ``max_batch=``,
            ``timeout_s=``, ``max_retries=``, ``health_interval_s=``, ...) still work and
            override single fields of these.
        http: the HTTP client to send with (e.g. one on ``httpx.ASGITransport`` to run
            against an app in process); the caller closes it. Default: batches go out on
            keep-alive connections of our own (``transport.Pool``), other requests through
            an httpx client of our own (both through httpx if a proxy is set in the
            environment for a replica's URL).
        max_connections: most connections our batch pool opens (shared by all replicas).
        toolset: default toolset for ``list_tools``.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        token: str | None = None,
        batch: BatchPolicy | None = None,
        retry: RetryPolicy | None = None,
        health: HealthPolicy | None = None,
        http: httpx.AsyncClient | None = None,
        max_connections: int = 256,
        toolset: str | None = None,
        **keywords: Any,
    ) -> None:
        url_list = [urls] if isinstance(urls, str) else list(urls)
        dns = dns_name(url_list)
        if dns is not None:
            url_list = resolve(dns)
        if not url_list:
            raise ValueError("ToolClient needs at least one server URL")
        for url in url_list:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
        self.batch, self.retry, self.health = policies_from_keywords(batch, retry, health, keywords)
        self.replicas = [Replica(url.rstrip("/")) for url in url_list]
        self.toolset = toolset
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._auth = {k: v for k, v in self._headers.items() if k == "authorization"}
        self._owns_http = http is None  # an injected client belongs to the caller, who closes it
        # For the plain requests only (tool lists, sessions, probes, leases): httpcore re-checks
        # every pooled connection whenever a request starts or ends, so few are kept, not for long.
        keep = min(max_connections, KEEPALIVE_CONNECTIONS)
        self._http = http or httpx.AsyncClient(
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=keep, keepalive_expiry=KEEPALIVE_S
            ),
            timeout=httpx.Timeout(self.retry.timeout_s, pool=None),
        )
        # The batches: our own pool, unless the caller chose the HTTP client or a proxy is set.
        self._transport: Transport = (
            HttpxTransport(self._http)
            if http is not None or any(env_proxy(r.url) for r in self.replicas)
            else Pool(max_connections=max_connections, max_idle=max_connections, keepalive_s=KEEPALIVE_S)
        )
        self._metrics = Metrics()
        self._router = Router(self.replicas, self._metrics)
        self._health = HealthMonitor(
            self.replicas,
            self._http,
            self._auth,
            self.health,
            self.retry,
            self._metrics,
            self._wake,
            self._router.seen,
        )
        self._catalog = IdempotencyCatalog(self._http, self._auth, self.health.timeout_s)
        self.discovery = Discovery(dns, self.replicas, self._router, self._wake) if dns else None
        self._leases = SessionLeases(self._http, self._headers, self._router, self._metrics)
        self._dispatch = Dispatcher(
            self._transport,
            self._headers,
            self.replicas,
            self.batch,
            self.retry,
            max_connections,
            self._router,
            self._health,
            self._catalog,
            self._metrics,
        )
        self._closed = False
        self._started = False

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` has run: the client takes no more calls."""
        return self._closed

    # ----------------------------------------------------------------- public API

    async def __aenter__(self) -> ToolClient:
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def call_tools(self, calls: Sequence[Call], *, timeout_s: float | None = None) -> list[Result]:
        """Run calls (from any number of concurrent callers); results come back in order.

        Never raises for a failed call: transport failures that outlast the retries
        and missed deadlines come back as error results (``unavailable``, ``timeout``, …).
        """
        for call in calls:
            if not isinstance(call, Call):
                raise TypeError(f"call_tools takes protocol.Call records, got {type(call).__name__}")
        self._metrics.calls += len(calls)
        if not calls:
            return []
        if self._closed or not self._started:
            self._start()
        if len(calls) > 1:
            return await self._dispatch.run(CALLS, calls, [c.session for c in calls], timeout_s)
        item = self._dispatch.submit_one(CALLS, calls[0], calls[0].session, timeout_s)  # most callers
        try:
            return [await item.future]
        except asyncio.CancelledError:
            self._dispatch.abandon(item)
            raise

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout_s: float | None = None,
    ) -> Result:
        """One call with a fresh call_id (convenience around ``call_tools``)."""
        (result,) = await self.call_tools(
            [Call(new_call_id(), name, arguments or {}, session)], timeout_s=timeout_s
        )
        return result

    async def verify(
        self, requests: Sequence[VerifyRequest], *, timeout_s: float | None = None
    ) -> list[VerifyResult]:
        """Score trajectories with the server's verifiers, batched like calls."""
        self._metrics.verify_requests += len(requests)
        if requests:
            self._start()
        return await self._dispatch.run(VERIFY, requests, [r.session for r in requests], timeout_s)

    async def list_tools(self, toolset: str | None = None) -> list[dict[str, Any]]:
        """MCP tool descriptors the server offers (optionally one toolset)."""
        toolset = toolset if toolset is not None else self.toolset
        params = {"toolset": toolset} if toolset else None
        response = await self._request("GET", "/v1/tools", params=params)
        return list(orjson.loads(response.content).get("tools", []))

    async def create_session(
        self, session: str | None = None, *, environment: Mapping[str, str] | None = None
    ) -> str:
        """Open a session explicitly and pin it to its replica.

        Optional: a session is also created on first use of any new id. The id (chosen
        here unless given) hashes to the same replica in every client process.
        ``environment`` = ``{"pack", "task"}`` binds the session to an environment task:
        its world starts from that task's state (before its first call).
        """
        session = session or new_session_id()
        try:
            replica = self._router.home(session)
        except SessionLost as lost:
            raise ToolServerError(str(lost)) from None
        body: dict[str, Any] = {"session": session}
        if environment is not None:
            body["environment"] = dict(environment)
        response = await self._request("POST", "/v1/sessions", replica=replica, content=encode(body))
        session = str(orjson.loads(response.content).get("session") or session)
        self._router.pin(session, replica)
        return session

    def lease_session(self, session_id: str) -> None:
        """Keep a session open on the server until ``release_session`` (or ``aclose``).

        The server closes a session idle for its ``sessions.ttl_s``; a leased one is renewed
        every third of that TTL (one request per replica for all leased sessions, ``leases``),
        so a trajectory keeps its world however long its policy takes to generate. The rollout
        core leases the session of every trajectory it runs. A session is renewed once a
        replica has answered for it (before that it holds no state).
        """
        self._start()
        self._leases.hold(session_id)

    async def release_session(self, session_id: str) -> None:
        """Free a trajectory's server-side state and end its lease. Failures are logged, not raised.

        A session the server does not know (never used, already expired) is fine;
        an unreachable server expires the session after its TTL anyway.
        """
        self._leases.drop(session_id)
        replica = self._router.forget(session_id)
        if replica is None:
            return  # its replica is gone, and its state with it
        try:
            await self._request("DELETE", f"/v1/sessions/{session_id}", replica=replica, ok=(404,))
        except ToolServerError as exc:
            self._metrics.error("release_session")
            log.warning("could not release session %s: %s", session_id, exc)

    async def check_health(self) -> dict[str, bool]:
        """Probe every replica's ``/healthz`` now; returns url -> healthy."""
        await asyncio.gather(*(self._health.probe(r) for r in self.replicas))
        return {r.url: r.healthy for r in self.replicas}

    def metrics(self) -> dict[str, Any]:
        """Client-side counters: calls, batches, batch sizes, retries, errors, latency."""
        return self._metrics.snapshot(self.replicas)

    def session_replica(self, session_id: str) -> str | None:
        """The replica URL a session is pinned to (None before its first call)."""
        replica = self._router.pinned(session_id)
        return replica.url if replica else None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._leases.aclose()
        await self._health.aclose()
        if self.discovery is not None:
            await self.discovery.aclose()
        await self._dispatch.aclose()
        await self._transport.aclose()
        if self._owns_http:
            await self._http.aclose()

    def _wake(self) -> None:
        """A replica came back: calls waiting out a connection failure go now."""
        self._dispatch.wake()

    def _start(self) -> None:
        if self._closed:
            raise RuntimeError("ToolClient is closed")
        self._health.start()
        if self.discovery is not None:
            self.discovery.start()
        self._started = True

    # ----------------------------------------------------------------- plain requests

    async def _request(
        self,
        method: str,
        path: str,
        *,
        replica: Replica | None = None,
        params: dict[str, str] | None = None,
        content: bytes | None = None,
        ok: tuple[int, ...] = (),
    ) -> httpx.Response:
        """One non-batched request with retries on connect errors, 429 and 5xx."""
        self._start()
        last = "no attempt made"
        retries = _REQUEST_RETRIES if self.retry.max_retries is None else self.retry.max_retries
        for attempt in range(retries + 1):
            target = replica or self._router.least_loaded()
            try:
                response = await self._http.request(
                    method, target.url + path, params=params, content=content, headers=self._headers
                )
            except httpx.TransportError as exc:
                self._metrics.error("connect" if isinstance(exc, httpx.ConnectError) else "transport")
                if isinstance(exc, httpx.ConnectError):
                    self._health.mark_down(target, f"connect failed: {exc}")
                last = f"{method} {target.url}{path} failed: {exc!r}"
            else:
                if response.status_code < 400 or response.status_code in ok:
                    self._router.seen(target, response.headers.get(INSTANCE_HEADER))
                    self._health.mark_up(target)
                    return response
                last = (
                    f"{method} {target.url}{path} answered {response.status_code}: {error_message(response)}"
                )
                if response.status_code != 429 and response.status_code < 500:
                    raise ToolServerError(last)
                self._metrics.error(f"http_{response.status_code}")
                if response.status_code == 429:
                    await asyncio.sleep(retry_after(response.headers.get("retry-after")))
                    continue
            await asyncio.sleep(self.retry.backoff(attempt + 1))
        raise ToolServerError(f"{last} (gave up after {retries + 1} tries)")
