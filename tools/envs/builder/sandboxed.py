"""Generated tool code runs here: in confined sandbox workers, never in this process.

A call of a generated tool is one request to a ``SandboxWorker`` (``tools.sandbox``):
the source of ``runner.py`` as code, and on stdin a JSON request with the tool module's
source, the tool's name and arguments, and the tables the tool declared it reads or
writes, serialised from the session's ``World``. The reply is the output and the
records the call changed; ``SandboxExecutor.call`` applies those changes to the World
(only to tables the tool declared it writes) and returns the output, or raises the
tool's refusal as ``protocol.ToolError``. So the world never leaves the server as
anything but JSON, and nothing the generated code does reaches the server's memory.

Workers are reused for ``calls_per_worker`` calls: the runner is defined once per worker,
and each call loads the tool module afresh in a new namespace. Generated code could still
leave something behind in the interpreter (``sys.modules``, builtins, the runner itself),
which can only reach later calls of the same executor: give each pack its own
(``pack_executor``; ``load_built_pack`` does), and use ``calls_per_worker=1`` (a fresh
interpreter per call, ~15x slower) where calls must not see each other at all.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import json
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio.from_thread
import orjson

from protocol import ErrorKind, ToolError
from tools.envs.world import World
from tools.sandbox import SandboxLimits, SandboxWorker

__all__ = ["SandboxExecutor", "ToolSpec", "pack_executor"]

_RUNNER = Path(__file__).with_name("runner.py").read_text()  # defined once per worker, then called
_LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=5, memory_mb=512, max_output_bytes=4 << 20)
_KINDS = {"tool_error": ErrorKind.TOOL_ERROR, "invalid_arguments": ErrorKind.INVALID_ARGUMENTS}


class ToolSpec:
    """What the executor needs to know of a generated tool: its name and the tables it may use."""

    __slots__ = ("name", "reads", "writes")

    def __init__(self, name: str, reads: Sequence[str] = (), writes: Sequence[str] = ()) -> None:
        self.name = name
        self.reads = list(reads)
        self.writes = list(writes)

    def tables(self, world: World) -> list[str]:
        declared = set(self.reads) | set(self.writes)
        return sorted(declared) if declared else world.table_names()


class SandboxExecutor:
    """Runs generated tools in a few reusable sandbox workers; safe to call from any thread.

    The sandbox API is async (anyio); tools are called synchronously (``EnvTool.func``),
    so the executor keeps one event loop in a background thread (an anyio blocking portal)
    and hands each call to it. Raises ``SandboxError`` at the first call when no worker
    can start (the message says which confinement step failed).
    """

    def __init__(
        self, limits: SandboxLimits = _LIMITS, *, max_workers: int = 2, calls_per_worker: int = 64
    ) -> None:
        if max_workers < 1 or calls_per_worker < 1:
            raise ValueError("max_workers and calls_per_worker must be >= 1")
        self.limits = limits
        self.max_workers = max_workers
        self.calls_per_worker = calls_per_worker
        self._idle: queue.LifoQueue[SandboxWorker] = queue.LifoQueue()
        self._live = 0
        self._lock = threading.Lock()
        self._portal_cm: Any = None
        self._portal: Any = None
        self._uses: dict[int, int] = {}
        self.isolation: dict[str, str] = {}

    # -- requests ---------------------------------------------------------------------
    def request(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request to a worker; the runner's reply (``ok`` False with ``kind`` sandbox on a kill)."""
        worker = self._lease()
        keep = False
        try:
            result = self._portal_call(worker, json.dumps(payload))
            if result.worker_died or result.value is None:
                why = result.error or "the tool produced no reply"
                kind = "timeout" if result.timed_out else "sandbox"
                return {"ok": False, "kind": kind, "error": f"the sandbox stopped the tool: {why}"}
            if result.truncated:
                return {
                    "ok": False,
                    "kind": "crash",
                    "error": "the tool's reply is over the sandbox's size limit",
                }
            try:
                reply = json.loads(ast.literal_eval(result.value))
            except (ValueError, SyntaxError, TypeError):
                reply = None
            if not isinstance(reply, dict):  # the generated code tampered with the runner: drop the worker
                return {"ok": False, "kind": "crash", "error": "the sandbox's reply is malformed"}
            keep = True
            return reply
        finally:
            self._release(worker, keep)

    def call(self, source: str, spec: ToolSpec, world: World, arguments: Mapping[str, Any]) -> Any:
        """Run tool ``spec`` of module ``source`` on ``world``; apply its changes; return its output."""
        names = spec.tables(world)
        tables = {name: {key: world[name].peek(key) for key in world[name]} for name in names}
        try:
            tables = orjson.loads(orjson.dumps(tables))  # a built world's records are JSON data
        except TypeError as exc:
            raise ToolError(
                f"{spec.name}: the world's records are not JSON data: {exc}", ErrorKind.TOOL_ERROR
            ) from None
        payload = {
            "mode": "call",
            "source": source,
            "tool": spec.name,
            "arguments": dict(arguments),
            "tables": tables,
            "error_kinds": [kind.value for kind in ErrorKind],
        }
        reply = self.request(payload)
        if not reply.get("ok"):
            kind = reply.get("kind")
            message = str(reply.get("error", "the tool failed"))
            if kind == "timeout":
                raise ToolError(f"{spec.name}: {message}", ErrorKind.TIMEOUT)
            if kind in ("crash", "sandbox"):
                raise ToolError(f"{spec.name} failed: {message}", ErrorKind.TOOL_ERROR)
            raise ToolError(message, _KINDS.get(str(kind), ErrorKind.TOOL_ERROR))
        _apply(spec, world, reply.get("changes"))
        return reply.get("output")

    def parameters(self, source: str, names: Sequence[str]) -> dict[str, list[str]]:
        """Load ``source`` in a sandbox: each named function's parameter names. ValueError says what failed."""
        reply = self.request({"mode": "check", "source": source, "tools": list(names)})
        if not reply.get("ok"):
            raise ValueError(str(reply.get("error", "the module did not load")))
        return {str(k): list(v) for k, v in reply["parameters"].items()}

    def tool_func(self, source: str, spec: ToolSpec) -> Callable[..., Any]:
        """``func(world, **arguments)`` for an ``EnvTool``: each call runs in the sandbox."""

        def run(world: World, **arguments: Any) -> Any:
            return self.call(source, spec, world, arguments)

        run.__name__ = spec.name
        return run

    # -- workers ----------------------------------------------------------------------
    def _portal_call(self, worker: SandboxWorker, stdin: str) -> Any:
        with self._lock:
            if self._portal is None:
                self._portal_cm = anyio.from_thread.start_blocking_portal()
                self._portal = self._portal_cm.__enter__()
            portal = self._portal
            code = "_tf_main()" if id(worker) in self._uses else _RUNNER + "\n_tf_main()"
        return portal.call(lambda: worker.run(code, stdin=stdin))

    def _lease(self) -> SandboxWorker:
        while True:
            with contextlib.suppress(queue.Empty):
                worker = self._idle.get_nowait()
                if worker.alive:
                    return worker
                self._retire(worker)
                continue
            with self._lock:
                spawn = self._live < self.max_workers
                if spawn:
                    self._live += 1
            if spawn:
                try:
                    worker = SandboxWorker.spawn(self.limits, hide=None)
                except BaseException:
                    with self._lock:
                        self._live -= 1
                    raise
                self.isolation = worker.isolation
                return worker
            with contextlib.suppress(queue.Empty):
                worker = self._idle.get(timeout=1.0)
                if worker.alive:
                    return worker
                self._retire(worker)

    def _release(self, worker: SandboxWorker, keep: bool) -> None:
        with self._lock:
            uses = self._uses.get(id(worker), 0) + 1  # present: the worker has the runner defined
            keep = keep and worker.alive and uses < self.calls_per_worker
            if keep:
                self._uses[id(worker)] = uses
        if keep:
            self._idle.put(worker)
        else:
            self._retire(worker)

    def _retire(self, worker: SandboxWorker) -> None:
        with self._lock:
            self._uses.pop(id(worker), None)
        worker.close_sync()
        with self._lock:
            self._live -= 1

    def close(self) -> None:
        """Kill every idle worker and stop the event loop thread."""
        while True:
            try:
                self._retire(self._idle.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            portal_cm, self._portal_cm, self._portal = self._portal_cm, None, None
        if portal_cm is not None:
            portal_cm.__exit__(None, None, None)

    def __enter__(self) -> SandboxExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _apply(spec: ToolSpec, world: World, changes: Any) -> None:
    """Write a call's changed records into ``world``; a change outside the tool's write tables is refused."""
    if not changes:
        return
    if not isinstance(changes, dict) or not all(isinstance(v, dict) for v in changes.values()):
        raise ToolError(f"{spec.name} failed: malformed state changes from the sandbox", ErrorKind.TOOL_ERROR)
    undeclared = sorted(set(changes) - set(spec.writes))
    if undeclared:
        what = "is read-only but changed" if not spec.writes else "changed tables it does not declare:"
        raise ToolError(f"{spec.name} {what} {', '.join(undeclared)}", ErrorKind.TOOL_ERROR)
    for name, records in changes.items():
        table = world[name]
        for key, record in records.items():
            if record is None:
                with contextlib.suppress(KeyError):
                    del table[key]
            else:
                table[key] = record


def pack_executor(**kwargs: Any) -> SandboxExecutor:
    """A new executor for one pack's tools, closed when the process exits."""
    executor = SandboxExecutor(**kwargs)
    atexit.register(executor.close)
    return executor
