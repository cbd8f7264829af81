"""Running one call's tool: its arguments and session, its timeout, and every failure as a Result.

Async tools run on the event loop under the call's timeout, which cancels the coroutine.
Blocking sync tools run in worker threads and are abandoned on timeout (hard-to-stop
work belongs in a subprocess): the thread runs on, holding its thread-pool token, and the
next call of its session may start while it does. Non-blocking sync tools run on the event loop: inline
(``run_inline``) where nothing else is needed, or in the call's task after its turn.
Whatever a tool raises, even ``SystemExit``, ends as an error result.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from protocol import Call, ErrorKind, Result, SessionState, ToolError, VerifyRequest, new_call_id
from tool_server.executor.admission import ANONYMOUS_TENANT, Caller
from tool_server.executor.output import OutputShaper
from tool_server.registry import ToolEntry
from tool_server.sessions import SessionStore

__all__ = ["CallContext", "CallRunner", "cancelled", "tool_failure"]

log = logging.getLogger(__name__)
INLINE_WARN_S = 0.2  # a non-blocking tool that takes longer than this is reported (once)

# An agent tool's inner call, with the session object it lends (a throwaway one) or None.
RunInner = Callable[[Call, Caller, SessionState | None], Awaitable[Result]]


class CallContext:
    """The ToolContext handed to tools that ask for one.

    Inner calls run in the same session: a stored one by its id, a throwaway one (not in
    the session store, so not to be opened by id) lent as it is.
    """

    __slots__ = ("_run_inner", "_caller", "_throwaway", "call_id", "session")

    def __init__(
        self, run_inner: RunInner, call_id: str, session: SessionState | None, caller: Caller, throwaway: bool
    ) -> None:
        self._run_inner = run_inner
        self._caller = caller
        self._throwaway = throwaway
        self.call_id = call_id
        self.session = session

    @property
    def sees_gold(self) -> bool:
        """Whether the caller may see gold values (``Caller.sees_gold``): a verifier leaves
        them out of its details otherwise."""
        return self._caller.sees_gold

    @property
    def tenant(self) -> str | None:
        """The caller's tenant, for a tool that shares a budget between tenants (the python
        tool's interpreters); None for a server without tokens or the server's own calls."""
        tenant = self._caller.tenant
        return None if tenant == ANONYMOUS_TENANT else tenant

    async def call(self, name: str, arguments: dict[str, Any]) -> Result:
        if self._throwaway:
            return await self._run_inner(Call(new_call_id(), name, arguments), self._caller, self.session)
        inner = Call(new_call_id(), name, arguments, self.session.id if self.session else None)
        return await self._run_inner(inner, self._caller, None)


class CallRunner:
    """Calls tools for the executor, which has admitted the call and holds its slots."""

    __slots__ = ("sessions", "shaper", "max_timeout_s", "_threads", "_run_inner", "_overran")

    def __init__(
        self, sessions: SessionStore, shaper: OutputShaper, limits: Any, run_inner: RunInner
    ) -> None:
        self.sessions = sessions
        self.shaper = shaper
        self.max_timeout_s = limits.max_timeout_s
        self._threads = anyio.CapacityLimiter(limits.thread_pool_size)
        self._run_inner = run_inner  # what a tool's ToolContext.call goes through
        self._overran: set[str] = set()  # non-blocking tools reported for overrunning

    def run_inline(
        self, call: Call, entry: ToolEntry, caller: Caller, kwargs: dict[str, Any], lent: SessionState | None
    ) -> Result:
        """A bounded, non-blocking sync tool called right here, without a task or thread: its
        result, timed (``elapsed_ms``).

        Same steps as ``run`` (``_prepare``, the tool, output shaping), less the timer:
        a timeout cannot stop sync code on the event loop, so a tool that overruns is
        reported: it should not be marked non-blocking.
        """
        start = time.perf_counter()
        try:
            if call.session is not None or entry.context_param is not None or entry.request_param is not None:
                kwargs, _ = self._prepare(call, entry, caller, kwargs, lent)
            result = self.shaper.to_result(call.call_id, entry.func(**kwargs))
        except ToolError as exc:
            result = Result.failure(call.call_id, exc.kind, exc.message)
        except BaseException as exc:  # noqa: BLE001 (SystemExit from a tool must not stop the server)
            result = tool_failure(call, exc)
        elapsed = time.perf_counter() - start
        result.elapsed_ms = elapsed * 1000.0
        if elapsed > INLINE_WARN_S and entry.name not in self._overran:
            self._overran.add(entry.name)  # once per tool: a GC pause can look like an overrun
            log.warning(
                "tool %s is marked blocking=False but took %.0f ms on the event loop; mark it blocking",
                entry.name,
                elapsed * 1000,
            )
        return result

    async def run(
        self, call: Call, entry: ToolEntry, caller: Caller, kwargs: dict[str, Any], lent: SessionState | None
    ) -> Result:
        """Call the tool under its timeout; a Result whatever happens, unless cancelled.

        ``lent``: the throwaway session of the agent call this inner call comes from. A
        stateful call with neither that nor a session id gets a throwaway one of its own.
        """
        ephemeral = None
        if lent is None and entry.meta.stateful and call.session is None:
            ephemeral = SessionState(new_call_id())
        session: SessionState | None = None
        try:
            kwargs, session = self._prepare(call, entry, caller, kwargs, lent or ephemeral)
            timeout = min(entry.meta.timeout_s, self.max_timeout_s)
            if entry.upstream is not None:  # the session carries per-trajectory upstream state
                return self.shaper.checked(await entry.func(call, timeout, session, caller.tenant))
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
            return self.shaper.to_result(call.call_id, output)
        except ToolError as exc:
            return Result.failure(call.call_id, exc.kind, exc.message)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 (a tool's fault, even SystemExit, is a result)
            log.debug("tool %s failed", entry.name, exc_info=True)
            return tool_failure(call, exc)
        finally:
            if ephemeral is not None and session is ephemeral:
                await _close_quietly(ephemeral, entry)

    def _prepare(
        self,
        call: Call,
        entry: ToolEntry,
        caller: Caller,
        kwargs: dict[str, Any],
        fallback: SessionState | None,
    ) -> tuple[dict[str, Any], SessionState | None]:
        """The tool's keyword arguments and its session, built the same way on every path.

        The session is the call's (or, for a verifier, the request's), opened for the
        caller's tenant: another tenant's or a released id raises ``unknown_session``.
        """
        request: VerifyRequest | None = kwargs[entry.request_param] if entry.request_param else None
        session_id = call.session or (request.session if request is not None else None)
        session = self.sessions.open(caller.tenant, session_id) if session_id else fallback
        if entry.context_param is not None:
            throwaway = session is not None and session is fallback
            kwargs[entry.context_param] = CallContext(
                self._run_inner, call.call_id, session, caller, throwaway
            )
        return kwargs, session


async def _close_quietly(session: SessionState, entry: ToolEntry) -> None:
    """Close a call's throwaway session; a cleanup that fails is logged, the result stands."""
    try:
        await session.close()
    except Exception:
        log.exception("closing the throwaway session of a %s call failed", entry.name)


def cancelled(call: Call) -> Result:
    return Result.failure(
        call.call_id,
        ErrorKind.CANCELLED,
        "the call was cancelled (its caller went away, or the server stopped)",
    )


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


def tool_failure(call: Call, exc: BaseException) -> Result:
    """A tool's exception as a ``tool_error`` result, whatever the exception does when printed."""
    if isinstance(exc, _EscapedFromThread):
        exc = exc.original
    try:
        message = f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ fails is still the tool's fault
        message = type(exc).__name__
    return Result.failure(call.call_id, ErrorKind.TOOL_ERROR, message)


def _timed_out(call: Call, entry: ToolEntry, timeout: float) -> Result:
    return Result.failure(
        call.call_id, ErrorKind.TIMEOUT, f"{entry.name} did not finish within {timeout:g} s and was cancelled"
    )
