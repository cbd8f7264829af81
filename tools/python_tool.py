"""The ``python`` tool: a stateful, sandboxed interpreter per trajectory.

Each session (trajectory) gets its own warm worker from a :class:`~tools.sandbox.SandboxPool`
on its first call and keeps it, so variables, imports and files persist across the
trajectory's calls and are invisible to every other session. When the session ends the
worker is killed and the pool has already started its replacement. Calls without a
session run in a throwaway worker. Workers are forked from a pre-warmed template process
that holds the interpreter and common modules (shared copy-on-write; see ``tools.sandbox``),
so a live session costs a few MB and starts in milliseconds (figures: bench/README.md).

What the model sees is what a REPL would show: stdout, stderr, the value of a trailing
expression, and the traceback of an exception (an error result it can learn from).
Sandbox violations never raise out of the tool: a timeout is ``ToolError(TIMEOUT)`` and a
dead interpreter (memory, CPU limit, crash, ``os._exit``) is ``ToolError(TOOL_ERROR)``,
each saying that the variables of earlier calls are gone.

Fleet budget: at most ``max_workers`` interpreters and ``max_total_memory_mb`` of their
memory across all sessions (what each session's processes and shared memory hold, as
measured from the host), and at most ``max_workers_per_tenant`` interpreters per tenant
(token; 3/4 of ``max_workers`` by default). Past a limit, the tenant's own idle sessions are
evicted least recently used first (their next call says so, once, as a ``TOOL_ERROR``; the
call after starts afresh): one tenant's sessions never evict another's. A new session that
finds no idle one of its tenant to evict gets ``ToolError(OVERLOADED)``. :meth:`PythonTool.gauges`
reports the fleet for /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio

from protocol import ErrorKind, SessionState, ToolContext, ToolError, ToolOutput, tool
from tools.sandbox import (
    SandboxError,
    SandboxLimits,
    SandboxOverloaded,
    SandboxPool,
    SandboxResult,
    SandboxWorker,
)

MAX_CODE_CHARS = 200_000
_PARTIAL_OUTPUT_CHARS = 2000  # output shown next to a timeout or crash message


@dataclass
class _Slot:
    """The worker of one session, and the lock that serialises the session's calls."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    worker: SandboxWorker | None = None


