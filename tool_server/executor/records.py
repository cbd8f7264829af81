"""What the executor remembers of calls: results kept for retries, calls in flight, the cache.

* Idempotency: a final result is kept under (tenant, call_id) for ``idempotency.ttl_s``;
  a retry of the same call gets it again, a retry while the call still runs joins it.
  A call_id is bound to the call it was first used for (tool, session, arguments): a
  different call under a used id is refused. A tenant only ever meets its own ids.
  Cancelled, timed-out and overloaded outcomes are not kept: a retry runs again.
* Result cache: results of tools marked ``cacheable``, per tenant, tool version and
  canonical arguments, so that one tenant's hit tells nothing of another's calls. A hit
  is not kept under its call_id (it shares the cache entry's content; nothing more is held).

Both stores are bounded by age, count and size (``stores.TTLStore``). They keep each result
as the JSON it is answered with, not as objects: half the memory, a size for ``max_bytes``
that is measured rather than guessed, and nothing the garbage collector walks twice (200,000
results kept as objects, ~1M tracked objects, made each collection that met them stall the
event loop for 0.2-0.5 s; bench/README.md). The batched route sends those same bytes
(``result_json``): a kept result is encoded once.
"""

from __future__ import annotations

import asyncio
import math
import struct
from typing import Any

import orjson

from protocol import ErrorKind, Result, encode
from protocol.messages import result_from_dict
from tool_server.config import Config
from tool_server.executor.gc_pacing import GcPacer
from tool_server.metrics import Metrics
from tool_server.registry import ToolEntry
from tool_server.stores import TTLStore

__all__ = ["CallRecords", "Fingerprint", "canonical_arguments", "result_json", "storable"]

# What a kept entry costs beside its JSON: the bytes object, its key, its slot in the store's
# dict, the store's two records of it. Measured with tracemalloc: 591 bytes per kept echo result
# whose JSON is 238 bytes, under a 52-character key (as objects, before: 1,178 bytes).
ENTRY_OVERHEAD = 352
# What a reused call_id must match: hash((tool, session, canonical arguments)). Two different
# calls under one id are told apart unless their 64-bit hashes collide, as the arguments' own
# hash already had to.
Fingerprint = int
# Objects a kept entry leaves for the collector's first walk (TTLStore's two records of it),
# which it then stops tracking: they hold only strings, bytes and numbers. Hence the fingerprint
# is packed into the kept bytes, not paired with them: a tuple inside a record is walked again
# by every middle-generation collection until that one stops tracking it too.
OWED_PER_ENTRY = 2
_FINGERPRINT = struct.Struct("<q")  # a kept call's fingerprint, ahead of its result's JSON
_JSON = "_kept_json"  # a kept result's JSON, on the Result itself: orjson leaves "_" attributes out
_dumps, _NUMPY, _pack = orjson.dumps, orjson.OPT_SERIALIZE_NUMPY, _FINGERPRINT.pack


def result_json(result: Result) -> bytes:
    """The result as JSON: the bytes it was kept as (``CallRecords.keep``), or encoded now."""
    data = result.__dict__.get(_JSON)
    return data if data is not None else encode(result)


