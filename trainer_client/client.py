"""Async HTTP client for the tool server's batch API: coalescing, retries, replicas.

Why it looks like this: a trainer runs hundreds or thousands of trajectories at
once, and each makes a few tool calls per turn. One HTTP request per call would
cost more client and server CPU than most tools do, so calls that arrive within
``batch_window_ms`` of each other (from any trajectory) go out together in one
``POST /v1/calls``; each caller still awaits only its own result. Calls that carry
a session stick to one replica (the session's state lives there); stateless calls
go to the least-loaded healthy replica.

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
import hashlib
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import orjson

from protocol import (
    META_KEY,
    Call,
    ErrorInfo,
    ErrorKind,
    Result,
    VerifyRequest,
    VerifyResult,
    decode_results,
    decode_verify_results,
    encode,
    new_call_id,
    new_session_id,
)

log = logging.getLogger(__name__)

TOKEN_ENV = "TOOLFACTORY_TOKEN"  # read when no token is passed explicitly
_LATENCY_SAMPLES = 100_000  # bounded window for latency percentiles
_REQUEST_RETRIES = 6  # plain requests (tool lists, sessions) when max_retries is None
_WINDOW_GROWTH = 1 / 8  # per answered call while a window is full: ~1/8 per round trip


class ToolServerError(RuntimeError):
    """A non-batched request (list tools, sessions) failed; the message says why and where."""


# --------------------------------------------------------------------------- endpoints


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """One batched endpoint: where it lives, how its body and answers look, how to fail an item."""

    name: str
    path: str
    key: str
    decode: Callable[[bytes], list[Any]]
    failure: Callable[[Any, ErrorKind, str], Any]
    overloaded: Callable[[Any], bool]


def _call_failure(call: Call, kind: ErrorKind, message: str) -> Result:
    return Result.failure(call.call_id, kind, message)


def _verify_failure(request: VerifyRequest, kind: ErrorKind, message: str) -> VerifyResult:
    return VerifyResult(
        score=0.0, request_id=request.request_id, is_error=True, error=ErrorInfo(kind, message)
    )


def _is_overloaded(result: Result | VerifyResult) -> bool:
    return bool(result.is_error and result.error and result.error.kind == ErrorKind.OVERLOADED)


_CALLS = _Endpoint("calls", "/v1/calls", "calls", decode_results, _call_failure, _is_overloaded)
_VERIFY = _Endpoint(
    "verify", "/v1/verify", "requests", decode_verify_results, _verify_failure, _is_overloaded
)


# --------------------------------------------------------------------------- state records


@dataclass(slots=True, eq=False)
class _Replica:
    url: str
    healthy: bool = True
    load: int = 0  # calls routed here and not yet answered
    batches: int = 0
    calls: int = 0
    failures: int = 0
    probing: asyncio.Task[None] | None = None
    batchers: list[_Batcher] = field(default_factory=list)
    described: asyncio.Task[None] | None = None  # its GET /v1/tools: which tools are idempotent
    # Admission control, learned from 429s (ToolClient._refused).
    outstanding: int = 0  # calls in POSTs sent here and not answered yet
    window: float | None = None  # most calls outstanding at once; None until a 429
    hold_until: float = 0.0  # monotonic time before which nothing is sent here
    refusals: int = 0  # 429s in a row: paces the hold when Retry-After is 0


@dataclass(slots=True, eq=False)
class _Pending:
    """One call (or verify request) between submission and its result."""

    payload: Any
    endpoint: _Endpoint
    future: asyncio.Future[Any]
    session: str | None
    deadline: float
    started: float
    attempts: int = 0  # failed attempts other than overload (count against max_retries)
    overloaded: int = 0  # 429 / overloaded answers
    replica: _Replica | None = None
    pinned: _Replica | None = None  # may be running there (not idempotent): re-sent only there
    error: tuple[ErrorKind, str] | None = None  # why it waits for a re-send (None once sent)


@dataclass(slots=True)
class _Metrics:
    calls: int = 0
    call_batches: int = 0
    calls_sent: int = 0  # calls carried by batch POSTs (a retried call counts again)
    max_batch: int = 0
    verify_requests: int = 0
    verify_batches: int = 0
    retries: int = 0
    splits: int = 0
    session_moves: int = 0
    replica_down: int = 0
    replica_up: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    result_errors: dict[str, int] = field(default_factory=dict)
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=_LATENCY_SAMPLES))

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def _percentiles(samples: Sequence[float]) -> dict[str, float]:
    if not samples:
        return {"count": 0}
    ordered = sorted(samples)
    n = len(ordered)

    def at(q: float) -> float:
        return round(ordered[min(n - 1, int(q * n))], 3)

    return {
        "count": n,
        "mean": round(sum(ordered) / n, 3),
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": round(ordered[-1], 3),
    }


# --------------------------------------------------------------------------- batcher


class _Batcher:
    """Coalesces items for one (replica, endpoint) pair into POSTs.

    While a POST of this pair is in flight, the first item of a new batch arms a
    ``batch_window`` timer and the batch goes out when it fires or reaches
    ``max_batch``; when the pair is idle the batch goes out on the next event-loop
    pass (so a lone call pays no window, and calls made together still share a POST).
    At most ``max_inflight_batches`` POSTs are outstanding per pair: beyond that,
    new items keep accumulating, so batches grow under load on their own.

    Sends also obey the replica's admission control: nothing goes out while it is held
    back after a 429, and once it has a window, only what fits (``window - outstanding``
    calls); an answer from the replica frees room and flushes its batchers again.
    """

    def __init__(self, client: ToolClient, replica: _Replica, endpoint: _Endpoint) -> None:
        self._client = client
        self._replica = replica
        self._endpoint = endpoint
        self._items: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        replica.batchers.append(self)

    @property
    def waiting(self) -> bool:
        return bool(self._items)

    def add(self, item: _Pending) -> None:
        self._items.append(item)
        if len(self._items) >= self._client.max_batch:
            self._flush()
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            if self._inflight == 0:
                # Idle: send on the next loop pass (calls made in this pass still join),
                # so a lone call pays no window. Under load, wait for company.
                self._timer = loop.call_later(0, self._flush)
            else:
                self._timer = loop.call_later(self._client.batch_window_s, self._flush)

    def add_front(self, items: list[_Pending]) -> None:
        """Put refused items back at the head of the line: they are older than the rest."""
        self._items[0:0] = items
        self.resume()

    def resume(self) -> None:
        """Room may have opened: items that already waited go out without a second window."""
        if self._items and self._timer is None:
            self._flush()

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        client, replica = self._client, self._replica
        held = replica.hold_until - time.monotonic()
        if held > 0:
            if self._items:
                self._timer = asyncio.get_running_loop().call_later(held, self._flush)
            return
        while self._items and self._inflight < client.max_inflight_batches:
            room = client.max_batch if replica.window is None else int(replica.window) - replica.outstanding
            if room <= 0:
                return  # a POST to this replica is out: its answer frees room and flushes again
            batch = self._take(min(room, client.max_batch))
            if batch:
                self.launch(batch)

    def _take(self, count: int) -> list[_Pending]:
        """The next ``count`` items, less those already settled (deadline, close)."""
        batch, self._items = self._items[:count], self._items[count:]
        live = []
        for item in batch:
            if not item.future.done():
                item.error = None  # on its way again
                live.append(item)
        return live

    def launch(self, batch: list[_Pending]) -> None:
        """Send a batch now; it counts against the replica's window until answered."""
        self._inflight += 1
        self._replica.outstanding += len(batch)
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        try:
            await self._client._post_batch(self._replica, self._endpoint, batch)
        finally:
            self._inflight -= 1
            self._replica.outstanding -= len(batch)
            for batcher in self._replica.batchers:
                batcher.resume()

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


