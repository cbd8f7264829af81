"""The records the tool client keeps: endpoints, replicas, pending calls, metrics.

Plain data and pure helpers (no I/O), shared by ``client``, ``batching`` and
``routing``.
"""

from __future__ import annotations

import asyncio
import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

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
)
from protocol.messages import _error_from  # how the wire's error object reads


class ReplicaQueue(Protocol):
    """What a replica asks of each of its batchers (``batching.Batcher``), named here so that
    the records need not import the module that uses them."""

    @property
    def waiting(self) -> bool: ...

    def resume(self) -> None: ...


LATENCY_SAMPLES = 100_000  # bounded window for latency percentiles
WINDOW_GROWTH = 1 / 8  # per answered call while a window is full: ~1/8 per round trip

# --------------------------------------------------------------------------- endpoints


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One batched endpoint: where it lives, how its body and answers look, how to fail an item."""

    name: str
    path: str
    encode: Callable[[list[Any]], bytes]  # a batch's body
    decode: Callable[[bytes], list[Any]]
    failure: Callable[[Any, ErrorKind, str], Any]
    overloaded: Callable[[Any], bool]


def _call_failure(call: Call, kind: ErrorKind, message: str) -> Result:
    return Result.failure(call.call_id, kind, message)


def _verify_failure(request: VerifyRequest, kind: ErrorKind, message: str) -> VerifyResult:
    return VerifyResult(
        score=0.0, request_id=request.request_id, is_error=True, error=ErrorInfo(kind, message)
    )


def is_overloaded(result: Result | VerifyResult) -> bool:
    return bool(result.is_error and result.error and result.error.kind == ErrorKind.OVERLOADED)


def decode_call_results(body: bytes) -> list[Result]:
    """``protocol.decode_results`` at about two thirds of its cost (positional records, no
    call per field: this runs for every call the client makes); an answer of another shape
    goes to ``decode_results``, whose ``ProtocolError`` says what is wrong with it."""
    data = orjson.loads(body)
    try:
        return [
            Result(
                item["call_id"],
                item.get("content") or [],
                item.get("structured"),
                bool(item.get("is_error")),
                None if item.get("error") is None else _error_from(item["error"]),
                float(item.get("elapsed_ms") or 0.0),
                bool(item.get("cached")),
            )
            for item in data["results"]
        ]
    except (KeyError, TypeError, ValueError, AttributeError):
        return decode_results(body)


def encode_calls(calls: list[Call]) -> bytes:
    """``{"calls": [...]}`` from plain dicts made for the purpose: orjson would read each
    ``Call``'s ``__dict__``, which makes Python keep a dict on every call for as long as it
    lives (one more object per call for the garbage collector to visit, again and again)."""
    return encode(
        {
            "calls": [
                {"call_id": c.call_id, "name": c.name, "arguments": c.arguments, "session": c.session}
                for c in calls
            ]
        }
    )


def _encode_verify(requests: list[VerifyRequest]) -> bytes:
    return encode({"requests": requests})


CALLS = Endpoint("calls", "/v1/calls", encode_calls, decode_call_results, _call_failure, is_overloaded)
VERIFY = Endpoint(
    "verify", "/v1/verify", _encode_verify, decode_verify_results, _verify_failure, is_overloaded
)


# --------------------------------------------------------------------------- state records


@dataclass(slots=True, eq=False)
class Replica:
    url: str
    healthy: bool = True
    load: int = 0  # calls routed here and not yet answered
    batches: int = 0
    calls: int = 0
    failures: int = 0
    probing: asyncio.Task[None] | None = None
    batchers: list[ReplicaQueue] = field(default_factory=list)
    described: asyncio.Task[None] | None = None  # its GET /v1/tools: which tools are idempotent
    # Admission control, learned from 429s (refused / answered below).
    outstanding: int = 0  # calls in POSTs sent here and not answered yet
    window: float | None = None  # most calls outstanding at once; None until a 429
    hold_until: float = 0.0  # monotonic time before which nothing is sent here
    refusals: int = 0  # 429s in a row: paces the hold when Retry-After is 0
    # Discovery (trainer_client.client.discovery): out of DNS, so no new sessions or stateless calls;
    # gone once dropped, when the sessions that lived there are lost.
    draining: bool = False
    gone: bool = False

    def refused(self, count: int, pause_s: float) -> None:
        """A 429 (or a 503 with Retry-After) refused ``count`` of the calls outstanding here.

        Hold the replica back for ``pause_s`` (jittered up to +20 %, so that clients do not
        come back in step), and from then on keep at most as many calls outstanding here
        as it had taken when it refused: it admits them as its queue drains, where a
        full-sized re-send would be refused again.
        """
        self.refusals += 1
        self.window = float(max(1, self.outstanding - count))  # nothing taken: start from one, grow
        self.hold_until = max(self.hold_until, time.monotonic() + pause_s * random.uniform(1.0, 1.2))

    def answered(self, count: int) -> None:
        """A batch of ``count`` was answered: while the window is full, let it grow a little."""
        self.refusals = 0
        if self.window is not None and time.monotonic() >= self.hold_until and self.saturated:
            self.window += count * WINDOW_GROWTH

    @property
    def saturated(self) -> bool:
        """Pushed back (it has a window) and calls queue for room: no extra POSTs."""
        return self.window is not None and any(b.waiting for b in self.batchers)


@dataclass(slots=True, eq=False)
class Pending:
    """One call (or verify request) between submission and its result."""

    payload: Any
    endpoint: Endpoint
    future: asyncio.Future[Any]
    session: str | None
    deadline: float
    started: float
    attempts: int = 0  # failed attempts other than overload (count against max_retries)
    overloaded: int = 0  # 429 / overloaded answers
    replica: Replica | None = None
    pinned: Replica | None = None  # may be running there (not idempotent): re-sent only there
    error: tuple[ErrorKind, str] | None = None  # why it waits for a re-send (None once sent)
    bucket: set[Pending] | None = None  # its deadline's bucket while pending (``deadlines``)


class LatencyWindow:
    """The last ``size`` latencies, in a flat array of doubles: a deque of float objects
    this size made every full garbage collection of the trainer's process visit 100,000 of them."""

    __slots__ = ("_count", "_values")

    def __init__(self, size: int) -> None:
        self._values = array("d", bytes(8 * size))
        self._count = 0

    def append(self, value: float) -> None:
        self._values[self._count % len(self._values)] = value
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, len(self._values))

    def samples(self) -> list[float]:
        return list(self._values[: len(self)])