class CallRecords:
    """The idempotency store, the calls in flight, and the result cache (None when disabled)."""

    __slots__ = ("_done", "_inflight", "_joiners", "_cache", "_metrics", "pacer")

    def __init__(self, config: Config, metrics: Metrics) -> None:
        # key (Caller.key_prefix + call_id) -> the call's fingerprint (8 bytes), its result's JSON
        self._done: TTLStore[str, bytes] = TTLStore(
            config.idempotency.max_entries, config.idempotency.ttl_s, config.idempotency.max_bytes
        )
        self._inflight: dict[str, Fingerprint] = {}  # calls under way
        # Retries waiting for a call under way, each on a future of its own, resolved with
        # the result however the call ends: one retry going away does not touch the others.
        self._joiners: dict[str, list[asyncio.Future[Result]]] = {}
        self._cache: TTLStore[tuple[Any, ...], bytes] | None = (
            TTLStore(config.cache.max_entries, config.cache.ttl_s, config.cache.max_bytes)
            if config.cache.enabled
            else None
        )
        self._metrics = metrics
        self.pacer = GcPacer()  # the MCP endpoint owes it its requests' cycles too

    @property
    def results_stored(self) -> int:
        """Results kept for idempotent retries since start."""
        return self._done.puts_total

    def sizes(self) -> dict[str, tuple[int, int]]:
        """(entries, bytes) of the idempotency store and the result cache."""
        sizes = {"idempotency": (len(self._done), self._done.bytes)}
        if self._cache is not None:
            sizes["cache"] = (len(self._cache), self._cache.bytes)
        return sizes

    def sweep(self) -> int:
        """Drop the expired entries of both stores (``TTLStore.sweep``); how many went."""
        return self._done.sweep() + (self._cache.sweep() if self._cache is not None else 0)

    def sweep_interval_s(self) -> float:
        """How often to sweep: a tenth of the shortest lifetime, between 50 ms and 5 s."""
        ttls = [self._done.ttl_s] + ([self._cache.ttl_s] if self._cache is not None else [])
        return min(5.0, max(0.05, min(ttls) / 10))

    def earlier(self, key: str, call_id: str, fingerprint: int) -> Result | asyncio.Future[Result] | None:
        """What the call_id already stands for: its kept result, its running call to join,
        a refusal if it was used for another call, or None (an id not seen yet)."""
        kept = self._done.get(key)
        if kept is not None:
            if _FINGERPRINT.unpack_from(kept)[0] != fingerprint:
                return _reused(call_id)
            self._metrics.replays.inc()
            return _decoded(kept[_FINGERPRINT.size :], keep_json=True)
        running = self._inflight.get(key)
        if running is not None:
            if running != fingerprint:
                return _reused(call_id)
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
        data = self._cache.get(cache_key)  # type: ignore[union-attr]
        if data is None:
            return None
        self._metrics.cache_hits.inc()
        hit = _decoded(data, keep_json=False)
        hit.call_id, hit.cached, hit.elapsed_ms = call_id, True, 0.0
        return hit

    def running(self, key: str, fingerprint: int) -> None:
        """The call is under way: a retry of it joins it until ``settle`` tells how it ended."""
        self._inflight[key] = fingerprint

    def settle(self, key: str, fingerprint: int, cache_key: Any, result: Result, store: bool) -> None:
        """A call under way has ended: hand its result to the retries that joined it, then
        ``keep`` it."""
        self._inflight.pop(key, None)
        if self._joiners:
            for joiner in self._joiners.pop(key, ()):
                if not joiner.done():  # a joiner cancelled meanwhile has gone
                    joiner.set_result(result)
        self.keep(key, fingerprint, cache_key, result, store)

    def keep(self, key: str, fingerprint: int, cache_key: Any, result: Result, store: bool) -> None:
        """Keep a final result for retries (if ``store``) and in the cache, as its JSON."""
        cache = cache_key is not None and not result.is_error
        if not (store or cache):
            return
        data = _dumps(result, option=_NUMPY)  # protocol.encode, inlined: this runs for every call
        result.__dict__[_JSON] = data  # the answer sends these bytes: encoded once
        size = len(data) + ENTRY_OVERHEAD
        if store:
            self._done.put(key, _pack(fingerprint) + data, size)
        if cache:
            self._cache.put(cache_key, data, size)  # type: ignore[union-attr]
        self.pacer.owe(OWED_PER_ENTRY * (store + cache))


def _decoded(data: bytes, *, keep_json: bool) -> Result:
    """A kept result, read back; with ``keep_json`` it answers with the very bytes kept."""
    result = result_from_dict(orjson.loads(data))
    if keep_json:
        result.__dict__[_JSON] = data
    return result


def canonical_arguments(arguments: dict[str, Any]) -> bytes:
    """Arguments as canonical JSON (sorted keys): the cache key and the call fingerprint."""
    try:
        encoded = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # values JSON cannot hold: only an agent tool's inner call has them
        return _spelled_out(arguments)
    # orjson writes NaN and ±Infinity (MCP requests may carry them) as null: told apart here,
    # or a call with null would replay one with NaN, and a cache hit answer it. find, not
    # ``in``: bytes.__contains__ first tries its argument as an int, and the TypeError it
    # builds and drops cost ~0.5 µs a call.
    if encoded.find(b"null") != -1 and _has_non_finite(arguments):
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


def _reused(call_id: str) -> Result:
    return Result.failure(
        call_id,
        ErrorKind.BAD_REQUEST,
        f"call_id {call_id!r} was already used for a different call (another tool, arguments or "
        "session); a retry must repeat the call exactly, a new call needs a new call_id",
    )
