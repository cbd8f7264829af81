"""``SandboxPool``: warm, confined interpreters leased one per session, within a fleet budget."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from tools.sandbox.host import clean_up_on_sigterm
from tools.sandbox.interpreter import SandboxWorker
from tools.sandbox.records import SandboxError, SandboxLimits, SandboxOverloaded

__all__ = ["SandboxPool"]

log = logging.getLogger(__name__)

# A worker's memory is re-measured after each of its calls, every second while a call runs,
# and every 10 s otherwise (a stopped worker's PSS moves only as page sharing changes).
_MEMORY_BUSY_AGE_S = 1.0
_MEMORY_IDLE_AGE_S = 10.0
_MAINTAIN_EVERY_S = 2.0  # the background thread re-measures memory this often
_SPAWN_RETRY_S = 5.0  # after a failed spawn, the background thread waits this long
# After an unexpected error the background thread waits, doubling up to the cap while it recurs.
_ERROR_BACKOFF_S = 0.5
_ERROR_BACKOFF_MAX_S = 30.0


@dataclass
class _PoolState:
    idle: deque[SandboxWorker] = field(default_factory=deque)
    leased: set[SandboxWorker] = field(default_factory=set)
    retired: deque[SandboxWorker] = field(default_factory=deque)
    spawning: int = 0
    last_error: str | None = None
    error_at: float = 0.0
    closing: bool = False
    memory: dict[SandboxWorker, tuple[int, float]] = field(default_factory=dict)  # (bytes, measured at)
    tenants: dict[SandboxWorker, str | None] = field(default_factory=dict)  # leased: whose session
    spawning_for: dict[str | None, int] = field(default_factory=dict)  # leases starting, by tenant
    evictions: int = 0
    stopped: int = 0  # busy workers stopped to hold the memory budget
    refused: int = 0
    maintenance_errors: int = 0  # unexpected errors the background thread survived
    measure_wanted: bool = False  # a scrape found stale figures: the background thread re-measures


class SandboxPool:
    """Pre-spawned, confined interpreters. A leased worker is never reused by anyone else.

    ``acquire`` hands out a warm worker (or starts one when none is idle); ``release``
    kills it. A background thread keeps ``size`` idle workers ready and reaps killed
    ones, so it works with any event loop and costs the loop nothing.

    Fleet budget: at most ``max_workers`` live interpreters (idle ones included) and
    ``max_total_memory_mb`` of measured memory (:meth:`SandboxWorker.memory_bytes`, summed:
    each worker's whole process tree and shared memory, measured after its calls, every
    ``MEMORY_CHECK_S`` during one, and every 2 s by the background thread).

    Tenants: a lease names its tenant (None: the server's own, or a server without tokens).
    A tenant holds at most ``max_workers_per_tenant`` leased interpreters (3/4 of
    ``max_workers`` by default), so the others always find room; a new lease past its share,
    or past ``max_workers``, evicts an idle interpreter *of its own tenant*, least recently
    used first (its next call reports the eviction), and is refused with
    :class:`SandboxOverloaded` when that tenant has none idle: one tenant's sessions never
    evict another's. Over the memory budget (at admission, during calls, in the background),
    the idle interpreters of the tenant holding the most memory go first, then that tenant's
    busy interpreter holding the most is stopped (its call reports why).
    """

    def __init__(
        self,
        size: int = 4,
        limits: SandboxLimits | None = None,
        *,
        python: str = sys.executable,
        preload: tuple[str, ...] = (),
        namespaces: bool = True,
        hide: tuple[str, ...] | None = None,
        max_workers: int = 64,
        max_total_memory_mb: int = 8192,
        max_workers_per_tenant: int | None = None,
    ) -> None:
        if size < 0:
            raise ValueError("pool size must be >= 0")
        if max_workers < 1 or max_total_memory_mb < 1:
            raise ValueError("max_workers and max_total_memory_mb must be >= 1")
        if max_workers_per_tenant is not None and max_workers_per_tenant < 1:
            raise ValueError(f"max_workers_per_tenant must be >= 1 (or None), got {max_workers_per_tenant}")
        self.size = size
        self.limits = limits or SandboxLimits()
        self.max_workers = max_workers
        self.max_memory_bytes = max_total_memory_mb << 20
        # A quarter stays open to other tenants however many sessions one of them opens.
        self.tenant_share = max_workers_per_tenant or max(1, max_workers * 3 // 4)
        self._spawn_kwargs: dict[str, Any] = {
            "python": python,
            "preload": preload,
            "namespaces": namespaces,
            "hide": hide,
        }
        self._state = _PoolState()
        self._cond = threading.Condition()
        self._measuring = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started = False
        self.isolation: dict[str, str] = {}

    async def start(self) -> None:
        """Start one worker now (so a broken setup fails here, loudly), the rest in the background."""
        if self._started:
            return
        self._started = True  # before the first await: concurrent callers return at once
        clean_up_on_sigterm()
        try:
            first = await anyio.to_thread.run_sync(self._spawn)
        except BaseException:
            self._started = False
            raise
        with self._cond:
            closing = self._state.closing  # closed while the first worker started
            if not closing:
                self._state.idle.append(first)
                self._thread = threading.Thread(target=self._maintain, name="sandbox-pool", daemon=True)
                self._thread.start()
        if closing:
            await first.aclose()
            raise SandboxError("the sandbox pool was closed while it started")

    async def close(self) -> None:
        """Kill every worker, idle and leased, and stop the background thread."""
        with self._cond:
            self._state.closing = True
            workers = [*self._state.idle, *self._state.leased, *self._state.retired]
            self._state.idle.clear()
            self._state.leased.clear()
            self._state.retired.clear()
            self._state.memory.clear()
            self._cond.notify_all()
        for worker in workers:
            worker.kill()
        thread, self._thread = self._thread, None
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join)
        for worker in workers:
            await worker.aclose()

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def acquire(self, tenant: str | None = None) -> SandboxWorker:
        """A warm, confined worker for one session of ``tenant``. Release it when done.

        Raises :class:`SandboxOverloaded` when the fleet budget or the tenant's share leaves no room.
        """
        if self._memory_stale():
            await anyio.to_thread.run_sync(self._measure_memory)  # /proc reads: off the event loop
        with self._cond:
            if self._state.closing:
                raise SandboxError("the sandbox pool is closed")
            self._make_room(tenant, need_worker=not any(w.alive for w in self._state.idle))
            worker = self._pop_idle()
            if worker is None:
                self._state.spawning += 1  # holds its place in max_workers
            spawning_for = self._state.spawning_for
            spawning_for[tenant] = spawning_for.get(tenant, 0) + 1  # and in the tenant's share
            self._cond.notify_all()  # refill
        spawned = worker is None
        try:
            if worker is None:
                worker = await anyio.to_thread.run_sync(self._spawn)
        finally:
            with self._cond:
                self._state.spawning -= spawned
                self._state.spawning_for[tenant] -= 1
                if not self._state.spawning_for[tenant]:
                    del self._state.spawning_for[tenant]
                closing = self._state.closing
                if worker is not None and not closing:
                    worker.last_used = time.monotonic()  # the newest lease is the last to be evicted
                    worker.fleet = self
                    self._state.leased.add(worker)
                    self._state.tenants[worker] = tenant
        assert worker is not None
        if closing:
            await worker.aclose()
            raise SandboxError("the sandbox pool is closed")
        return worker

    async def release(self, worker: SandboxWorker) -> None:
        """Kill a leased worker (its namespace and files die with it); reaped in the background."""
        worker.kill()
        with self._cond:
            self._state.leased.discard(worker)
            self._state.tenants.pop(worker, None)
            self._state.memory.pop(worker, None)
            if self._thread is not None and not self._state.closing:
                self._state.retired.append(worker)
                self._cond.notify_all()
                return
        await worker.aclose()

    @contextlib.asynccontextmanager
    async def worker(self, tenant: str | None = None) -> AsyncIterator[SandboxWorker]:
        """``async with pool.worker() as w: await w.run(...)`` — a worker for one block."""
        worker = await self.acquire(tenant)
        try:
            yield worker
        finally:
            await self.release(worker)

    @property
    def idle_count(self) -> int:
        return len(self._state.idle)

    def gauges(self) -> dict[str, float]:
        """Fleet figures for /metrics. Memory is the background thread's last measurement (at
        most ``_MAINTAIN_EVERY_S`` old plus a worker's staleness age): a scrape reads no /proc,
        it only asks that thread to re-measure stale figures now, for the next scrape."""
        with self._cond:
            state = self._state
            if not state.measure_wanted and any(self._stale(w) for w in (*state.idle, *state.leased)):
                state.measure_wanted = True
                self._cond.notify_all()
            return {
                "sandbox_workers_live": float(len(state.idle) + len(state.leased) + state.spawning),
                "sandbox_workers_idle_pool": float(len(state.idle)),
                "sandbox_workers_busy": float(sum(w.busy for w in state.leased)),
                "sandbox_workers_max": float(self.max_workers),
                "sandbox_memory_bytes": float(self._memory_total()),
                "sandbox_memory_budget_bytes": float(self.max_memory_bytes),
                "sandbox_evictions_total": float(state.evictions),
                "sandbox_memory_stops_total": float(state.stopped),
                "sandbox_admissions_refused_total": float(state.refused),
                "sandbox_maintenance_errors_total": float(state.maintenance_errors),
            }

    def _memory_stale(self) -> bool:
        with self._cond:
            return any(self._stale(w) for w in (*self._state.idle, *self._state.leased))

    def _stale(self, worker: SandboxWorker) -> bool:
        figure = self._state.memory.get(worker)
        if figure is None or worker.last_used >= figure[1]:
            return True
        age = time.monotonic() - figure[1]
        return age > (_MEMORY_BUSY_AGE_S if worker.busy else _MEMORY_IDLE_AGE_S)

    # -- budget (callers hold self._cond unless said otherwise) -----------------------------
    def _live(self) -> int:
        return len(self._state.idle) + len(self._state.leased) + self._state.spawning

    def _memory_total(self) -> int:
        return sum(size for size, _ in self._state.memory.values())

    def _pop_idle(self) -> SandboxWorker | None:
        while self._state.idle:
            candidate = self._state.idle.popleft()
            if candidate.alive:
                return candidate
            self._state.retired.append(candidate)
        return None

    def _held_by(self, tenant: str | None) -> int:
        state = self._state
        leased = sum(1 for w in state.leased if state.tenants.get(w) == tenant)
        return leased + state.spawning_for.get(tenant, 0)

    def _make_room(self, tenant: str | None, *, need_worker: bool) -> None:
        """Make room for a new lease of ``tenant``, evicting only that tenant's idle sessions
        (least recently used first); else refuse. Memory over budget is relieved first."""
        if self._memory_total() >= self.max_memory_bytes:
            self._relieve_memory(stop_busy=False)
        while True:
            full = need_worker and self._live() >= self.max_workers
            share = tenant is not None and self._held_by(tenant) >= self.tenant_share
            used = self._memory_total()
            if not full and not share and used < self.max_memory_bytes:
                return
            if used >= self.max_memory_bytes:
                why = f"sandbox memory is at its limit ({used >> 20} of {self.max_memory_bytes >> 20} MB)"
            elif share:
                why = (
                    f"this tenant's sessions hold its share of {self.tenant_share} interpreters "
                    "(max_workers_per_tenant)"
                )
            else:
                why = f"the sandbox fleet is at its limit of {self.max_workers} interpreters"
            if used >= self.max_memory_bytes or not self._evict_one(
                f"{why}, and this session was the least recently used idle one", tenant
            ):
                self._state.refused += 1
                whose = "this tenant's" if share else "every session's"
                raise SandboxOverloaded(
                    f"no python sandbox available: {why} and {whose} interpreter is busy. "
                    "Retry in a few seconds, or end sessions that are no longer needed."
                )

    def _evict_one(self, reason: str, tenant: str | None) -> bool:
        """Kill the least recently used idle leased worker of ``tenant``; False if there is none."""
        state = self._state
        for victim in sorted(state.leased, key=lambda w: w.last_used):
            if state.tenants.get(victim) == tenant and victim.evict(reason):
                self._forget(victim)
                state.evictions += 1
                return True
        return False

    def _forget(self, worker: SandboxWorker) -> None:
        state = self._state
        state.leased.discard(worker)
        state.tenants.pop(worker, None)
        state.memory.pop(worker, None)
        state.retired.append(worker)
        self._cond.notify_all()

    def _relieve_memory(self, *, stop_busy: bool) -> None:
        """While measured memory is over budget: evict the idle sessions of the tenant holding the
        most memory, least recently used first; then (``stop_busy``) stop that tenant's busy
        interpreter holding the most. Between a worker's checks it may go over by what it
        allocates meanwhile; this brings the fleet back under its budget at the next one."""
        state = self._state
        while (used := self._memory_total()) > self.max_memory_bytes:
            by_tenant: dict[str | None, int] = {}
            for worker, (size, _) in state.memory.items():
                if worker in state.leased:
                    tenant = state.tenants.get(worker)
                    by_tenant[tenant] = by_tenant.get(tenant, 0) + size
            if not by_tenant:
                return
            tenant = max(by_tenant, key=lambda t: by_tenant[t])
            why = f"sandbox memory was over its limit ({used >> 20} of {self.max_memory_bytes >> 20} MB)"
            if self._evict_one(f"{why}, and this session was the least recently used idle one", tenant):
                continue
            busy = [
                w for w in state.leased if state.tenants.get(w) == tenant and w in state.memory and w.alive
            ]
            if not stop_busy or not busy:
                return
            victim = max(busy, key=lambda w: state.memory[w][0])
            victim.stop_for(
                f"{why}, and this session's interpreter held the most of it "
                f"({state.memory[victim][0] >> 20} MB); it was killed"
            )
            # Still leased: its call in flight reads its fds until it sees the kill, and its
            # owner releases it then (retiring it now would close them under that call).
            state.memory.pop(victim)
            state.stopped += 1

    # -- the workers' memory checks (interpreter.Fleet), from the event loop or a thread --------
    def might_exceed(self, worker: SandboxWorker, bound: int) -> bool:
        with self._cond:
            others = sum(size for w, (size, _) in self._state.memory.items() if w is not worker)
            return others + bound > self.max_memory_bytes

    def update(self, worker: SandboxWorker, figure: int, *, running: bool) -> None:
        with self._cond:
            if worker in self._state.leased:
                self._state.memory[worker] = (figure, time.monotonic())
                self._relieve_memory(stop_busy=running)

    def _wants_spare(self) -> bool:
        state = self._state
        if state.last_error is not None and time.monotonic() - state.error_at < _SPAWN_RETRY_S:
            return False
        return (
            len(state.idle) + state.spawning < self.size
            and self._live() < self.max_workers
            and self._memory_total() < self.max_memory_bytes
        )

    # -- background --------------------------------------------------------------------------
    def _spawn(self) -> SandboxWorker:
        worker = SandboxWorker.spawn(self.limits, **self._spawn_kwargs)
        self.isolation = worker.isolation
        return worker

    def _measure_memory(self) -> None:
        """Re-measure the workers whose figure is stale (no lock held while reading /proc)."""
        if not self._measuring.acquire(blocking=False):
            return  # another thread is at it
        try:
            with self._cond:
                live = [*self._state.idle, *self._state.leased]
                stale = [w for w in live if self._stale(w)]
            figures = {}
            for worker in stale:
                taken_at = time.monotonic()  # a call that ends while measuring makes it stale again
                figures[worker] = (worker.memory_bytes(), taken_at)
            with self._cond:
                live = {*self._state.idle, *self._state.leased}
                old = self._state.memory
                self._state.memory = {w: figures.get(w) or old[w] for w in live if w in figures or w in old}
        finally:
            self._measuring.release()

    def _hold_memory_budget(self) -> None:
        self._measure_memory()
        with self._cond:
            self._relieve_memory(stop_busy=True)

    def _maintain(self) -> None:
        """Background thread: reap retired workers, keep ``size`` idle ones warm, hold the budget.

        An unexpected error is logged (once per distinct message), counted in the gauges and
        waited out with a growing back-off; the thread keeps running, or refills and memory
        figures would stop for the rest of the process.
        """
        check_at = time.monotonic() + _MAINTAIN_EVERY_S
        backoff = _ERROR_BACKOFF_S
        logged: set[str] = set()
        while True:
            try:
                check_at = self._maintain_once(check_at)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                if message not in logged and len(logged) < 100:  # bounded: a new text per pid must not flood
                    logged.add(message)
                    log.exception("sandbox pool background thread failed; retrying in %.1f s", backoff)
                with self._cond:
                    self._state.maintenance_errors += 1
                    if not self._state.closing:
                        self._cond.wait(timeout=backoff)
                backoff = min(backoff * 2, _ERROR_BACKOFF_MAX_S)
                continue
            if check_at is None:
                return
            backoff = _ERROR_BACKOFF_S

    def _maintain_once(self, check_at: float) -> float | None:
        """One round of :meth:`_maintain`: the next check time, None once the pool is closing."""
        with self._cond:
            while not (
                self._state.closing
                or self._state.retired
                or self._state.measure_wanted
                or self._wants_spare()
            ):
                wait = check_at - time.monotonic()
                if wait <= 0:
                    break
                self._cond.wait(timeout=min(wait, _SPAWN_RETRY_S))
            if self._state.closing:
                return None
            retired = list(self._state.retired)
            self._state.retired.clear()
            spare = self._wants_spare()
            if spare:
                self._state.spawning += 1
            measure, self._state.measure_wanted = self._state.measure_wanted, False
        try:
            while retired:
                retired[0].close_sync()  # marks itself closed first: a failed one is not retried
                retired.pop(0)
            if measure or time.monotonic() >= check_at:
                check_at = time.monotonic() + _MAINTAIN_EVERY_S
                self._hold_memory_budget()  # also the figures that gauges() serves
        except BaseException:
            with self._cond:
                self._state.retired.extend(retired[1:])  # the next round closes the rest
                self._state.spawning -= spare
            raise
        if spare:
            self._add_spare()
        return check_at

    def _add_spare(self) -> None:
        try:
            fresh = self._spawn()
        except Exception as exc:  # reported again by acquire() when it has to spawn itself
            with self._cond:
                self._state.spawning -= 1
                self._state.last_error, self._state.error_at = str(exc), time.monotonic()
            return
        with self._cond:
            self._state.spawning -= 1
            if not self._state.closing:
                self._state.idle.append(fresh)
                self._state.last_error = None
                return
        fresh.close_sync()
