"""The executor: runs calls under limits, timeouts, idempotency, caching and truncation.

Every entry point (batch HTTP, MCP, verify, agent tools' inner calls) goes through
``Executor``, so the same guarantees hold everywhere:

* one result per call, never an exception: failures are ``Result.failure`` values;
* the caller's token is checked before anything is looked up: a tool it may not use is
  ``unauthorized`` whatever the call_id;
* a call_id seen before *from the same tenant* returns the stored result (or joins the
  running call) if the call is the same (tool, arguments, session); a different call
  under a used id is refused. Another tenant's call_id is just a new id;
* calls of stateful tools within one session run one at a time, in the order they
  arrive (batch order, then arrival order); different sessions run concurrently;
* a global concurrency limit with a bounded queue, plus optional per-tool limits;
  waiting calls get free slots round-robin across tenants, and one tenant may hold at
  most ``limits.max_admitted_per_tenant`` admitted calls, so no tenant's backlog
  delays or locks out another's calls;
* per-call timeouts that cancel the coroutine (sync tools run in worker threads
  and are abandoned on timeout: put hard-to-stop work in a subprocess);
* cacheable tools are answered from an LRU keyed by tenant, tool, version and arguments.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
import pydantic

from protocol import (
    Call,
    ErrorKind,
    Result,
    SessionState,
    ToolError,
    ToolOutput,
    VerifyRequest,
    VerifyResult,
    new_call_id,
)
from protocol.images import image_info
from protocol.messages import ErrorInfo
from tool_server.auth import ANONYMOUS_TENANT
from tool_server.config import Config, ConfigError
from tool_server.fair_slots import FairSlots
from tool_server.metrics import Metrics
from tool_server.registry import VERIFIER_PREFIX, Registry, ToolEntry
from tool_server.schema import format_validation_error
from tool_server.sessions import SessionStore
from tool_server.stores import TTLStore

log = logging.getLogger(__name__)
INLINE_WARN_S = 0.2  # a non-blocking tool that takes longer than this is reported (once)
TRUNCATION_MARKER = "\n…[output truncated: {dropped} of {total} characters omitted]"


class Overloaded(Exception):
    """A batch cannot be admitted: the queue is full. The HTTP layer answers 429."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call: the tenant owning its stored results and sessions, and what it may use.

    ``allowed`` is the set of tool names the caller's token may call (None: every tool).
    """

    tenant: str = ANONYMOUS_TENANT
    allowed: frozenset[str] | None = None


ANONYMOUS = Caller()
# (tool, session, hash of the canonical arguments): what a reused call_id must match.
Fingerprint = tuple[str, str | None, int]


class CallContext:
    """The ToolContext handed to tools that ask for one."""

    __slots__ = ("_executor", "_caller", "call_id", "session")

    def __init__(self, executor: Executor, call_id: str, session: SessionState | None, caller: Caller):
        self._executor = executor
        self._caller = caller
        self.call_id = call_id
        self.session = session

    async def call(self, name: str, arguments: dict[str, Any]) -> Result:
        inner = Call(new_call_id(), name, arguments, self.session.id if self.session else None)
        return await self._executor.run_inner(inner, self._caller)


class Executor:
    def __init__(self, registry: Registry, config: Config, metrics: Metrics | None = None) -> None:
        self.registry = registry
        self.config = config
        self.metrics = metrics or Metrics()
        limits = config.limits
        self.capacity = limits.max_concurrency + limits.max_queue
        self.admitted = 0  # admitted calls not yet finished (running + waiting)
        self.running = 0
        self.tenant_share = tenant_share(limits)
        self._admitted_by: dict[str, int] = {}  # tenant -> admitted calls not yet finished
        self._slots = FairSlots(limits.max_concurrency)
        self._tool_slots: dict[str, asyncio.Semaphore] = {}
        self._threads = anyio.CapacityLimiter(limits.thread_pool_size)
        # Keyed by (tenant, call_id): a tenant can only ever meet its own results.
        self._done: TTLStore[tuple[str, str], tuple[Fingerprint, Result]] = TTLStore(
            config.idempotency.max_entries, config.idempotency.ttl_s, config.idempotency.max_bytes
        )
        self._inflight: dict[tuple[str, str], tuple[Fingerprint, asyncio.Future[Result]]] = {}
        self._overran: set[str] = set()  # non-blocking tools reported for overrunning
        # (tenant, session) -> the end of its last stateful call: the next one waits for it.
        self._session_tails: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._cache: TTLStore[tuple[Any, ...], Result] | None = (
            TTLStore(config.cache.max_entries, config.cache.ttl_s, config.cache.max_bytes)
            if config.cache.enabled
            else None
        )
        self.sessions = SessionStore(config.sessions.ttl_s, config.sessions.max_sessions)
        self._sweeper: asyncio.Task[None] | None = None
        self.max_output_chars = limits.max_output_chars
        self.max_structured_bytes = limits.max_structured_bytes
        self.max_timeout_s = limits.max_timeout_s
        self.max_image_bytes = limits.max_image_bytes
        self.max_image_pixels = limits.max_image_pixels
        self.max_images = limits.max_images_per_result

    @property
    def results_stored(self) -> int:
        """Results kept for idempotent retries since start (each keeps ~10 objects alive)."""
        return self._done.puts_total

    def store_sizes(self) -> dict[str, tuple[int, int]]:
        """(entries, estimated bytes) of the idempotency store and the result cache."""
        sizes = {"idempotency": (len(self._done), self._done.bytes)}
        if self._cache is not None:
            sizes["cache"] = (len(self._cache), self._cache.bytes)
        return sizes

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
                self._tool_slots[entry.name] = asyncio.Semaphore(entry.meta.max_concurrency)
        started: set[int] = set()
        for entry in self.registry.entries.values():
            startup = getattr(entry.instance, "startup", None)
            if startup is not None and id(entry.instance) not in started:
                started.add(id(entry.instance))
                outcome = startup()
                if asyncio.iscoroutine(outcome):
                    await outcome
        self._sweeper = asyncio.create_task(self.sessions.run_sweeper(self.config.sessions.sweep_interval_s))

    async def stop(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
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
        if self.admitted + len(calls) > self.capacity:
            raise Overloaded(
                f"server busy: {self.admitted} calls admitted, capacity {self.capacity}; "
                f"retry this batch of {len(calls)} later with the same call_ids"
            )
        held = self._admitted_by.get(caller.tenant, 0)
        if held + len(calls) > self._share(caller.tenant):
            raise Overloaded(
                f"your token holds {held} admitted calls; one token may hold "
                f"{self._share(caller.tenant)} (limits.max_admitted_per_tenant); "
                f"retry this batch of {len(calls)} later with the same call_ids"
            )
        results: list[Any] = [None] * len(calls)
        pending: list[int] = []
        for i, call in enumerate(calls):
            outcome = self._start(call, caller, prepared=prepared[i] if prepared is not None else None)
            results[i] = outcome
            if not isinstance(outcome, Result):
                pending.append(i)
        for i in pending:
            results[i] = await results[i]
        return results

    async def run_one(self, call: Call, caller: Caller = ANONYMOUS) -> Result:
        if self.admitted >= self.capacity:
            return Result.failure(call.call_id, ErrorKind.OVERLOADED, "server busy: queue full; retry later")
        if self._admitted_by.get(caller.tenant, 0) >= self._share(caller.tenant):
            return Result.failure(
                call.call_id,
                ErrorKind.OVERLOADED,
                "your token holds as many admitted calls as one token may "
                f"({self._share(caller.tenant)}, limits.max_admitted_per_tenant); retry later",
            )
        outcome = self._start(call, caller)
        return outcome if isinstance(outcome, Result) else await outcome

    async def run_inner(self, call: Call, caller: Caller) -> Result:
        """An agent tool's inner call: same checks, but no global slot (avoids self-deadlock)."""
        outcome = self._start(call, caller, inner=True)
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
        self, call: Call, caller: Caller, inner: bool = False, prepared: dict[str, Any] | None = None
    ) -> Result | asyncio.Future[Result]:
        """Answer from storage, reject, or start the call: a Result now, or a future of one.

        ``prepared``: keyword arguments already decoded and checked (a verify request).
        """
        call_id = call.call_id
        # Permission first: what a token may not call, it may not replay or join either.
        entry = self.registry.entries.get(call.name)
        if entry is None:
            return Result.failure(
                call_id,
                ErrorKind.UNKNOWN_TOOL,
                unknown_tool_message(
                    call.name,
                    [n for n in self.registry.entries if caller.allowed is None or n in caller.allowed],
                ),
            )
        if caller.allowed is not None and entry.name not in caller.allowed:
            return Result.failure(
                call_id, ErrorKind.UNAUTHORIZED, f"your token is not allowed to call tool {call.name!r}"
            )
        if entry.needs_session and call.session is None:
            return Result.failure(
                call_id,
                ErrorKind.BAD_REQUEST,
                f"{call.name} acts on a session's world: send a session id with the call "
                f"('session' on /v1/calls, _meta['toolfactory/session'] on MCP)",
            )
        canonical = _canonical(call.arguments)
        fingerprint = (call.name, call.session, hash(canonical))
        key = (caller.tenant, call_id)
        done = self._done.get(key)
        if done is not None:
            if done[0] != fingerprint:
                return _reused(call_id)
            self.metrics.replays.inc()
            return done[1]
        running = self._inflight.get(key)
        if running is not None:
            if running[0] != fingerprint:
                return _reused(call_id)
            return asyncio.shield(running[1])
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
        cache_key = None
        if self._cache is not None and entry.meta.cacheable:
            # per tenant: a hit would tell one tenant what another asked (and when)
            cache_key = (caller.tenant, entry.name, entry.meta.version, canonical)
            hit = self._cache.get(cache_key)
            if hit is not None:
                self.metrics.cache_hits.inc()
                return dataclasses.replace(hit, call_id=call_id, cached=True, elapsed_ms=0.0)
        turn = None
        if entry.meta.stateful and call.session is not None and not inner:
            # Inner calls run inside their parent's turn: queueing them behind it would deadlock.
            turn = self._take_turn((caller.tenant, call.session))
        ticket = _Ticket(call, entry, caller, key, fingerprint, cache_key, inner, turn)
        if entry.inline:
            return self._run_inline(ticket, kwargs)
        if not inner:
            self.admitted += 1
            by = self._admitted_by
            by[caller.tenant] = by.get(caller.tenant, 0) + 1
        task = asyncio.get_running_loop().create_task(self._execute(ticket, kwargs, time.perf_counter()))
        self._inflight[key] = (fingerprint, task)
        return task

    def _take_turn(self, session_key: tuple[str, str]) -> _Turn:
        """A place at the end of the session's queue of stateful calls."""
        tails = self._session_tails
        turn = _Turn(tails.get(session_key), asyncio.get_running_loop().create_future())
        tails[session_key] = turn.finished

        def forget(finished: asyncio.Future[None]) -> None:
            if tails.get(session_key) is finished:  # nobody queued behind it
                del tails[session_key]

        turn.finished.add_done_callback(forget)
        return turn

    def _run_inline(self, ticket: _Ticket, kwargs: dict[str, Any]) -> Result:
        """The final call site of a bounded, non-blocking sync tool, without a task or thread.

        Same steps as the task path (``_prepare``, the tool, ``_to_result``, ``_record``);
        only the slot, the timer and the in-flight entry are left out, because the call
        finishes before anything else can run. A timeout cannot stop sync code on the event
        loop, so a tool that overruns is reported: it should not be marked non-blocking.
        """
        call, entry = ticket.call, ticket.entry
        start = time.perf_counter()
        try:
            kwargs, _ = self._prepare(ticket, kwargs, None)
            result = self._to_result(call.call_id, entry.func(**kwargs))
        except ToolError as exc:
            result = Result.failure(call.call_id, exc.kind, exc.message)
        except BaseException as exc:  # noqa: BLE001 (SystemExit from a tool must not stop the server)
            result = _tool_failure(call, exc)
        elapsed = time.perf_counter() - start
        if elapsed > INLINE_WARN_S and entry.name not in self._overran:
            self._overran.add(entry.name)  # once per tool: a GC pause can look like an overrun
            log.warning(
                "tool %s is marked blocking=False but took %.0f ms on the event loop; mark it blocking",
                entry.name,
                elapsed * 1000,
            )
        self._record(ticket, result, elapsed, store=_storable(result))
        return result

    def _prepare(
        self, ticket: _Ticket, kwargs: dict[str, Any], fallback: SessionState | None
    ) -> tuple[dict[str, Any], SessionState | None]:
        """The tool's keyword arguments and its session, built the same way on every path.

        The session is the call's (or, for a verifier, the request's), opened for the
        caller's tenant: another tenant's or a released id raises ``unknown_session``.
        """
        call, entry = ticket.call, ticket.entry
        request: VerifyRequest | None = kwargs[entry.request_param] if entry.request_param else None
        session_id = call.session or (request.session if request is not None else None)
        session = self.sessions.open(ticket.caller.tenant, session_id) if session_id else fallback
        if entry.context_param is not None:
            kwargs[entry.context_param] = CallContext(self, call.call_id, session, ticket.caller)
        return kwargs, session

    async def _execute(self, ticket: _Ticket, kwargs: dict[str, Any], start: float) -> Result:
        call = ticket.call
        try:
            if ticket.turn is not None:
                await ticket.turn.wait()  # before taking a slot: waiting must not hold one
            if ticket.inner:
                result = await self._limited(ticket, kwargs)
            else:
                await self._slots.acquire(ticket.caller.tenant)
                self.running += 1
                try:
                    result = await self._limited(ticket, kwargs)
                finally:
                    self.running -= 1
                    self._slots.release()
        except asyncio.CancelledError:
            self._finish(ticket, _cancelled(call), start, store=False)
            raise
        finally:
            if ticket.turn is not None:
                ticket.turn.end()
        self._finish(ticket, result, start, _storable(result))
        return result

    def _share(self, tenant: str) -> int:
        # A server without tokens has one tenant: it may fill the whole capacity.
        return self.capacity if tenant == ANONYMOUS_TENANT else self.tenant_share

    def _finish(self, ticket: _Ticket, result: Result, start: float, store: bool) -> None:
        self._inflight.pop(ticket.key, None)
        if not ticket.inner:
            self.admitted -= 1
            self._admitted_by[ticket.caller.tenant] -= 1
        self._record(ticket, result, time.perf_counter() - start, store)

    def _record(self, ticket: _Ticket, result: Result, elapsed: float, store: bool) -> None:
        """Time the result, keep it (idempotency store, result cache) and count it."""
        result.elapsed_ms = elapsed * 1000.0
        cache = ticket.cache_key is not None and not result.is_error
        size = _approx_bytes(result) if store or cache else 0
        if store:
            self._done.put(ticket.key, (ticket.fingerprint, result), size)
        if cache:
            self._cache.put(ticket.cache_key, result, size)  # type: ignore[union-attr]
        self.metrics.tool_stats.for_tool(ticket.entry.name).record(
            "ok" if result.error is None else result.error.kind.value, elapsed
        )

    async def _limited(self, ticket: _Ticket, kwargs: dict[str, Any]) -> Result:
        tool_slots = self._tool_slots.get(ticket.entry.name)
        if tool_slots is None:
            return await self._invoke(ticket, kwargs)
        async with tool_slots:
            return await self._invoke(ticket, kwargs)

    async def _invoke(self, ticket: _Ticket, kwargs: dict[str, Any]) -> Result:
        call, entry = ticket.call, ticket.entry
        ephemeral = SessionState(new_call_id()) if entry.meta.stateful and call.session is None else None
        session: SessionState | None = None
        try:
            kwargs, session = self._prepare(ticket, kwargs, ephemeral)
            if entry.upstream is not None:  # the session carries per-trajectory upstream state
                return self._checked(await entry.func(call, entry.meta.timeout_s, session))
            timeout = min(entry.meta.timeout_s, self.max_timeout_s)
            try:
                async with asyncio.timeout(timeout) as deadline:
                    if entry.is_async:
                        output = await entry.func(**kwargs)
                    elif not entry.meta.blocking:  # bounded work (a stateful one, after its turn)
                        output = entry.func(**kwargs)
                    else:
                        output = await anyio.to_thread.run_sync(
                            functools.partial(_in_thread, entry.func, kwargs),
                            limiter=self._threads,
                            abandon_on_cancel=True,
                        )
            except TimeoutError:
                if deadline.expired():
                    return _timed_out(call, entry, timeout)
                raise
            return self._to_result(call.call_id, output)
        except ToolError as exc:
            return Result.failure(call.call_id, exc.kind, exc.message)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 (a tool's fault, even SystemExit, is a result)
            log.debug("tool %s failed", entry.name, exc_info=True)
            return _tool_failure(call, exc)
        finally:
            if ephemeral is not None and session is ephemeral:
                await ephemeral.close()

    # ----------------------------------------------------------------- output shaping
    def _to_result(self, call_id: str, output: Any) -> Result:
        if type(output) is dict:  # the common case first
            structured, text = self._structured(output)
            return Result(call_id, [{"type": "text", "text": self._cap(text)}], structured)
        if isinstance(output, str):
            return Result(call_id, [{"type": "text", "text": self._cap(output)}])
        if isinstance(output, ToolOutput):
            content = [self._cap_block(b) for b in output.content]
            refused = self._image_problem(content)
            if refused is not None:
                return Result.failure(call_id, *refused)
            structured, text = self._structured(output.structured)
            if not content and structured is not None:
                content = [{"type": "text", "text": self._cap(text)}]
            error = ErrorInfo(ErrorKind.TOOL_ERROR, _text_of(content)) if output.is_error else None
            return Result(call_id, content, structured, output.is_error, error)
        if isinstance(output, Result):  # already shaped
            output.call_id = call_id
            return self._checked(output)
        if output is None:
            return Result(call_id, [{"type": "text", "text": ""}])
        if isinstance(output, VerifyResult):
            output = {"score": output.score, "components": output.components, "details": output.details}
        elif isinstance(output, int | float | bool | list):
            output = {"result": output}  # MCP structured content must be an object
        elif dataclasses.is_dataclass(output) and not isinstance(output, type):
            output = dataclasses.asdict(output)
        elif isinstance(output, pydantic.BaseModel):
            output = output.model_dump(mode="json")
        structured, text = self._structured(output)
        return Result(call_id, [{"type": "text", "text": self._cap(text)}], structured)

    def _structured(self, value: Any) -> tuple[Any, str]:
        """The structured output (or a note if it is too large) and its JSON text."""
        if value is None:
            return None, ""
        try:
            encoded = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:
            text = str(value)
            return {"note": "structured output was not JSON-serialisable and was dropped"}, text
        if len(encoded) > self.max_structured_bytes:
            note = f"structured output of {len(encoded)} bytes exceeded the limit and was dropped"
            return {"note": note}, encoded[: self.max_output_chars + 1].decode(errors="ignore")
        return value, encoded.decode()

    def _cap(self, text: str) -> str:
        limit = self.max_output_chars
        if len(text) <= limit:
            return text
        marker = TRUNCATION_MARKER.format(dropped=len(text) - limit, total=len(text))
        return text[:limit] + marker

    def _cap_block(self, block: dict[str, Any]) -> dict[str, Any]:
        if block.get("type") == "text" and len(block.get("text", "")) > self.max_output_chars:
            return {**block, "text": self._cap(block["text"])}
        return block

    def _checked(self, result: Result) -> Result:
        """A shaped result (an upstream server's, a tool's own) as it is, or why its images may not go out."""
        refused = self._image_problem(result.content)
        return result if refused is None else Result.failure(result.call_id, *refused)

    def _image_problem(self, content: list[dict[str, Any]]) -> tuple[ErrorKind, str] | None:
        """Why the result's images may not leave the server (None: they may, or there are none).

        Sizes come from each image's header (``protocol.images.image_info``): nothing is
        decoded. An image cannot be cut like text, so one over a limit fails the whole call.
        """
        images = [block for block in content if block.get("type") == "image"]
        if not images:
            return None
        if len(images) > self.max_images:
            return ErrorKind.TOO_LARGE, (
                f"the tool returned {len(images)} images; the limit is {self.max_images} per result "
                "(limits.max_images_per_result)"
            )
        for number, block in enumerate(images, 1):
            try:
                mime_type = block.get("mimeType")
                if not isinstance(mime_type, str):  # MCP requires it: clients pick the decoder by it
                    raise ValueError("the block has no mimeType")
                info = image_info(block.get("data"), mime_type)  # type: ignore[arg-type]
            except ValueError as exc:
                return ErrorKind.TOOL_ERROR, f"image {number} of the result is not a PNG or JPEG image: {exc}"
            what = f"image {number} of the result ({info.mime_type}, {info.width}x{info.height} px, {info.size} bytes)"
            if info.pixels > self.max_image_pixels:
                return ErrorKind.TOO_LARGE, (
                    f"{what} is over the limit of {self.max_image_pixels} pixels (limits.max_image_pixels); "
                    "return a smaller image or a crop"
                )
            if info.size > self.max_image_bytes:
                return ErrorKind.TOO_LARGE, (
                    f"{what} is over the limit of {self.max_image_bytes} bytes (limits.max_image_bytes); "
                    "return a smaller image or a crop"
                )
        return None


@dataclass(slots=True)
class _Ticket:
    """One admitted call and what its result will be kept under."""

    call: Call
    entry: ToolEntry
    caller: Caller
    key: tuple[str, str]  # (tenant, call_id) in the idempotency store
    fingerprint: Fingerprint
    cache_key: Any
    inner: bool
    turn: _Turn | None = None


class _Turn:
    """A stateful call's place in its session's queue: it runs once the call before it ended.

    ``end`` passes the turn on. A call cancelled while still waiting passes it on only
    when its own predecessor ends, so the order holds across cancellations.
    """

    __slots__ = ("previous", "finished")

    def __init__(self, previous: asyncio.Future[None] | None, finished: asyncio.Future[None]) -> None:
        self.previous = previous
        self.finished = finished

    async def wait(self) -> None:
        if self.previous is not None and not self.previous.done():
            await asyncio.shield(self.previous)

    def end(self) -> None:
        if self.previous is None or self.previous.done():
            _resolve(self.finished)
        else:
            self.previous.add_done_callback(lambda _: _resolve(self.finished))


def tenant_share(limits: Any) -> int:
    """Admitted calls one token may hold: the configured share, or 3/4 of the capacity.

    3/4 by default: a busy tenant still gets most of the queue (batches as large as before
    fit), while a quarter stays open to the other tenants however much one of them posts.
    """
    capacity = limits.max_concurrency + limits.max_queue
    share = limits.max_admitted_per_tenant
    if share is not None and share < 1:
        raise ConfigError(f"limits.max_admitted_per_tenant must be at least 1 (or null), got {share}")
    return min(capacity, share) if share is not None else max(1, capacity * 3 // 4)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _canonical(arguments: dict[str, Any]) -> bytes:
    """Arguments as canonical JSON (sorted keys): the cache key and the call fingerprint."""
    try:
        return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # only an agent tool's inner call can carry non-JSON values
        return repr(sorted(arguments.items(), key=lambda kv: kv[0])).encode()


def unknown_tool_message(name: str, names: Iterable[str]) -> str:
    """Say that ``name`` is unknown and hint at the tools the caller can see."""
    names = sorted(names)
    close = [n for n in names if n.lower().startswith(name.lower()[:3])][:5] or names[:10]
    return f"no tool named {name!r}; available tools include: {', '.join(close) or 'none'}"


class _EscapedFromThread(Exception):
    """A BaseException (SystemExit, GeneratorExit, ...) a tool raised in a worker thread.

    Handed back to the event loop as it is, it would be thrown into the task's coroutine
    stack, where GeneratorExit closes every frame it passes (skipping their except
    clauses) and SystemExit stops the loop. Wrapped, it is an ordinary tool failure.
    """

    def __init__(self, original: BaseException) -> None:
        super().__init__(original)
        self.original = original


def _in_thread(func: Any, kwargs: dict[str, Any]) -> Any:
    try:
        return func(**kwargs)
    except Exception:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise _EscapedFromThread(exc) from None


def _tool_failure(call: Call, exc: BaseException) -> Result:
    """A tool's exception as a ``tool_error`` result, whatever the exception does when printed."""
    if isinstance(exc, _EscapedFromThread):
        exc = exc.original
    try:
        message = f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ fails is still the tool's fault
        message = type(exc).__name__
    return Result.failure(call.call_id, ErrorKind.TOOL_ERROR, message)


def _storable(result: Result) -> bool:
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


def _timed_out(call: Call, entry: ToolEntry, timeout: float) -> Result:
    return Result.failure(
        call.call_id, ErrorKind.TIMEOUT, f"{entry.name} did not finish within {timeout:g} s and was cancelled"
    )


def _cancelled(call: Call) -> Result:
    return Result.failure(call.call_id, ErrorKind.CANCELLED, "the call was cancelled (server shutdown)")


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:
        return str(value)


def _text_of(content: Iterable[dict[str, Any]]) -> str:
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")


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