@dataclass(slots=True)
class Metrics:
    calls: int = 0
    call_batches: int = 0
    calls_sent: int = 0  # calls carried by batch POSTs (a retried call counts again)
    max_batch: int = 0
    verify_requests: int = 0
    verify_batches: int = 0
    retries: int = 0
    splits: int = 0
    session_moves: int = 0  # sessions re-homed before any replica had answered for them
    sessions_lost: int = 0  # sessions whose replica went away with their state
    sessions_renewed: int = 0  # leases renewed (one per session per round, see ``leases``)
    leases_expired: int = 0  # leased sessions a replica no longer had when renewed
    replica_down: int = 0
    replica_up: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    result_errors: dict[str, int] = field(default_factory=dict)
    latencies_ms: LatencyWindow = field(default_factory=lambda: LatencyWindow(LATENCY_SAMPLES))

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def snapshot(self, replicas: Sequence[Replica]) -> dict[str, Any]:
        """The counters as ``ToolClient.metrics()`` reports them."""
        m = self
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
            "latency_ms": percentiles(m.latencies_ms.samples()),
            "session_moves": m.session_moves,
            "sessions_lost": m.sessions_lost,
            "sessions_renewed": m.sessions_renewed,
            "leases_expired": m.leases_expired,
            "replica_down_events": m.replica_down,
            "replica_up_events": m.replica_up,
            "replicas": [
                {
                    "url": r.url,
                    "healthy": r.healthy,
                    "draining": r.draining,
                    "load": r.load,
                    "batches": r.batches,
                    "calls": r.calls,
                    "window": None if r.window is None else int(r.window),
                }
                for r in replicas
            ],
        }


def percentiles(samples: Sequence[float]) -> dict[str, float]:
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


def declares_idempotent(descriptor: dict[str, Any]) -> bool:
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


def retry_after(value: str | None, default: float = 0.1) -> float:
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


class HttpAnswer(Protocol):
    """What ``error_message`` reads: an ``httpx.Response`` or a ``transport.Answer``."""

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    @property
    def reason_phrase(self) -> str: ...


def error_message(response: HttpAnswer | httpx.Response) -> str:
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
