"""The executor: runs calls under limits, timeouts, idempotency, caching and truncation.

Every entry point (batch HTTP, MCP, verify, agent tools' inner calls) goes through
``Executor``, so the same guarantees hold everywhere:

* one result per call, never an exception: failures are ``Result.failure`` values;
* a call_id seen before returns the stored result (or joins the running call);
* a global concurrency limit with a bounded queue, plus optional per-tool limits;
* per-call timeouts that cancel the coroutine (sync tools run in worker threads
  and are abandoned on timeout: put hard-to-stop work in a subprocess);
* cacheable tools are answered from an LRU keyed by tool, version and arguments.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Iterable, Sequence
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
from protocol.messages import ErrorInfo
from tool_server.config import Config
from tool_server.metrics import Metrics
from tool_server.registry import VERIFIER_PREFIX, Registry, ToolEntry
from tool_server.schema import format_validation_error
from tool_server.sessions import SessionStore
from tool_server.stores import TTLStore

log = logging.getLogger(__name__)
TRUNCATION_MARKER = "\n…[output truncated: {dropped} of {total} characters omitted]"


class Overloaded(Exception):
    """A batch cannot be admitted: the queue is full. The HTTP layer answers 429."""


class CallContext:
    """The ToolContext handed to tools that ask for one."""

    __slots__ = ("_executor", "_allowed", "call_id", "session")

    def __init__(
        self, executor: Executor, call_id: str, session: SessionState | None, allowed: set[str] | None
    ):
        self._executor = executor
        self._allowed = allowed
        self.call_id = call_id
        self.session = session

    async def call(self, name: str, arguments: dict[str, Any]) -> Result:
        inner = Call(new_call_id(), name, arguments, self.session.id if self.session else None)
        return await self._executor.run_inner(inner, self._allowed)


class Executor:
    def __init__(self, registry: Registry, config: Config, metrics: Metrics | None = None) -> None:
        self.registry = registry
        self.config = config
        self.metrics = metrics or Metrics()
        limits = config.limits
        self.capacity = limits.max_concurrency + limits.max_queue
        self.admitted = 0  # admitted calls not yet finished (running + waiting)
        self.running = 0
        self._slots = asyncio.Semaphore(limits.max_concurrency)
        self._tool_slots: dict[str, asyncio.Semaphore] = {}
        self._threads = anyio.CapacityLimiter(limits.thread_pool_size)
        self._done: TTLStore[str, tuple[str, Result]] = TTLStore(
            config.idempotency.max_entries, config.idempotency.ttl_s
        )
        self._inflight: dict[str, asyncio.Future[Result]] = {}
        self._cache: TTLStore[tuple[Any, ...], Result] | None = (
            TTLStore(config.cache.max_entries, config.cache.ttl_s) if config.cache.enabled else None
        )
        self.sessions = SessionStore(config.sessions.ttl_s, config.sessions.max_sessions)
        self._sweeper: asyncio.Task[None] | None = None
        self.max_output_chars = limits.max_output_chars
        self.max_structured_bytes = limits.max_structured_bytes
        self.max_timeout_s = limits.max_timeout_s

    @property
    def results_stored(self) -> int:
        """Results kept for idempotent retries since start (each keeps ~10 objects alive)."""
        return self._done.puts_total

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
    async def run_batch(self, calls: Sequence[Call], allowed: set[str] | None = None) -> list[Result]:
        """Run many calls concurrently; one result per call, in order."""
        if self.admitted + len(calls) > self.capacity:
            raise Overloaded(
                f"server busy: {self.admitted} calls admitted, capacity {self.capacity}; "
                f"retry this batch of {len(calls)} later with the same call_ids"
            )
        results: list[Any] = [None] * len(calls)
        pending: list[int] = []
        for i, call in enumerate(calls):
            outcome = self._start(call, allowed)
            results[i] = outcome
            if not isinstance(outcome, Result):
                pending.append(i)
        for i in pending:
            results[i] = await results[i]
        return results

    async def run_one(self, call: Call, allowed: set[str] | None = None) -> Result:
        if self.admitted >= self.capacity:
            return Result.failure(call.call_id, ErrorKind.OVERLOADED, "server busy: queue full; retry later")
        outcome = self._start(call, allowed)
        return outcome if isinstance(outcome, Result) else await outcome

    async def run_inner(self, call: Call, allowed: set[str] | None) -> Result:
        """An agent tool's inner call: same checks, but no global slot (avoids self-deadlock)."""
        outcome = self._start(call, allowed, inner=True)
        return outcome if isinstance(outcome, Result) else await outcome

    async def verify_batch(
        self, requests: Sequence[VerifyRequest], allowed: set[str] | None = None
    ) -> list[VerifyResult]:
        calls = []
        for request in requests:
            arguments = {
                "response": request.response,
                "messages": request.messages,
                "ground_truth": request.ground_truth,
                "arguments": request.arguments,
                "session": request.session,
                "response_start": request.response_start,
            }
            calls.append(
                Call(request.request_id or new_call_id(), VERIFIER_PREFIX + request.verifier, arguments)
            )
        results = await self.run_batch(calls, allowed)
        return [to_verify_result(r, q.request_id) for r, q in zip(results, requests, strict=True)]

    # ----------------------------------------------------------------- internals
    def _start(
        self, call: Call, allowed: set[str] | None, inner: bool = False
    ) -> Result | asyncio.Future[Result]:
        """Answer from storage, reject, or start the call: a Result now, or a future of one."""
        call_id = call.call_id
        done = self._done.get(call_id)
        if done is not None:
            self.metrics.replays.inc()
            if done[0] != call.name:
                return Result.failure(
                    call_id,
                    ErrorKind.BAD_REQUEST,
                    f"call_id {call_id!r} was already used for tool {done[0]!r}",
                )
            return done[1]
        running = self._inflight.get(call_id)
        if running is not None:
            return asyncio.shield(running)
        entry = self.registry.entries.get(call.name)
        if entry is None:
            return Result.failure(
                call_id, ErrorKind.UNKNOWN_TOOL, self._unknown_tool_message(call.name, allowed)
            )
        if allowed is not None and entry.name not in allowed:
            return Result.failure(
                call_id, ErrorKind.UNAUTHORIZED, f"your token is not allowed to call tool {call.name!r}"
            )
        try:
            kwargs = entry.validate(call.arguments)
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
            cache_key = (
                entry.name,
                entry.meta.version,
                orjson.dumps(call.arguments, option=orjson.OPT_SORT_KEYS),
            )
            hit = self._cache.get(cache_key)
            if hit is not None:
                self.metrics.cache_hits.inc()
                return dataclasses.replace(hit, call_id=call_id, cached=True, elapsed_ms=0.0)
        if entry.inline:
            return self._run_inline(call, entry, kwargs, cache_key)
        if not inner:
            self.admitted += 1
        task = asyncio.get_running_loop().create_task(
            self._execute(call, entry, kwargs, cache_key, inner, time.perf_counter())
        )
        self._inflight[call_id] = task
        return task

    def _run_inline(self, call: Call, entry: ToolEntry, kwargs: dict[str, Any], cache_key: Any) -> Result:
        """A bounded, non-blocking sync tool: run it right here, no task, thread or timer.

        Nothing is in flight and no slot was taken, so only the result is recorded; it is
        final (no timeout or cancellation can happen here), so it is always stored.
        """
        start = time.perf_counter()
        try:
            result = self._to_result(call.call_id, self._call_sync(call, entry, kwargs))
        except ToolError as exc:
            result = Result.failure(call.call_id, exc.kind, exc.message)
        except Exception as exc:
            result = Result.failure(call.call_id, ErrorKind.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
        self._record(call, entry, result, time.perf_counter() - start, cache_key, store=True)
        return result

    def _call_sync(self, call: Call, entry: ToolEntry, kwargs: dict[str, Any]) -> Any:
        if entry.request_param is not None:
            kwargs = {entry.request_param: kwargs.pop("__request__")}
        if entry.context_param is not None:
            session = self.sessions.get_or_create(call.session) if call.session else None
            kwargs[entry.context_param] = CallContext(self, call.call_id, session, None)
        return entry.func(**kwargs)

    def _unknown_tool_message(self, name: str, allowed: set[str] | None) -> str:
        names = [n for n in self.registry.entries if allowed is None or n in allowed]
        close = [n for n in names if n.lower().startswith(name.lower()[:3])][:5] or sorted(names)[:10]
        return f"no tool named {name!r}; available tools include: {', '.join(sorted(close))}"

    async def _execute(
        self, call: Call, entry: ToolEntry, kwargs: dict[str, Any], cache_key: Any, inner: bool, start: float
    ) -> Result:
        try:
            if inner:
                result = await self._limited(call, entry, kwargs)
            else:
                async with self._slots:
                    self.running += 1
                    try:
                        result = await self._limited(call, entry, kwargs)
                    finally:
                        self.running -= 1
        except asyncio.CancelledError:
            self._finish(call, entry, _cancelled(call), start, None, inner, store=False)
            raise
        # Transient failures (timeout, overload) are not stored: a retry should run again.
        store = result.error is None or result.error.kind in (
            ErrorKind.TOOL_ERROR,
            ErrorKind.INVALID_ARGUMENTS,
        )
        self._finish(call, entry, result, start, cache_key, inner, store)
        return result

    def _finish(
        self,
        call: Call,
        entry: ToolEntry,
        result: Result,
        start: float,
        cache_key: Any,
        inner: bool,
        store: bool,
    ) -> None:
        self._inflight.pop(call.call_id, None)
        if not inner:
            self.admitted -= 1
        self._record(call, entry, result, time.perf_counter() - start, cache_key, store)

    def _record(
        self, call: Call, entry: ToolEntry, result: Result, elapsed: float, cache_key: Any, store: bool
    ) -> None:
        """Time the result, keep it (idempotency store, result cache) and count it."""
        result.elapsed_ms = elapsed * 1000.0
        if store:
            self._done.put(call.call_id, (call.name, result))
        if cache_key is not None and not result.is_error:
            self._cache.put(cache_key, result)  # type: ignore[union-attr]
        self.metrics.tool_stats.for_tool(entry.name).record(
            "ok" if result.error is None else result.error.kind.value, elapsed
        )

    async def _limited(self, call: Call, entry: ToolEntry, kwargs: dict[str, Any]) -> Result:
        tool_slots = self._tool_slots.get(entry.name)
        if tool_slots is None:
            return await self._invoke(call, entry, kwargs)
        async with tool_slots:
            return await self._invoke(call, entry, kwargs)

    async def _invoke(self, call: Call, entry: ToolEntry, kwargs: dict[str, Any]) -> Result:
        session: SessionState | None = None
        ephemeral = False
        try:
            if call.session is not None:
                session = self.sessions.get_or_create(call.session)
            elif entry.meta.stateful:
                session, ephemeral = SessionState(new_call_id()), True
            if entry.upstream is not None:
                return await entry.func(call, entry.meta.timeout_s)
            if entry.request_param is not None:
                request: VerifyRequest = kwargs.pop("__request__")
                if request.session is not None and session is None:
                    session = self.sessions.get_or_create(request.session)
                kwargs = {entry.request_param: request}
            if entry.context_param is not None:
                kwargs[entry.context_param] = CallContext(self, call.call_id, session, None)
            timeout = min(entry.meta.timeout_s, self.max_timeout_s)
            try:
                async with asyncio.timeout(timeout) as deadline:
                    if entry.is_async:
                        output = await entry.func(**kwargs)
                    else:
                        output = await anyio.to_thread.run_sync(
                            functools.partial(entry.func, **kwargs),
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
        except Exception as exc:  # a tool's bug is a result, never a crash of the batch
            log.debug("tool %s failed", entry.name, exc_info=True)
            return Result.failure(call.call_id, ErrorKind.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            if ephemeral and session is not None:
                await session.close()

    # ----------------------------------------------------------------- output shaping
    def _to_result(self, call_id: str, output: Any) -> Result:
        if type(output) is dict:  # the common case first
            structured, text = self._structured(output)
            return Result(call_id, [{"type": "text", "text": self._cap(text)}], structured)
        if isinstance(output, str):
            return Result(call_id, [{"type": "text", "text": self._cap(output)}])
        if isinstance(output, ToolOutput):
            content = [self._cap_block(b) for b in output.content]
            structured, text = self._structured(output.structured)
            if not content and structured is not None:
                content = [{"type": "text", "text": self._cap(text)}]
            error = ErrorInfo(ErrorKind.TOOL_ERROR, _text_of(content)) if output.is_error else None
            return Result(call_id, content, structured, output.is_error, error)
        if isinstance(output, Result):  # upstream / already shaped
            output.call_id = call_id
            return output
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
