"""Async HTTP client for the tool server's batch API: coalescing, retries, replicas.

Why it looks like this: a trainer runs hundreds or thousands of trajectories at
once, and each makes a few tool calls per turn. One HTTP request per call would
cost more client and server CPU than most tools do, so calls that arrive within
``batch_window_ms`` of each other (from any trajectory) go out together in one
``POST /v1/calls``; each caller still awaits only its own result.

Retries never run a tool twice: a retried call keeps its ``call_id`` and stays on
the replica it was first sent to (while that replica is up), and the server
answers a repeated ``call_id`` from its idempotency store. Calls that carry a
session stick to one replica (the session's state lives there); stateless calls
go to the least-loaded healthy replica.

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


@dataclass(slots=True, eq=False)
class _Pending:
    """One call (or verify request) between submission and its result."""

    payload: Any
    endpoint: _Endpoint
    future: asyncio.Future[Any]
    session: str | None
    deadline: float
    started: float
    attempts: int = 0  # failed attempts that count against max_retries
    overloaded: int = 0  # 429 / overloaded answers (bounded by the deadline only)
    replica: _Replica | None = None


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
    """

    def __init__(self, client: ToolClient, replica: _Replica, endpoint: _Endpoint) -> None:
        self._client = client
        self._replica = replica
        self._endpoint = endpoint
        self._items: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()

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

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        limit = self._client.max_batch
        while self._items and self._inflight < self._client.max_inflight_batches:
            batch, self._items = self._items[:limit], self._items[limit:]
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        try:
            live = [item for item in batch if not item.future.done()]
            if live:
                await self._client._post_batch(self._replica, self._endpoint, live)
        finally:
            self._inflight -= 1
            if self._items and self._timer is None:
                self._flush()  # these items already waited for a free slot: no second window

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

    Args:
        urls: base URL of a server (``http://host:port``) or a list of replicas.
        token: bearer token; defaults to the ``TOOLFACTORY_TOKEN`` environment variable.
        batch_window_ms: while a POST is already in flight, how long the first call of the
            next batch waits for company (an idle client sends on the next loop pass).
        max_batch: most calls in one POST.
        max_inflight_batches: most concurrent POSTs per replica and endpoint.
        timeout_s: default per-call deadline (submission to result, retries included).
        request_timeout_s: limit for one POST attempt; ``None`` = the batch's remaining deadline.
        max_retries: retries after connect errors, timeouts and 5xx answers. Overloaded
            answers (HTTP 429, ``overloaded`` results) are retried until the deadline.
        backoff_s / max_backoff_s: exponential backoff with jitter between attempts.
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
        max_retries: int = 6,
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
            "retries": m.retries,
            "split_posts": m.splits,
            "errors": dict(m.errors),
            "result_errors": dict(m.result_errors),
            "latency_ms": _percentiles(m.latencies_ms),
            "session_moves": m.session_moves,
            "replica_down_events": m.replica_down,
            "replica_up_events": m.replica_up,
            "replicas": [
                {"url": r.url, "healthy": r.healthy, "load": r.load, "batches": r.batches, "calls": r.calls}
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
        try:
            await asyncio.wait([item.future for item in items], timeout=timeout)
        except asyncio.CancelledError:
            for item in items:
                if not item.future.done():
                    item.future.cancel()
                    self._unload(item)
                self._pending.discard(item)
            raise
        for item in items:
            if not item.future.done():
                self._metrics.error("deadline")
                self._finish(
                    item,
                    endpoint.failure(
                        item.payload,
                        ErrorKind.TIMEOUT,
                        f"no result within {timeout:g} s (client deadline; "
                        f"{item.attempts + item.overloaded} retries)",
                    ),
                )
        return [item.future.result() for item in items]

    def _submit(self, item: _Pending, prefer: _Replica | None = None) -> None:
        if item.future.done() or self._closed:
            return
        replica = self._route(item.session, prefer)
        item.replica = replica
        replica.load += 1
        key = (id(replica), item.endpoint.name)
        batcher = self._batchers.get(key)
        if batcher is None:
            batcher = self._batchers[key] = _Batcher(self, replica, item.endpoint)
        batcher.add(item)

    # ----------------------------------------------------------------- routing

    def _route(self, session: str | None, prefer: _Replica | None) -> _Replica:
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
        split = None
        if endpoint is _CALLS and self.split_after_s > 0 and 1 < len(items) <= self.split_max:
            split = asyncio.get_running_loop().call_later(self.split_after_s, self._split, replica, items)
        try:
            body = encode({endpoint.key: [item.payload for item in items]})
            response = await self._http.post(
                replica.url + endpoint.path,
                content=body,
                headers=self._headers,
                timeout=httpx.Timeout(self._attempt_timeout(items), pool=None),
            )
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            m.error("connect")
            self._mark_down(replica, f"connect failed: {exc}")
            self._retry_all(items, ErrorKind.UNAVAILABLE, f"cannot connect to {replica.url}: {exc}")
            return
        except httpx.TimeoutException:
            m.error("request_timeout")
            self._schedule_probe(replica)
            self._retry_all(items, ErrorKind.TIMEOUT, f"{replica.url} did not answer in time")
            return
        except httpx.TransportError as exc:
            m.error("transport")
            self._schedule_probe(replica)
            self._retry_all(items, ErrorKind.UNAVAILABLE, f"connection to {replica.url} failed: {exc!r}")
            return
        except Exception as exc:  # a bug or an unexpected failure must not leave callers hanging
            m.error("client")
            log.exception("unexpected error sending a batch to %s", replica.url)
            self._fail_all(items, ErrorKind.UNAVAILABLE, f"client error: {exc!r}")
            return
        finally:
            if split is not None:
                split.cancel()
        self._settle(replica, endpoint, items, response)

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
            if not item.future.done():
                self._metrics.splits += 1
                self._background(loop.create_task(self._join(replica, item)))

    async def _join(self, replica: _Replica, item: _Pending) -> None:
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

    def _settle(
        self, replica: _Replica, endpoint: _Endpoint, items: list[_Pending], response: httpx.Response
    ) -> None:
        m = self._metrics
        status = response.status_code
        if status == 200:
            self._mark_up(replica)
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
                if endpoint.overloaded(result):
                    m.error("overloaded")
                    self._retry(item, ErrorKind.OVERLOADED, result.error.message, overloaded=True)
                else:
                    self._finish(item, result)
            return
        message = _error_message(response)
        if status == 429 or (status == 503 and "retry-after" in response.headers):
            m.error(f"http_{status}")
            delay = _retry_after(response.headers.get("retry-after"))
            for item in items:
                self._retry(item, ErrorKind.OVERLOADED, message, delay=delay, overloaded=True)
        elif status >= 500:
            m.error(f"http_{status}")
            self._schedule_probe(replica)
            self._retry_all(items, ErrorKind.UNAVAILABLE, f"{replica.url} answered {status}: {message}")
        elif status == 413 and len(items) > 1:
            m.error("http_413")  # too big as one batch: split it and try again
            half = len(items) // 2
            for part in (items[:half], items[half:]):
                task = asyncio.get_running_loop().create_task(self._post_batch(replica, endpoint, part))
                self._background(task)
        elif status in (401, 403):
            m.error(f"http_{status}")
            self._fail_all(items, ErrorKind.UNAUTHORIZED, f"{replica.url} refused the token: {message}")
        else:
            m.error(f"http_{status}")
            kind = ErrorKind.TOO_LARGE if status == 413 else ErrorKind.BAD_REQUEST
            self._fail_all(items, kind, f"{replica.url} rejected the batch ({status}): {message}")

    def _background(self, task: asyncio.Task[Any]) -> None:
        """Keep a reference to a fire-and-forget task so it is not garbage collected."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

    def _retry_all(self, items: list[_Pending], kind: ErrorKind, message: str) -> None:
        for item in items:
            self._retry(item, kind, message)

    def _retry(
        self,
        item: _Pending,
        kind: ErrorKind,
        message: str,
        *,
        delay: float | None = None,
        overloaded: bool = False,
    ) -> None:
        """Send the same payload (same call_id) again after a backoff, or give up."""
        prefer = item.replica
        self._unload(item)
        if item.future.done():
            return
        if overloaded:
            item.overloaded += 1
        else:
            item.attempts += 1
            if item.attempts > self.max_retries:
                self._finish(
                    item,
                    item.endpoint.failure(
                        item.payload, kind, f"{message} (gave up after {item.attempts} tries)"
                    ),
                )
                return
        backoff = self._backoff(item.attempts + item.overloaded)
        wait = max(delay, backoff) if delay is not None else backoff
        if time.monotonic() + wait >= item.deadline:
            self._finish(item, item.endpoint.failure(item.payload, kind, f"{message} (deadline reached)"))
            return
        self._metrics.retries += 1
        asyncio.get_running_loop().call_later(wait, self._submit, item, prefer)

    def _backoff(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * (2 ** max(0, attempt - 1)))
        return base * random.uniform(0.5, 1.0)  # jitter spreads retries of one failed batch

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
            self._metrics.replica_up += 1
            log.info("replica %s is back up", replica.url)

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
        for attempt in range(self.max_retries + 1):
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
        raise ToolServerError(f"{last} (gave up after {self.max_retries + 1} tries)")


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
