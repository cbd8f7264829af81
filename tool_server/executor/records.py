"""What the executor remembers of calls: results kept for retries, calls in flight, the cache.

* Idempotency: a final result is kept under (tenant, call_id) for ``idempotency.ttl_s``;
  a retry of the same call gets it again, a retry while the call still runs joins it.
  A call_id is bound to the call it was first used for (tool, session, arguments): a
  different call under a used id is refused. A tenant only ever meets its own ids.
  Cancelled, timed-out and overloaded outcomes are not kept: a retry runs again.
* Result cache: results of tools marked ``cacheable``, per tenant, tool version and
  canonical arguments, so that one tenant's hit tells nothing of another's calls. A hit
  is not kept under its call_id (it shares the cache entry's content; nothing more is held).

Both stores are bounded by age, count and estimated bytes (``stores.TTLStore``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

import orjson

from protocol import ErrorKind, Result
from tool_server.config import Config
from tool_server.metrics import Metrics
from tool_server.registry import ToolEntry
from tool_server.stores import TTLStore

__all__ = ["CallRecords", "Fingerprint", "canonical_arguments", "storable"]

# (tool, session, hash of the canonical arguments): what a reused call_id must match.
Fingerprint = tuple[str, str | None, int]
CallKey = tuple[str, str]  # (tenant, call_id)


class CallRecords:
    """The idempotency store, the calls in flight, and the result cache (None when disabled)."""

    __slots__ = ("_done", "_inflight", "_joiners", "_cache", "_metrics")

    def __init__(self, config: Config, metrics: Metrics) -> None:
        self._done: TTLStore[CallKey, tuple[Fingerprint, Result]] = TTLStore(
            config.idempotency.max_entries, config.idempotency.ttl_s, config.idempotency.max_bytes
        )
        self._inflight: dict[CallKey, Fingerprint] = {}  # calls under way
        # Retries waiting for a call under way, each on a future of its own, resolved with
        # the result however the call ends: one retry going away does not touch the others.
        self._joiners: dict[CallKey, list[asyncio.Future[Result]]] = {}
        self._cache: TTLStore[tuple[Any, ...], Result] | None = (
            TTLStore(config.cache.max_entries, config.cache.ttl_s, config.cache.max_bytes)
            if config.cache.enabled
            else None
        )
        self._metrics = metrics

    @property
    def results_stored(self) -> int:
        """Results kept for idempotent retries since start (each keeps ~10 objects alive)."""
        return self._done.puts_total

    def sizes(self) -> dict[str, tuple[int, int]]:
        """(entries, estimated bytes) of the idempotency store and the result cache."""
        sizes = {"idempotency": (len(self._done), self._done.bytes)}
        if self._cache is not None:
            sizes["cache"] = (len(self._cache), self._cache.bytes)
        return sizes

    def earlier(self, key: CallKey, fingerprint: Fingerprint) -> Result | asyncio.Future[Result] | None:
        """What the call_id already stands for: its kept result, its running call to join,
        a refusal if it was used for another call, or None (an id not seen yet)."""
        done = self._done.get(key)
        if done is not None:
            if done[0] != fingerprint:
                return _reused(key[1])
            self._metrics.replays.inc()
            return done[1]
        running = self._inflight.get(key)
        if running is not None:
            if running != fingerprint:
                return _reused(key[1])
            joiner: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
            self._joiners.setdefault(key, []).append(joiner)
            return joiner
        return None

    def cache_key(self, tenant: str, entry: ToolEntry, canonical: bytes) -> tuple[Any, ...] | None:
        """Where the call's result is cached (None: the tool is not cached)."""
        if self._cache is None or not entry.meta.cacheable:
            return None
        # per tenant: a hit would tell one tenant what another asked (and when)
        return (tenant, entry.name, entry.meta.version, canonical)

    def cached(self, cache_key: tuple[Any, ...], call_id: str) -> Result | None:
        """The cached result of the same call, under this call's id (None: a miss).

        A hit is not kept under its call_id: its retries are hits too, and nothing more is
        held per hit (so that id is not bound to its call: another call under it runs).
        """
        hit = self._cache.get(cache_key)  # type: ignore[union-attr]
        if hit is None:
            return None
        self._metrics.cache_hits.inc()
        return dataclasses.replace(hit, call_id=call_id, cached=True, elapsed_ms=0.0)

    def running(self, key: CallKey, fingerprint: Fingerprint) -> None:
        """The call is under way: a retry of it joins it until ``keep`` tells how it ended."""
        self._inflight[key] = fingerprint

    def keep(
        self, key: CallKey, fingerprint: Fingerprint, cache_key: Any, result: Result, store: bool
    ) -> None:
        """The call has ended: hand its result to the retries that joined it, and keep it
        for later ones (if ``store``) and in the cache."""
        self._inflight.pop(key, None)
        if self._joiners:
            for joiner in self._joiners.pop(key, ()):
                if not joiner.done():  # a joiner cancelled meanwhile has gone
                    joiner.set_result(result)
        cache = cache_key is not None and not result.is_error
        size = _approx_bytes(result) if store or cache else 0
        if store:
            self._done.put(key, (fingerprint, result), size)
        if cache:
            self._cache.put(cache_key, result, size)  # type: ignore[union-attr]


def canonical_arguments(arguments: dict[str, Any]) -> bytes:
    """Arguments as canonical JSON (sorted keys): the cache key and the call fingerprint."""
    try:
        encoded = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # values JSON cannot hold: only an agent tool's inner call has them
        return _spelled_out(arguments)
    # orjson writes NaN and ±Infinity (MCP requests may carry them) as null: told apart here,
    # or a call with null would replay one with NaN, and a cache hit answer it.
    if b"null" in encoded and _has_non_finite(arguments):
        return _spelled_out(arguments)
    return encoded


def _spelled_out(arguments: dict[str, Any]) -> bytes:
    """Arguments as Python writes them (nan, inf and -inf apart), in key order."""
    return repr(sorted(arguments.items(), key=lambda item: repr(item[0]))).encode()


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_non_finite(v) for v in value)
    return False


def storable(result: Result) -> bool:
    """Final outcomes are kept for retries; transient ones (timeout, overload) run again."""
    return result.error is None or result.error.kind in (ErrorKind.TOOL_ERROR, ErrorKind.INVALID_ARGUMENTS)


def _approx_bytes(result: Result) -> int:
    """What a kept result costs in memory, roughly: its text plus the records around it.

    Calibrated with tracemalloc (~1.1 KB for a small result; structured output is held
    as objects beside its JSON text, so it counts 1.5 times). Cheap on purpose: it runs
    once per call.
    """
    text = data = 0
    for block in result.content:
        value = block.get("text")
        if value is not None:
            text += len(value)
        else:  # an image's base64 text: one string, shared by every hit and replay, counted once
            data += len(block.get("data") or "")
    return 1000 + data + (text * 3 // 2 if result.structured is not None else text)


def _reused(call_id: str) -> Result:
    return Result.failure(
        call_id,
        ErrorKind.BAD_REQUEST,
        f"call_id {call_id!r} was already used for a different call (another tool, arguments or "
        "session); a retry must repeat the call exactly, a new call needs a new call_id",
    )
