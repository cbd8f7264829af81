"""The tool client's tunables, grouped by job: batching, retries, health checks.

Each policy is a frozen dataclass whose defaults suit a trainer with thousands of
concurrent trajectories against a few replicas; pass one to ``ToolClient`` to change
them. ``policies_from_keywords`` maps the client's older flat keyword arguments
(``batch_window_ms=``, ``max_retries=``, ...) onto these, so existing callers keep working.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How calls are coalesced into ``POST /v1/calls`` (and ``/v1/verify``) requests.

    Attributes:
        window_ms: while a POST is already in flight, how long the first call of the next
            batch waits for company (an idle client sends on the next loop pass).
        max_batch: most calls in one POST.
        max_inflight_batches: most concurrent POSTs per replica and endpoint.
        split_after_ms: a batch of at most ``split_max`` calls still unanswered after this
            long gets one extra POST per pending call (same call_id, so the server joins the
            running call): a slow call then no longer delays the fast calls that shared its
            batch. Only while the replica's recent batches say one call is to blame, not the
            replica as a whole (``splits``). ``0`` disables it.
        split_max: largest batch that is split that way.
    """

    window_ms: float = 2.0
    max_batch: int = 256
    max_inflight_batches: int = 256
    split_after_ms: float = 50.0
    split_max: int = 64

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_inflight_batches < 1:
            raise ValueError("max_batch and max_inflight_batches must be at least 1")
        if self.window_ms < 0:
            raise ValueError("batch_window_ms must be >= 0")

    @property
    def window_s(self) -> float:
        return self.window_ms / 1000.0

    @property
    def split_after_s(self) -> float:
        return self.split_after_ms / 1000.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Deadlines and re-sends.

    Attributes:
        timeout_s: default per-call deadline (submission to result): the budget that all
            retries spend.
        request_timeout_s: limit for one POST attempt; ``None`` = the batch's remaining deadline.
        max_retries: optional cap on re-sends after connect errors, timeouts and 5xx answers
            (``None``: retries run until the deadline). Overload answers never count. Plain
            requests (``list_tools``, sessions) make at most this many (default 6) retries.
        backoff_s / max_backoff_s: exponential backoff with jitter between attempts, capped.
    """

    timeout_s: float = 120.0
    request_timeout_s: float | None = None
    max_retries: int | None = None
    backoff_s: float = 0.05
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")

    def backoff(self, attempt: int) -> float:
        """Wait before attempt ``attempt + 1``; jitter spreads the retries of one failed batch."""
        return backoff_delay(attempt, self.backoff_s, self.max_backoff_s)


def backoff_delay(attempt: int, first_s: float, max_s: float) -> float:
    """The one backoff of the client's retries (batches, plain requests, the call stream's
    reconnections and resends): ``first_s`` doubling per attempt up to ``max_s``, times a jitter
    in [0.5, 1) so that the retries of one failure do not arrive together."""
    base = min(max_s, first_s * 2 ** min(32, max(0, attempt - 1)))
    return base * random.uniform(0.5, 1.0)


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """``/healthz`` probes.

    Attributes:
        interval_s: period of the probes of every replica (``0`` = only after failures).
        timeout_s: limit for one probe (and for reading a replica's tool list).
    """

    interval_s: float = 5.0
    timeout_s: float = 2.0


# The flat keyword arguments ToolClient took before policies: name -> (policy, field).
_KEYWORDS: dict[str, tuple[type[Any], str]] = {
    "batch_window_ms": (BatchPolicy, "window_ms"),
    "max_batch": (BatchPolicy, "max_batch"),
    "max_inflight_batches": (BatchPolicy, "max_inflight_batches"),
    "split_after_ms": (BatchPolicy, "split_after_ms"),
    "split_max": (BatchPolicy, "split_max"),
    **{f.name: (RetryPolicy, f.name) for f in fields(RetryPolicy)},
    "health_interval_s": (HealthPolicy, "interval_s"),
    "health_timeout_s": (HealthPolicy, "timeout_s"),
}


def policies_from_keywords(
    batch: BatchPolicy | None,
    retry: RetryPolicy | None,
    health: HealthPolicy | None,
    keywords: dict[str, Any],
) -> tuple[BatchPolicy, RetryPolicy, HealthPolicy]:
    """The given policies (or the defaults) with the flat keyword arguments applied on top."""
    changes: dict[type[Any], dict[str, Any]] = {BatchPolicy: {}, RetryPolicy: {}, HealthPolicy: {}}
    for name, value in keywords.items():
        if name not in _KEYWORDS:
            raise TypeError(f"ToolClient got an unexpected keyword argument {name!r}")
        policy, field_name = _KEYWORDS[name]
        changes[policy][field_name] = value
    return (
        replace(batch or BatchPolicy(), **changes[BatchPolicy]),
        replace(retry or RetryPolicy(), **changes[RetryPolicy]),
        replace(health or HealthPolicy(), **changes[HealthPolicy]),
    )