@tool(name="python", stateful=True, timeout_s=120, kind="program", idempotent=False)
class PythonTool:
    """Run Python 3 code in a sandboxed interpreter (no network). Variables persist between calls.

    The value of a final expression is shown, as in a REPL; use print() for everything else.
    """

    def __init__(
        self,
        pool_size: int = 4,
        memory_mb: int = 512,
        cpu_s: int = 10,
        timeout_s: float = 10.0,
        max_output_bytes: int = 16384,
        max_processes: int = 16,
        preload: list[str] | None = None,
        hidden_paths: list[str] | None = None,
        max_workers: int = 64,
        max_total_memory_mb: int = 8192,
        worker_cpu_s: int = 600,
        max_workers_per_tenant: int | None = None,
    ) -> None:
        self.limits = SandboxLimits(
            timeout_s=timeout_s,
            cpu_s=cpu_s,
            worker_cpu_s=worker_cpu_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_output_bytes=max_output_bytes,
        )
        self.pool_size = pool_size
        self.max_workers = max_workers
        self.max_total_memory_mb = max_total_memory_mb
        self.max_workers_per_tenant = max_workers_per_tenant
        self._preload = tuple(preload or ())
        self._hide = tuple(hidden_paths) if hidden_paths is not None else None
        self._pool: SandboxPool | None = None
        self._key = f"python-tool:{id(self)}"

    async def startup(self) -> None:
        """Start the pool (one worker now, the rest warming up in the background)."""
        if self._pool is None:
            self._pool = SandboxPool(
                self.pool_size,
                self.limits,
                preload=self._preload,
                hide=self._hide,
                max_workers=self.max_workers,
                max_total_memory_mb=self.max_total_memory_mb,
                max_workers_per_tenant=self.max_workers_per_tenant,
            )
        await self._pool.start()  # idempotent

    async def shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @property
    def isolation(self) -> dict[str, str]:
        """What confinement the workers got (network, filesystem, user, processes)."""
        return self._pool.isolation if self._pool is not None else {}

    def gauges(self) -> dict[str, float]:
        """Fleet figures for /metrics: live, idle and busy interpreters, memory, evictions, refusals."""
        if self._pool is not None:
            return self._pool.gauges()
        return SandboxPool(
            0, max_workers=self.max_workers, max_total_memory_mb=self.max_total_memory_mb
        ).gauges()

    async def __call__(
        self,
        code: Annotated[str, "Python source to run. A trailing expression's value is shown, like a REPL."],
        ctx: ToolContext,
    ) -> ToolOutput:
        """Run Python code; state persists across calls of the same trajectory."""
        if not isinstance(code, str):
            raise ToolError(f"code must be a string, got {type(code).__name__}", ErrorKind.INVALID_ARGUMENTS)
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(
                f"code has {len(code)} characters, over the limit {MAX_CODE_CHARS}",
                ErrorKind.INVALID_ARGUMENTS,
            )
        # The caller's tenant where the server has tokens (None: one tenant, or the server's own).
        tenant = getattr(ctx, "tenant", None)
        try:
            return await self._run(code, ctx.session if ctx is not None else None, tenant)
        except SandboxOverloaded as exc:
            raise ToolError(str(exc), ErrorKind.OVERLOADED) from None
        except SandboxError as exc:
            raise ToolError(str(exc), ErrorKind.UNAVAILABLE) from None

    async def _run(self, code: str, session: SessionState | None, tenant: str | None) -> ToolOutput:
        await self.startup()
        pool = self._pool
        assert pool is not None
        if session is None:
            async with pool.worker(tenant) as worker:
                return self._render(await worker.run(code), stateful=False)
        slot = self._slot(session, pool)
        async with slot.lock:
            if slot.worker is not None and not slot.worker.alive:
                lost, slot.worker = slot.worker, None
                await pool.release(lost)
                raise ToolError(_lost_between_calls(lost), ErrorKind.TOOL_ERROR)
            if slot.worker is None:
                slot.worker = await pool.acquire(tenant)  # a session belongs to one tenant
            result = await slot.worker.run(code)
            if result.worker_died:
                await pool.release(slot.worker)
                slot.worker = None
        return self._render(result, stateful=True)

    def _slot(self, session: SessionState, pool: SandboxPool) -> _Slot:
        slot = session.data.get(self._key)
        if slot is None:
            slot = session.data[self._key] = _Slot()

            async def release() -> None:
                async with slot.lock:
                    worker, slot.worker = slot.worker, None
                if worker is not None:
                    await pool.release(worker)

            session.on_close(release)
        return slot

    def _render(self, result: SandboxResult, *, stateful: bool) -> ToolOutput:
        if result.worker_died:
            lost = " Variables from earlier calls are gone." if stateful else ""
            message = f"{result.error}.{lost}"
            partial = (result.stdout + result.stderr)[-_PARTIAL_OUTPUT_CHARS:]
            if partial:
                message += f"\nOutput before it stopped (last {_PARTIAL_OUTPUT_CHARS} characters):\n{partial}"
            raise ToolError(message, ErrorKind.TIMEOUT if result.timed_out else ErrorKind.TOOL_ERROR)
        parts: list[str] = []
        if result.stdout:
            parts.append(result.stdout.rstrip("\n"))
        if result.stderr:
            parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
        if result.value is not None:
            parts.append(result.value)
        if result.error:
            parts.append(result.error.rstrip("\n"))
        elif result.exit_code:
            parts.append(f"[exit status {result.exit_code}]")
        if result.truncated:
            parts.append(f"[output truncated to {self.limits.max_output_bytes} bytes per stream]")
        structured: dict[str, Any] = {
            "stdout": result.stdout,
            "stderr": result.stderr,
            "value": result.value,
            "error": result.error,
            "exit_code": result.exit_code,
            "truncated": result.truncated,
        }
        text = "\n".join(parts) if parts else "(no output)"
        return ToolOutput([{"type": "text", "text": text}], structured, is_error=result.error is not None)


def _lost_between_calls(worker: SandboxWorker) -> str:
    """Why a session's interpreter is gone although its last call ended normally."""
    why = (
        f"was evicted: {worker.evicted}"
        if worker.evicted
        else f"was stopped: {worker.stopped_for}"
        if worker.stopped_for
        else "stopped between calls (it was killed from outside the session)"
    )
    return (
        f"This session's Python interpreter {why}. Its variables, imports and files are gone; "
        "the code was not run. Call again to run it in a fresh interpreter."
    )