# --------------------------------------------------------------------------- client


class ToolClient:
    """Batched, retrying client for one or more tool-server replicas.

    Implements the rollout core's ``ToolInvoker`` protocol (``call_tools`` and
    ``release_session``). Use it as an async context manager, or call
    ``aclose()`` when done. All methods must run on one event loop.

    Delivery (details in the module docstring): a call is re-sent only under its own
    call_id, until its deadline. A call that never reached a server is re-sent anywhere;
    one that may have (the connection broke mid-call) is re-sent anywhere only if its
    tool declares itself idempotent. Otherwise it ends ``outcome_unknown``, having run
    at most once: the server's record of call_ids lives and dies with one replica
    process. A non-idempotent call that succeeds ran exactly once. After a 429 a replica
    gets nothing until its ``Retry-After`` has passed, then only what it had admitted.

    Args:
        urls: base URL of a server (``http://host:port``) or a list of replicas.
        token: bearer token; defaults to the ``TOOLFACTORY_TOKEN`` environment variable.
        batch_window_ms: while a POST is already in flight, how long the first call of the
            next batch waits for company (an idle client sends on the next loop pass).
        max_batch: most calls in one POST.
        max_inflight_batches: most concurrent POSTs per replica and endpoint.
        timeout_s: default per-call deadline (submission to result): the budget that all
            retries spend.
        request_timeout_s: limit for one POST attempt; ``None`` = the batch's remaining deadline.
        max_retries: optional cap on re-sends after connect errors, timeouts and 5xx answers
            (``None``: retries run until the deadline). Overload answers never count. Plain
            requests (``list_tools``, sessions) make at most this many (default 6) retries.
        backoff_s / max_backoff_s: exponential backoff with jitter between attempts, capped.
        health_interval_s: period of the ``/healthz`` probes (``0`` = only after failures).
        max_connections: HTTP connection pool size (shared by all replicas).
        split_after_ms / split_max: a batch of at most ``split_max`` calls still unanswered
            after ``split_after_ms`` gets one extra POST per pending call (same call_id, so
            the server joins the running call): a slow call then no longer delays the fast
            calls that shared its batch. ``0`` disables it.
        toolset: default toolset for ``list_tools``.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        token: str | None = None,
        batch_window_ms: float = 2.0,
        max_batch: int = 256,
        max_inflight_batches: int = 256,
        timeout_s: float = 120.0,
        request_timeout_s: float | None = None,
        max_retries: int | None = None,
        backoff_s: float = 0.05,
        max_backoff_s: float = 5.0,
        health_interval_s: float = 5.0,
        health_timeout_s: float = 2.0,
        max_connections: int = 256,
        split_after_ms: float = 50.0,
        split_max: int = 64,
        toolset: str | None = None,
    ) -> None:
        url_list = [urls] if isinstance(urls, str) else list(urls)
        if not url_list:
            raise ValueError("ToolClient needs at least one server URL")
        for url in url_list:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
        if max_batch < 1 or max_inflight_batches < 1:
            raise ValueError("max_batch and max_inflight_batches must be at least 1")
        if batch_window_ms < 0 or timeout_s <= 0:
            raise ValueError("batch_window_ms must be >= 0 and timeout_s > 0")
        self.replicas = [_Replica(url.rstrip("/")) for url in url_list]
        self.batch_window_s = batch_window_ms / 1000.0
        self.max_batch = max_batch
        self.max_inflight_batches = max_inflight_batches
        self.timeout_s = timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.split_after_s = split_after_ms / 1000.0
        self.split_max = split_max
        self.toolset = toolset
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            headers={k: v for k, v in self._headers.items() if k == "authorization"},
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(timeout_s, pool=None),
        )
        self._batchers: dict[tuple[int, str], _Batcher] = {}
        self._sessions: dict[str, _Replica] = {}
        self._metrics = _Metrics()
        self._health_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending: set[_Pending] = set()  # submitted, not settled: failed on aclose()
        self._backing_off: dict[_Pending, tuple[asyncio.TimerHandle, _Replica | None]] = {}
        self._idempotent: dict[str, bool] = {}  # tool -> declared idempotent (by every replica)
        # Split POSTs each hold a connection for as long as their call runs; past a quarter of
        # the pool they would queue for connections (httpcore's queue is quadratic) and slow
        # every batch down, so beyond that a slow batch simply stays whole.
        self._joins = 0
        self._max_joins = max(1, max_connections // 4)
        self._closed = False

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
        return await self._run(_CALLS, calls, [c.session for c in calls], timeout_s)

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
        return await self._run(_VERIFY, requests, [r.session for r in requests], timeout_s)

    async def list_tools(self, toolset: str | None = None) -> list[dict[str, Any]]:
        """MCP tool descriptors the server offers (optionally one toolset)."""
        toolset = toolset if toolset is not None else self.toolset
        params = {"toolset": toolset} if toolset else None
        response = await self._request("GET", "/v1/tools", params=params)
        return list(orjson.loads(response.content).get("tools", []))

    async def create_session(self) -> str:
        """Open a session explicitly and pin it to its replica.

        Optional: a session is also created on first use of any new id. The id is
        chosen here so that it hashes to the same replica in every client process.
        """
        session = new_session_id()
        replica = self._hash_replica(session)
        response = await self._request(
            "POST", "/v1/sessions", replica=replica, content=encode({"session": session})
        )
        session = str(orjson.loads(response.content).get("session") or session)
        self._sessions[session] = replica
        return session

    async def release_session(self, session_id: str) -> None:
        """Free a trajectory's server-side state. Failures are logged, not raised.

        A session the server does not know (never used, already expired) is fine;
        an unreachable server expires the session after its TTL anyway.
        """
        replica = self._sessions.pop(session_id, None) or self._hash_replica(session_id)
        try:
            await self._request("DELETE", f"/v1/sessions/{session_id}", replica=replica, ok=(404,))
        except ToolServerError as exc:
            self._metrics.error("release_session")
            log.warning("could not release session %s: %s", session_id, exc)

    async def check_health(self) -> dict[str, bool]:
        """Probe every replica's ``/healthz`` now; returns url -> healthy."""
        await asyncio.gather(*(self._probe(r) for r in self.replicas))
        return {r.url: r.healthy for r in self.replicas}

    def metrics(self) -> dict[str, Any]:
        """Client-side counters: calls, batches, batch sizes, retries, errors, latency."""
        m = self._metrics
        return {
            "calls": m.calls,
            "batches": m.call_batches,
            "mean_batch_size": round(m.calls_sent / m.call_batches, 2) if m.call_batches else 0.0,
            "max_batch_size": m.max_batch,
            "verify_requests": m.verify_requests,
            "verify_batches": m.verify_batches,
            "calls_sent": m.calls_sent,
            "retries": m.retries,
            "split_posts": m.splits,
            "errors": dict(m.errors),
            "result_errors": dict(m.result_errors),
            "latency_ms": _percentiles(m.latencies_ms),
            "session_moves": m.session_moves,
            "replica_down_events": m.replica_down,
            "replica_up_events": m.replica_up,
            "replicas": [
                {
                    "url": r.url,
                    "healthy": r.healthy,
                    "load": r.load,
                    "batches": r.batches,
                    "calls": r.calls,
                    "window": None if r.window is None else int(r.window),
                }
                for r in self.replicas
            ],
        }

    def session_replica(self, session_id: str) -> str | None:
        """The replica URL a session is pinned to (None before its first call)."""
        replica = self._sessions.get(session_id)
        return replica.url if replica else None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        for replica in self.replicas:
            if replica.probing is not None:
                replica.probing.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for handle, _ in self._backing_off.values():
            handle.cancel()
        self._backing_off.clear()
        for item in list(self._pending):
            self._finish(
                item, item.endpoint.failure(item.payload, ErrorKind.CANCELLED, "the client was closed")
            )
        await asyncio.gather(*(b.aclose() for b in self._batchers.values()), return_exceptions=True)
        await self._http.aclose()

    # ----------------------------------------------------------------- submission

    def _start(self) -> None:
        if self._closed:
            raise RuntimeError("ToolClient is closed")
        if self._health_task is None and self.health_interval_s > 0:
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def _run(
        self,
        endpoint: _Endpoint,
        payloads: Sequence[Any],
        sessions: Sequence[str | None],
        timeout_s: float | None,
    ) -> list[Any]:
        if not payloads:
            return []
        self._start()
        loop = asyncio.get_running_loop()
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        now = time.monotonic()
        items = [
            _Pending(payload, endpoint, loop.create_future(), session, now + timeout, now)
            for payload, session in zip(payloads, sessions, strict=True)
        ]
        self._pending.update(items)
        for item in items:
            self._submit(item)
        # One timer settles whatever is left at the deadline (cheaper than asyncio.wait).
        expiry = loop.call_later(timeout, self._expire, items, timeout)
        try:
            if len(items) == 1:
                await items[0].future
            else:
                await asyncio.gather(*(item.future for item in items))
        except asyncio.CancelledError:  # the caller gave up: its calls stop counting as load
            for item in items:
                item.future.cancel()
                self._unload(item)
                self._pending.discard(item)
            raise
        finally:
            expiry.cancel()
        return [item.future.result() for item in items]

    def _expire(self, items: list[_Pending], timeout: float) -> None:
        for item in items:
            if not item.future.done():
                self._metrics.error("deadline")
                # Waiting for a re-send: say why (overloaded, unavailable); else it was out.
                kind, why = item.error or (ErrorKind.TIMEOUT, "no result")
                self._finish(
                    item,
                    item.endpoint.failure(
                        item.payload,
                        kind,
                        f"{why} (client deadline of {timeout:g} s reached; "
                        f"{item.attempts + item.overloaded} retries)",
                    ),
                )

    def _submit(self, item: _Pending, prefer: _Replica | None = None) -> None:
        if item.future.done() or self._closed:
            return
        self._place(item, prefer).add(item)

    def _place(self, item: _Pending, prefer: _Replica | None) -> _Batcher:
        """Route an item to a replica and count it there; returns the batcher it joins."""
        replica = self._route(item, prefer)
        item.replica = replica
        replica.load += 1
        return self._batcher(replica, item.endpoint)

    # ----------------------------------------------------------------- routing

    def _route(self, item: _Pending, prefer: _Replica | None) -> _Replica:
        if item.pinned is not None:
            return item.pinned  # it may be running there: only that process can answer for it
        session = item.session
        if session is not None:
            pinned = self._sessions.get(session)
            if pinned is not None and (pinned.healthy or not self._any_healthy()):
                return pinned
            replica = self._hash_replica(session)
            if pinned is not None and replica is not pinned:
                self._metrics.session_moves += 1  # its state stayed behind on a dead replica
                log.warning("session %s moved from %s to %s", session, pinned.url, replica.url)
            self._sessions[session] = replica
            return replica
        if prefer is not None and prefer.healthy:
            return prefer  # a retry stays put, so the server's idempotency store sees it
        return self._least_loaded()

    def _any_healthy(self) -> bool:
        return any(r.healthy for r in self.replicas)

    def _candidates(self) -> list[_Replica]:
        healthy = [r for r in self.replicas if r.healthy]
        return healthy or self.replicas  # all marked down: try anyway, a success marks it up

    def _least_loaded(self) -> _Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        return min(self._candidates(), key=lambda r: r.load)

    def _hash_replica(self, session: str) -> _Replica:
        """Rendezvous hashing: every client process maps a session to the same replica."""

        def weight(replica: _Replica) -> bytes:
            return hashlib.blake2b(f"{replica.url}|{session}".encode(), digest_size=8).digest()

        return max(self._candidates(), key=weight)

    # ----------------------------------------------------------------- sending

    def _attempt_timeout(self, items: list[_Pending]) -> float:
        remaining = max(item.deadline for item in items) - time.monotonic()
        if self.request_timeout_s is not None:
            return max(0.001, min(self.request_timeout_s, remaining + 1.0))
        return max(0.001, remaining + 1.0)  # +1 s: let the server's own timeout answer first

    async def _post_batch(self, replica: _Replica, endpoint: _Endpoint, items: list[_Pending]) -> None:
        """Send one batch and settle every item: resolve, retry, or fail. Never raises."""
        m = self._metrics
        replica.batches += 1
        if endpoint is _CALLS:
            m.call_batches += 1
            m.calls_sent += len(items)
            m.max_batch = max(m.max_batch, len(items))
            replica.calls += len(items)
        else:
            m.verify_batches += 1
        if replica.described is None:  # once per replica (process): which tools are idempotent
            replica.described = asyncio.get_running_loop().create_task(self._learn_tools(replica))
            self._background(replica.described)
        split = None
        if (
            endpoint is _CALLS
            and self.split_after_s > 0
            and 1 < len(items) <= self.split_max
            and not self._saturated(replica)
        ):
            split = asyncio.get_running_loop().call_later(self.split_after_s, self._split, replica, items)
        failure: Exception | None = None
        try:
            body = encode({endpoint.key: [item.payload for item in items]})
            response = await self._http.post(
                replica.url + endpoint.path,
                content=body,
                headers=self._headers,
                timeout=httpx.Timeout(self._attempt_timeout(items), pool=None),
            )
        except Exception as exc:  # classified below: a failure must never leave callers hanging
            failure = exc
        finally:
            if split is not None:
                split.cancel()
        if failure is not None:
            await self._attempt_failed(replica, items, failure)
        else:
            await self._settle(replica, endpoint, items, response)

    async def _attempt_failed(self, replica: _Replica, items: list[_Pending], exc: Exception) -> None:
        """A POST got no answer: did its request (possibly) reach the server?"""
        m = self._metrics
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            m.error("connect")  # no connection, so no request: nothing ran
            self._mark_down(replica, f"connect failed: {exc}")
            self._not_delivered(items, ErrorKind.UNAVAILABLE, f"cannot connect to {replica.url}: {exc}")
        elif isinstance(exc, httpx.TimeoutException):
            m.error("request_timeout")  # the connection is intact: the server is up, still working
            self._schedule_probe(replica)
            message = f"{replica.url} did not answer in time"
            await self._maybe_delivered(replica, items, ErrorKind.TIMEOUT, message, process_up=True)
        elif isinstance(exc, httpx.TransportError):
            m.error("transport")  # ReadError, RemoteProtocolError: the connection broke mid-call
            self._schedule_probe(replica)
            message = f"connection to {replica.url} broke with the calls in flight: {exc!r}"
            await self._maybe_delivered(replica, items, ErrorKind.UNAVAILABLE, message, process_up=False)
        else:  # a bug or an unexpected failure
            m.error("client")
            log.error("unexpected error sending a batch to %s", replica.url, exc_info=exc)
            self._fail_all(items, ErrorKind.UNAVAILABLE, f"client error: {exc!r}")

    def _saturated(self, replica: _Replica) -> bool:
        """Pushed back (it has a window) and calls queue for room: no extra POSTs."""
        return replica.window is not None and any(b.waiting for b in replica.batchers)

    def _split(self, replica: _Replica, items: list[_Pending]) -> None:
        """Head-of-line relief for a small batch that is still out after ``split_after_ms``.

        A batch is answered only when its slowest call ends, so one slow call would hold
        back the fast calls of other trajectories that happened to share its POST. Each
        call still pending gets a POST of its own with the same call_id: the server joins
        the running call (or answers from its result store), so nothing runs twice, and
        each caller gets its result as soon as its own call ends.
        """
        loop = asyncio.get_running_loop()
        for item in items:
            if not item.future.done() and self._joins < self._max_joins:
                self._joins += 1
                self._metrics.splits += 1
                self._background(loop.create_task(self._join(replica, item)))

    async def _join(self, replica: _Replica, item: _Pending) -> None:
        try:
            await self._join_once(replica, item)
        finally:
            self._joins -= 1

    async def _join_once(self, replica: _Replica, item: _Pending) -> None:
        try:
            response = await self._http.post(
                replica.url + _CALLS.path,
                content=encode({_CALLS.key: [item.payload]}),
                headers=self._headers,
                timeout=httpx.Timeout(max(0.001, item.deadline - time.monotonic()) + 1.0, pool=None),
            )
            if response.status_code != 200:
                return  # e.g. 429: the batch POST is still out and owns the retries
            (result,) = decode_results(response.content)
        except Exception:
            return
        if not _is_overloaded(result):
            self._finish(item, result)

    async def _settle(
        self, replica: _Replica, endpoint: _Endpoint, items: list[_Pending], response: httpx.Response
    ) -> None:
        m = self._metrics
        status = response.status_code
        if status == 200:
            self._mark_up(replica)
            self._accepted(replica, len(items))
            try:
                results = endpoint.decode(response.content)
            except Exception as exc:
                m.error("bad_response")
                self._fail_all(
                    items, ErrorKind.UNAVAILABLE, f"{replica.url} sent an unreadable answer: {exc}"
                )
                return
            if len(results) != len(items):
                m.error("bad_response")
                self._fail_all(
                    items,
                    ErrorKind.UNAVAILABLE,
                    f"{replica.url} returned {len(results)} results for {len(items)} requests",
                )
                return
            for item, result in zip(items, results, strict=True):
                if endpoint.overloaded(result):  # refused before it ran: re-send after a pause
                    m.error("overloaded")
                    item.overloaded += 1
                    delay = _retry_after(response.headers.get("retry-after"), default=0.0)
                    self._retry(item, ErrorKind.OVERLOADED, result.error.message, delay=delay)
                else:
                    self._finish(item, result)
            return
        message = _error_message(response)
        m.error(f"http_{status}")
        if status == 429 or (status == 503 and "retry-after" in response.headers):
            self._refused(replica, items, message, _retry_after(response.headers.get("retry-after")))
        elif status >= 500:
            self._schedule_probe(replica)
            message = f"{replica.url} answered {status}: {message}"
            await self._maybe_delivered(replica, items, ErrorKind.UNAVAILABLE, message, process_up=False)
        elif status == 413 and len(items) > 1:  # too big as one batch: split it and try again
            half = len(items) // 2
            batcher = self._batcher(replica, endpoint)
            for part in (items[:half], items[half:]):
                batcher.launch(part)
        elif status in (401, 403):
            self._fail_all(items, ErrorKind.UNAUTHORIZED, f"{replica.url} refused the token: {message}")
        else:
            kind = ErrorKind.TOO_LARGE if status == 413 else ErrorKind.BAD_REQUEST
            self._fail_all(items, kind, f"{replica.url} rejected the batch ({status}): {message}")

    def _batcher(self, replica: _Replica, endpoint: _Endpoint) -> _Batcher:
        key = (id(replica), endpoint.name)
        batcher = self._batchers.get(key)
        if batcher is None:
            batcher = self._batchers[key] = _Batcher(self, replica, endpoint)
        return batcher

    def _background(self, task: asyncio.Task[Any]) -> None:
        """Keep a reference to a fire-and-forget task so it is not garbage collected."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------------------------- admission control

    def _refused(self, replica: _Replica, items: list[_Pending], message: str, retry_after: float) -> None:
        """A 429 (or a 503 with Retry-After): the server took none of these calls.

        Hold the replica back until Retry-After has passed (jittered up to +20 %, so that
        clients do not come back in step; a backoff if it says 0), and from then on keep
        at most as many calls outstanding there as it had taken when it refused: it
        admits them as its queue drains, where a full-sized re-send would be refused
        again. The refused calls go back to the head of the line, on any replica.
        """
        replica.refusals += 1
        taken = replica.outstanding - len(items)
        replica.window = float(max(1, taken))  # nothing taken: start from one call and grow
        pause = retry_after if retry_after > 0 else self._backoff(replica.refusals)
        replica.hold_until = max(replica.hold_until, time.monotonic() + pause * random.uniform(1.0, 1.2))
        requeue: dict[_Batcher, list[_Pending]] = {}
        for item in items:
            self._unload(item)
            if item.future.done() or self._closed:
                continue
            item.overloaded += 1
            item.error = (ErrorKind.OVERLOADED, message)
            self._metrics.retries += 1
            requeue.setdefault(self._place(item, None), []).append(item)
        for batcher, group in requeue.items():
            batcher.add_front(group)

    def _accepted(self, replica: _Replica, answered: int) -> None:
        """A batch was answered: while its window is full, let it grow a little."""
        replica.refusals = 0
        window = replica.window
        if window is not None and time.monotonic() >= replica.hold_until and self._saturated(replica):
            replica.window = window + answered * _WINDOW_GROWTH

    # ----------------------------------------------------------------- settling

    def _unload(self, item: _Pending) -> None:
        if item.replica is not None:
            item.replica.load -= 1
            item.replica = None

    def _finish(self, item: _Pending, value: Any) -> None:
        self._unload(item)
        self._pending.discard(item)
        if item.future.done():
            return
        item.future.set_result(value)
        self._metrics.latencies_ms.append((time.monotonic() - item.started) * 1000.0)
        if value.is_error and value.error is not None:
            kind = value.error.kind.value
            self._metrics.result_errors[kind] = self._metrics.result_errors.get(kind, 0) + 1

    def _fail_all(self, items: list[_Pending], kind: ErrorKind, message: str) -> None:
        for item in items:
            self._finish(item, item.endpoint.failure(item.payload, kind, message))

    def _outcome_unknown(self, item: _Pending, message: str) -> None:
        self._finish(
            item,
            item.endpoint.failure(
                item.payload,
                ErrorKind.OUTCOME_UNKNOWN,
                f"{message}; the call may or may not have run, and its tool is not known to be "
                "idempotent, so it is not run again",
            ),
        )

    def _not_delivered(self, items: list[_Pending], kind: ErrorKind, message: str) -> None:
        """No request reached a server: re-send anywhere, unless a call may run where it was."""
        for item in items:
            if item.pinned is not None:  # its replica went away while the call may have run there
                self._outcome_unknown(item, message)
            else:
                self._retry(item, kind, message)

    async def _maybe_delivered(
        self, replica: _Replica, items: list[_Pending], kind: ErrorKind, message: str, *, process_up: bool
    ) -> None:
        """The request may have reached the server but no answer came: the calls may have run.

        Idempotent tools are re-sent (to the same replica first: its store may hold the
        result). Any other call may only go back to the same replica process: if that is
        known to be up (a timeout on an intact connection), it joins the running call
        there; if the connection broke, the process may be gone with its record of what
        ran, so the call ends ``outcome_unknown`` rather than risk running twice.
        """
        await self._learn_idempotency(items)
        for item in items:
            if self._is_idempotent(item):
                self._retry(item, kind, message, prefer=replica)
            elif process_up:
                item.pinned = replica
                self._retry(item, kind, message)
            else:
                self._outcome_unknown(item, message)

    def _retry(
        self,
        item: _Pending,
        kind: ErrorKind,
        message: str,
        *,
        prefer: _Replica | None = None,
        delay: float = 0.0,
    ) -> None:
        """Send the same payload (same call_id) again after a backoff, within its deadline."""
        self._unload(item)
        if item.future.done():
            return
        item.error = (kind, message)
        if kind != ErrorKind.OVERLOADED:
            item.attempts += 1
            if self.max_retries is not None and item.attempts > self.max_retries:
                self._give_up(item, f"gave up after {item.attempts} tries")
                return
        if item.pinned is not None:
            wait = self.backoff_s * random.uniform(0.5, 1.0)  # its replica is up: join the call soon
        else:
            wait = max(delay, self._backoff(item.attempts + item.overloaded))
        if time.monotonic() + wait >= item.deadline:
            self._give_up(item, "deadline reached")
            return
        self._metrics.retries += 1
        handle = asyncio.get_running_loop().call_later(wait, self._resend, item, prefer)
        self._backing_off[item] = (handle, prefer)

    def _resend(self, item: _Pending, prefer: _Replica | None) -> None:
        self._backing_off.pop(item, None)
        self._submit(item, prefer)

    def _give_up(self, item: _Pending, why: str) -> None:
        kind, message = item.error or (ErrorKind.TIMEOUT, "no result")
        self._finish(item, item.endpoint.failure(item.payload, kind, f"{message} ({why})"))

    def _backoff(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * 2 ** min(32, max(0, attempt - 1)))
        return base * random.uniform(0.5, 1.0)  # jitter spreads retries of one failed batch

    # ----------------------------------------------------------------- idempotency

    def _is_idempotent(self, item: _Pending) -> bool:
        """May this call run twice? Verifiers only score; a tool must say so (unknown: no)."""
        if item.endpoint is _VERIFY:
            return True
        return self._idempotent.get(item.payload.name, False)

    async def _learn_idempotency(self, items: list[_Pending]) -> None:
        """If some of these tools are not known yet, give tool lists being fetched a moment."""
        if all(item.endpoint is _VERIFY or item.payload.name in self._idempotent for item in items):
            return
        fetching = [r.described for r in self.replicas if r.described is not None and not r.described.done()]
        if fetching:
            await asyncio.wait(fetching, timeout=self.health_timeout_s)

    async def _learn_tools(self, replica: _Replica) -> None:
        """Read which tools declare themselves idempotent from the replica's GET /v1/tools.

        Once per replica (again after it was down: maybe a new process, a new config), in
        the background of its first POST: nothing on the hot path. A tool two replicas
        disagree on counts as not idempotent.
        """
        try:
            response = await self._http.get(
                replica.url + "/v1/tools", params={"toolset": "*"}, timeout=self.health_timeout_s
            )
            response.raise_for_status()
            tools = orjson.loads(response.content).get("tools") or []
        except Exception as exc:  # unreachable, an old server: its tools stay unknown (not idempotent)
            log.info(
                "could not list the tools of %s (%r); unknown tools count as not idempotent", replica.url, exc
            )
            return
        for descriptor in tools:
            name = descriptor.get("name") if isinstance(descriptor, dict) else None
            if isinstance(name, str):
                self._idempotent[name] = self._idempotent.get(name, True) and _declares_idempotent(descriptor)

    # ----------------------------------------------------------------- health

    def _mark_down(self, replica: _Replica, why: str) -> None:
        replica.failures += 1
        if replica.healthy:
            replica.healthy = False
            self._metrics.replica_down += 1
            log.warning("replica %s marked down: %s", replica.url, why)
        self._schedule_probe(replica)

    def _mark_up(self, replica: _Replica) -> None:
        replica.failures = 0
        if not replica.healthy:
            replica.healthy = True
            replica.described = None  # maybe a new process with another config: learn again
            self._metrics.replica_up += 1
            log.info("replica %s is back up", replica.url)
            self._wake()

    def _wake(self) -> None:
        """A replica came back: calls waiting out a connection failure go now."""
        for item, (handle, prefer) in list(self._backing_off.items()):
            if item.error is not None and item.error[0] == ErrorKind.UNAVAILABLE:
                handle.cancel()
                self._resend(item, prefer)

    def _schedule_probe(self, replica: _Replica) -> None:
        """Probe a replica that just failed, and keep probing while it stays down."""
        if self._closed or (replica.probing is not None and not replica.probing.done()):
            return
        replica.probing = asyncio.get_running_loop().create_task(self._revive(replica))

    async def _revive(self, replica: _Replica) -> None:
        delay = self.backoff_s
        while not self._closed:
            if await self._probe(replica):
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, max(self.max_backoff_s, self.backoff_s))

    async def _probe(self, replica: _Replica) -> bool:
        try:
            response = await self._http.get(replica.url + "/healthz", timeout=self.health_timeout_s)
            ok = response.status_code == 200
        except httpx.HTTPError as exc:
            ok, why = False, f"/healthz failed: {exc!r}"
        else:
            why = f"/healthz answered {response.status_code}"
        if ok:
            self._mark_up(replica)
        elif replica.healthy:
            replica.healthy = False
            self._metrics.replica_down += 1
            log.warning("replica %s marked down: %s", replica.url, why)
        return ok

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._probe(r) for r in self.replicas), return_exceptions=True)

    # ----------------------------------------------------------------- plain requests

    async def _request(
        self,
        method: str,
        path: str,
        *,
        replica: _Replica | None = None,
        params: dict[str, str] | None = None,
        content: bytes | None = None,
        ok: tuple[int, ...] = (),
    ) -> httpx.Response:
        """One non-batched request with retries on connect errors, 429 and 5xx."""
        self._start()
        last = "no attempt made"
        retries = _REQUEST_RETRIES if self.max_retries is None else self.max_retries
        for attempt in range(retries + 1):
            target = replica or self._least_loaded()
            try:
                response = await self._http.request(
                    method, target.url + path, params=params, content=content, headers=self._headers
                )
            except httpx.TransportError as exc:
                self._metrics.error("connect" if isinstance(exc, httpx.ConnectError) else "transport")
                if isinstance(exc, httpx.ConnectError):
                    self._mark_down(target, f"connect failed: {exc}")
                last = f"{method} {target.url}{path} failed: {exc!r}"
            else:
                if response.status_code < 400 or response.status_code in ok:
                    self._mark_up(target)
                    return response
                last = (
                    f"{method} {target.url}{path} answered {response.status_code}: {_error_message(response)}"
                )
                if response.status_code != 429 and response.status_code < 500:
                    raise ToolServerError(last)
                self._metrics.error(f"http_{response.status_code}")
                if response.status_code == 429:
                    await asyncio.sleep(_retry_after(response.headers.get("retry-after")))
                    continue
            await asyncio.sleep(self._backoff(attempt + 1))
        raise ToolServerError(f"{last} (gave up after {retries + 1} tries)")


def _declares_idempotent(descriptor: dict[str, Any]) -> bool:
    """Our ``_meta.toolfactory.idempotent``; else MCP's hints (a read-only tool is idempotent).

    Ours comes first: our server's ``readOnlyHint`` only says "keeps no session state".
    """
    meta = descriptor.get("_meta")
    ours = meta.get(META_KEY) if isinstance(meta, dict) else None
    if isinstance(ours, dict) and "idempotent" in ours:
        return ours["idempotent"] is True
    hints = descriptor.get("annotations")
    if not isinstance(hints, dict):
        return False
    return hints.get("idempotentHint") is True or hints.get("readOnlyHint") is True


def _retry_after(value: str | None, default: float = 0.1) -> float:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    return max(0.0, when.timestamp() - time.time())


def _error_message(response: httpx.Response) -> str:
    """The server's error message from a JSON error body, else the start of the text."""
    try:
        data = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.text[:300] or response.reason_phrase
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data))
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(error)
    return str(data)[:300]
