"""The executor: runs calls under limits, timeouts, idempotency, caching and truncation.

Every entry point (batch HTTP, MCP, verify, agent tools' inner calls) goes through
``Executor``, so the same guarantees hold everywhere:

* one result per call, never an exception: failures are ``Result.failure`` values;
* the caller's token is checked before anything is looked up: a tool it may not use is
  ``unauthorized`` whatever the call_id;
* a call_id seen before *from the same tenant* returns the stored result (or joins the
  running call) if the call is the same (tool, arguments, session); a different call
  under a used id is refused (unless its first use was answered from the result cache,
  which keeps nothing per call). Another tenant's call_id is just a new id;
* calls of stateful tools within one session run one at a time, in the order they
  arrive (batch order, then arrival order); different sessions run concurrently;
* a global concurrency limit with a bounded queue, plus optional per-tool limits;
  waiting calls get free slots (global and per tool) round-robin across tenants, a call
  waiting for its tool's slot holds no global one, and one tenant may hold at
  most ``limits.max_admitted_per_tenant`` admitted calls, so no tenant's backlog
  delays or locks out another's calls;
* per-call timeouts that cancel the coroutine (sync tools run in worker threads
  and are abandoned on timeout: put hard-to-stop work in a subprocess);
* cacheable tools are answered from an LRU keyed by tenant, tool, version and arguments.

This module admits, orders and schedules calls; the parts have modules of their own:
``admission`` (capacity and tenant shares), ``records`` (idempotency
store and result cache), ``order`` (per-session order), ``runner``
(calling a tool) and ``output`` (shaping what it returned).
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import pydantic

from protocol import Call, ErrorKind, Result, SessionState, VerifyRequest, VerifyResult, new_call_id
from protocol.messages import ErrorInfo
from tool_server.config import Config
from tool_server.executor.admission import ANONYMOUS, ANONYMOUS_TENANT, Admission, Caller, Overloaded
from tool_server.executor.fair_slots import FairSlots
from tool_server.executor.gc_pacing import GcPacer
from tool_server.executor.order import SessionOrder, Turn
from tool_server.executor.output import OutputShaper
from tool_server.executor.records import CallRecords, Fingerprint, canonical_arguments, storable
from tool_server.executor.runner import CallRunner, cancelled, tool_failure
from tool_server.metrics import Metrics
from tool_server.registry import VERIFIER_PREFIX, Registry, ToolEntry
from tool_server.schema import format_validation_error
from tool_server.sessions import SessionStore

__all__ = [
    "ANONYMOUS",
    "Caller",
    "Executor",
    "Overloaded",
    "to_verify_result",
    "unknown_tool_message",
]

log = logging.getLogger(__name__)


class Executor:
    def __init__(self, registry: Registry, config: Config, metrics: Metrics | None = None) -> None:
        self.registry = registry
        self.config = config
        self.metrics = metrics or Metrics()
        limits = config.limits
        self._admission = Admission(limits)
        self.running = 0
        self._slots = FairSlots(limits.max_concurrency)
        self._tool_slots: dict[str, FairSlots] = {}  # tools with a limit of their own
        self._records = CallRecords(config, self.metrics)
        self._order = SessionOrder()
        self.sessions = SessionStore(
            config.sessions.ttl_s,
            config.sessions.max_sessions,
            config.sessions.max_sessions_per_tenant,
            sole_tenant=ANONYMOUS_TENANT,
        )
        self._runner = CallRunner(self.sessions, OutputShaper(limits), limits, self.run_inner)
        self._stats = self.metrics.tool_stats.for_tool  # a bound method: looked up once
        self._sweeper: asyncio.Task[None] | None = None
        self._store_sweeper: asyncio.Task[None] | None = None

    @property
    def capacity(self) -> int:
        return self._admission.capacity

    @property
    def tenant_share(self) -> int:
        return self._admission.tenant_share

    @property
    def admitted(self) -> int:
        """Admitted calls not yet finished (running + waiting)."""
        return self._admission.admitted

    @property
    def results_stored(self) -> int:
        """Results kept for idempotent retries since start."""
        return self._records.results_stored

    @property
    def gc_pacer(self) -> GcPacer:
        """Paces young-generation collections by the objects left for them (``gc_pacing``)."""
        return self._records.pacer

    def store_sizes(self) -> dict[str, tuple[int, int]]:
        """(entries, estimated bytes) of the idempotency store and the result cache."""
        return self._records.sizes()

    def tool_gauges(self) -> dict[str, dict[str, float]]:
        """What tools with a ``gauges()`` method report about themselves, by tool name."""
        figures: dict[str, dict[str, float]] = {}
        for entry in self.registry.entries.values():
            gauges = getattr(entry.instance, "gauges", None)
            if gauges is None:
                continue
            try:
                figures[entry.name] = dict(gauges())
            except Exception:  # a tool's report must not break /metrics
                log.exception("gauges() of tool %s failed", entry.name)
        return figures

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start tools (load indexes, warm pools) and the session sweeper."""
        for entry in self.registry.entries.values():
            if entry.meta.max_concurrency:
                self._tool_slots[entry.name] = FairSlots(entry.meta.max_concurrency)
        started: set[int] = set()
        for entry in self.registry.entries.values():
            startup = getattr(entry.instance, "startup", None)
            if startup is not None and id(entry.instance) not in started:
                started.add(id(entry.instance))
                outcome = startup()
                if asyncio.iscoroutine(outcome):
                    await outcome
        self._sweeper = asyncio.create_task(self.sessions.run_sweeper(self.config.sessions.sweep_interval_s))
        self._store_sweeper = asyncio.create_task(self._sweep_stores())

    async def _sweep_stores(self) -> None:
        """Expired results leave on time, not at the next put: an idle server gives them back."""
        interval = self._records.sweep_interval_s()
        while True:
            await asyncio.sleep(interval)
            self._records.sweep()

    async def stop(self) -> None:
        for sweeper in (self._sweeper, self._store_sweeper):
            if sweeper is not None:
                sweeper.cancel()
        await self.sessions.close_all()
        seen: set[int] = set()
        for entry in self.registry.entries.values():
            shutdown = getattr(entry.instance, "shutdown", None)
            if shutdown is None or id(entry.instance) in seen:
                continue
            seen.add(id(entry.instance))
            try:
                outcome = shutdown()
                if asyncio.iscoroutine(outcome):
                    await outcome
            except Exception:
                log.exception("shutdown of tool %s failed", entry.name)

    async def drain(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) for admitted calls to finish: graceful shutdown."""
        with anyio.move_on_after(timeout_s):
            while self.admitted:
                await asyncio.sleep(0.05)

    # ----------------------------------------------------------------- entry points
    async def run_batch(self, calls: Sequence[Call], caller: Caller = ANONYMOUS) -> list[Result]:
        """Run many calls concurrently; one result per call, in order."""
        return await self._run_batch(calls, caller, None)

    async def _run_batch(
        self, calls: Sequence[Call], caller: Caller, prepared: Sequence[dict[str, Any]] | None
    ) -> list[Result]:
        self._admission.check_batch(caller.tenant, len(calls))
        start = self._start
        if prepared is None:
            results: list[Any] = [start(call, caller) for call in calls]
        else:
            results = [
                start(call, caller, False, kwargs) for call, kwargs in zip(calls, prepared, strict=True)
            ]
        pending = [i for i, outcome in enumerate(results) if not isinstance(outcome, Result)]
        for i in pending:
            results[i] = await results[i]
        if pending:
            # Awaiting a task that was already done resumed this coroutine before that task's
            # bookkeeping (_settle, a done-callback already queued) ran: let it run, so its
            # admission and session turn are given back before the caller goes on.
            await asyncio.sleep(0)
        return results

    async def run_one(self, call: Call, caller: Caller = ANONYMOUS) -> Result:
        refusal = self._admission.refusal(caller.tenant)
        if refusal is not None:
            return Result.failure(call.call_id, ErrorKind.OVERLOADED, refusal)
        outcome = self._start(call, caller)
        return outcome if isinstance(outcome, Result) else await outcome

    async def run_inner(self, call: Call, caller: Caller, lent: SessionState | None = None) -> Result:
        """An agent tool's inner call: same checks, but no global slot (avoids self-deadlock).

        ``lent``: the agent call's throwaway session, which the inner call runs in.
        """
        outcome = self._start(call, caller, inner=True, lent=lent)
        return outcome if isinstance(outcome, Result) else await outcome

    async def verify_batch(
        self, requests: Sequence[VerifyRequest], caller: Caller = ANONYMOUS
    ) -> list[VerifyResult]:
        calls, prepared = [], []
        for request in requests:
            entry = self.registry.entries.get(VERIFIER_PREFIX + request.verifier)
            # The arguments are only the call's fingerprint here: the decoded request goes to
            # the verifier as it is (one typed path, no second validation).
            arguments = {k: v for k, v in vars(request).items() if k != "verifier"}
            calls.append(
                Call(request.request_id or new_call_id(), VERIFIER_PREFIX + request.verifier, arguments)
            )
            param = entry.request_param if entry is not None else None
            prepared.append({param: request} if param else {})
        results = await self._run_batch(calls, caller, prepared)
        return [to_verify_result(r, q.request_id) for r, q in zip(results, requests, strict=True)]

    # ----------------------------------------------------------------- internals
    def _start(
        self,
        call: Call,
        caller: Caller,
        inner: bool = False,
        prepared: dict[str, Any] | None = None,
        lent: SessionState | None = None,
    ) -> Result | asyncio.Future[Result]:
        """Answer from storage, reject, or start the call: a Result now, or a future of one.

        ``prepared``: keyword arguments already decoded and checked (a verify request).
        """
        call_id = call.call_id
        # Permission first: what a token may not call, it may not replay or join either. A tool
        # outside a scoped token's toolsets is unknown to it, as on /mcp: the answer must not
        # tell it which other tools exist.
        entry = self.registry.entries.get(call.name)
        allowed = caller.allowed
        if entry is None or (allowed is not None and entry.name not in allowed):
            names = (n for n in self.registry.entries if allowed is None or n in allowed)
            message = unknown_tool_message(call.name, names, in_session=call.session is not None)
            return Result.failure(call_id, ErrorKind.UNKNOWN_TOOL, message)
        session = call.session
        if session is None:
            if entry.needs_session:
                return Result.failure(
                    call_id,
                    ErrorKind.BAD_REQUEST,
                    f"{call.name} acts on a session's world: send a session id with the call "
                    f"('session' on /v1/calls, _meta['toolfactory/session'] on MCP), or, from an MCP "
                    f"client that cannot set _meta, use a URL that names it: "
                    f"/mcp/{min(entry.toolsets) if entry.toolsets else '<toolset>'}/s/<session>",
                )
        elif prepared is None and entry.is_verifier:
            # A verifier called as a tool from a session (a trajectory's calls all carry its
            # session) would show the policy its own gold. Verify requests come with
            # ``prepared``; a sessionless tool call (an evaluation harness) may still score.
            return Result.failure(call_id, ErrorKind.UNAUTHORIZED, verifier_in_session_message(call.name))
        canonical = canonical_arguments(call.arguments)
        fingerprint: Fingerprint = hash((call.name, session, canonical))
        key = caller.key_prefix + call_id
        records = self._records
        earlier = records.earlier(key, call_id, fingerprint)
        if earlier is not None:
            return earlier
        try:
            kwargs = dict(prepared) if prepared else entry.validate(call.arguments)
        except pydantic.ValidationError as exc:
            return Result.failure(
                call_id,
                ErrorKind.INVALID_ARGUMENTS,
                f"invalid arguments for {call.name}: {format_validation_error(exc)}",
            )
        except (ValueError, TypeError) as exc:
            return Result.failure(
                call_id, ErrorKind.INVALID_ARGUMENTS, f"invalid arguments for {call.name}: {exc}"
            )
        except Exception as exc:  # a bug in the tool's own argument checks (pydantic passes it on)
            return tool_failure(call, exc)
        cache_key = None
        if entry.meta.cacheable:
            cache_key = records.cache_key(caller.tenant, entry, canonical)
            if cache_key is not None:
                hit = records.cached(cache_key, call_id)
                if hit is not None:
                    return hit
        if entry.inline:  # final here and now: nothing in flight to settle, no turn, no slot
            result = self._runner.run_inline(call, entry, caller, kwargs, lent)
            error = result.error
            records.keep(key, fingerprint, cache_key, result, error is None or storable(result))
            self._stats(entry.name).record(
                "ok" if error is None else error.kind.value, result.elapsed_ms / 1000.0
            )
            return result
        session_key: tuple[str, str] | None = None
        held = session
        if held is None and prepared is not None and entry.request_param is not None:
            held = prepared[entry.request_param].session  # a verify request names it there
        if held is not None:
            # Until the call ends (_settle), however long it waits or runs, its session is
            # not swept as idle.
            session_key = (caller.tenant, held)
            self.sessions.call_began(session_key)
        turn = None
        if entry.meta.stateful and session is not None and not inner:
            # Inner calls run inside their parent's turn: queueing them behind it would deadlock.
            turn = self._order.take(session_key)
        ticket = _Ticket(call, entry, caller, key, fingerprint, cache_key, inner, turn, lent, session_key)
        if not inner:
            self._admission.take(caller.tenant)
        start = time.perf_counter()
        task = asyncio.get_running_loop().create_task(self._execute(ticket, kwargs, start))
        # A callback, not a finally: it runs however the task ends, even cancelled before
        # its first step (then no line of _execute ever runs). It runs soon after the task
        # ends, but a caller awaiting a task that is already done resumes before it: so
        # _execute times its own result.
        task.add_done_callback(functools.partial(self._settle, ticket, start))
        records.running(key, fingerprint)
        return task

    async def _execute(self, ticket: _Ticket, kwargs: dict[str, Any], start: float) -> Result:
        # Each wait comes before the slot it guards: waiting must not hold a slot.
        if ticket.turn is not None:
            await ticket.turn.wait()
        tool_slots = self._tool_slots.get(ticket.entry.name)
        if tool_slots is None:
            result = await self._in_slot(ticket, kwargs)
        else:
            await tool_slots.acquire(ticket.caller.tenant)
            try:
                result = await self._in_slot(ticket, kwargs)
            finally:
                tool_slots.release()
        result.elapsed_ms = (time.perf_counter() - start) * 1000.0
        return result

    async def _in_slot(self, ticket: _Ticket, kwargs: dict[str, Any]) -> Result:
        """Run the call in one of the global slots (inner calls run in their parent's)."""
        if ticket.inner:
            return await self._runner.run(ticket.call, ticket.entry, ticket.caller, kwargs, ticket.lent)
        await self._slots.acquire(ticket.caller.tenant)
        self.running += 1
        try:
            return await self._runner.run(ticket.call, ticket.entry, ticket.caller, kwargs, None)
        finally:
            self.running -= 1
            self._slots.release()

    def _settle(self, ticket: _Ticket, start: float, task: asyncio.Task[Result]) -> None:
        """The call's task has ended: restart its session's TTL and pass its turn on, give
        back its admission, keep and count its result, and hand that to the retries that
        joined it."""
        if ticket.session_key is not None:
            self.sessions.call_ended(ticket.session_key)
        if ticket.turn is not None:
            ticket.turn.end()
        if not ticket.inner:
            self._admission.give_back(ticket.caller.tenant)
        if task.cancelled():
            result, store, elapsed = cancelled(ticket.call), False, time.perf_counter() - start
        elif (error := task.exception()) is not None:  # a bug of ours: the caller's await raises it
            log.error(
                "call %s of %s failed in the executor", ticket.call.call_id, ticket.entry.name, exc_info=error
            )
            result, store, elapsed = cancelled(ticket.call), False, time.perf_counter() - start
        else:
            result = task.result()
            store, elapsed = storable(result), result.elapsed_ms / 1000.0  # timed in _execute
        result.elapsed_ms = elapsed * 1000.0
        self._records.settle(ticket.key, ticket.fingerprint, ticket.cache_key, result, store)
        error = result.error
        self._stats(ticket.entry.name).record("ok" if error is None else error.kind.value, elapsed)


@dataclass(slots=True)
class _Ticket:
    """One admitted call and what its result will be kept under."""

    call: Call
    entry: ToolEntry
    caller: Caller
    key: str  # where the idempotency store keeps it (Caller.key_prefix + call_id)
    fingerprint: Fingerprint
    cache_key: Any
    inner: bool
    turn: Turn | None = None
    lent: SessionState | None = None  # an inner call's: its agent call's throwaway session
    session_key: tuple[str, str] | None = None  # (tenant, session id): counted in flight


def unknown_tool_message(name: str, names: Iterable[str], *, in_session: bool = False) -> str:
    """Say that ``name`` is unknown and hint at the tools the caller can see.

    No hint ``in_session``: a trajectory learns tool names from its task, and the server
    cannot tell which ones it has been shown (BFCL miss_func holds some back for later
    turns; verifiers and other toolsets are not its to find).
    """
    if in_session:
        return f"no tool named {name!r} is available to you; call only the tools you were given"
    names = sorted(names)
    # The closest names by spelling: a shared first three letters picked the first five of the
    # verifiers ("verify_...") for a typo in one and could leave the meant one out.
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.6) or names[:10]
    return f"no tool named {name!r}; available tools include: {', '.join(close) or 'none'}"


def verifier_in_session_message(name: str) -> str:
    return (
        f"{name} is a verifier: it cannot be called as a tool inside a session (a trajectory would "
        "read its own gold); score a trajectory with POST /v1/verify, passing its session in the request"
    )


def to_verify_result(result: Result, request_id: str | None) -> VerifyResult:
    if result.is_error or not isinstance(result.structured, dict):
        error = result.error or ErrorInfo(ErrorKind.TOOL_ERROR, "verifier returned no score")
        return VerifyResult(0.0, {}, {}, request_id, True, error)
    data = result.structured
    try:
        score = float(data.get("score", 0.0))
    except (TypeError, ValueError):
        return VerifyResult(
            0.0, {}, {}, request_id, True, ErrorInfo(ErrorKind.TOOL_ERROR, "score is not a number")
        )
    return VerifyResult(score, data.get("components") or {}, data.get("details") or {}, request_id)
