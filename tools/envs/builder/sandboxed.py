"""Generated tool code runs here: in confined sandbox workers, never in this process.

A call of a generated tool is one request to a ``SandboxWorker`` (``tools.sandbox``):
the source of ``runner.py`` as code, and on stdin a JSON request with the tool module's
source, the tool's name and arguments, and the tables the tool declared it reads or
writes, serialised from the session's ``World``. The reply is the output and the
records the call changed; ``SandboxExecutor.call`` applies those changes to the World
(only to tables the tool declared it writes) and returns the output, or raises the
tool's refusal as ``protocol.ToolError``. So the world never leaves the server as
anything but JSON, and nothing the generated code does reaches the server's memory.

A worker serves one ``World`` only (a session's, or one the builder replays), for up to
``calls_per_worker`` of its calls, and is killed once that world is gone: generated code can
leave something behind in the interpreter (``sys.modules``, builtins, the runner itself), but
only the later calls of the same world (so of the same session, and tenant) can meet it, never
another session's records or arguments. The runner is defined once per worker and each call
loads the tool module afresh in a new namespace. At most ``max_workers`` workers live at once:
past that, the least recently used idle one is killed (its world gets a fresh worker at its
next call; the world itself lives on the server, so nothing is lost). ``parameters`` (the
builder's checks, no world) runs in a fresh worker each time. Give each pack its own executor
(``pack_executor``; ``load_built_pack`` does).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import json
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass(eq=False)
class _Bound:
    """The worker of one world, and the lock that runs the world's calls one at a time."""

    world: weakref.ref[World]
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: SandboxWorker | None = None
    uses: int = 0  # calls it served (the runner is defined once it has served one)
    last_used: float = 0.0


class SandboxExecutor:
    """Runs generated tools in sandbox workers, one per world; safe to call from any thread.

    The sandbox API is async (anyio); tools are called synchronously (``EnvTool.func``),
    so the executor keeps one event loop in a background thread (an anyio blocking portal)
    and hands each call to it. Raises ``SandboxError`` at the first call when no worker
    can start (the message says which confinement step failed).
    """

    def __init__(
        self, limits: SandboxLimits = _LIMITS, *, max_workers: int = 8, calls_per_worker: int = 64
    ) -> None:
        if max_workers < 1 or calls_per_worker < 1:
            raise ValueError("max_workers and calls_per_worker must be >= 1")
        self.limits = limits
        self.max_workers = max_workers
        self.calls_per_worker = calls_per_worker
        self._bound: dict[int, _Bound] = {}  # by id() of a live world
        self._dead: deque[SandboxWorker] = deque()  # killed when their world went; to be reaped
        self._live = 0  # workers started and not yet reaped
        self._lock = threading.Lock()
        self._portal_cm: Any = None
        self._portal: Any = None
        self.isolation: dict[str, str] = {}

    # -- requests ---------------------------------------------------------------------
    def request(self, payload: Mapping[str, Any], world: World | None = None) -> dict[str, Any]:
        """Send one request to ``world``'s worker (a fresh one without a world); the runner's
        reply (``ok`` False with ``kind`` sandbox on a kill)."""
        self._reap()
        if world is None:
            worker = self._spawn()
            try:
                reply, _ = self._ask(worker, payload, defined=False)
            finally:
                self._close(worker)
            return reply
        bound = self._bound_to(world)
        with bound.lock:
            if bound.worker is None or not bound.worker.alive:
                self._drop(bound)
                bound.worker = self._spawn(bound)
            reply, keep = self._ask(bound.worker, payload, defined=bound.uses > 0)
            bound.uses += 1
            bound.last_used = time.monotonic()
            if not keep or bound.uses >= self.calls_per_worker:
                self._drop(bound)
        return reply

    def _ask(
        self, worker: SandboxWorker, payload: Mapping[str, Any], *, defined: bool
    ) -> tuple[dict[str, Any], bool]:
        """The runner's reply, and whether the worker may serve its world's next call."""
        code = "_tf_main()" if defined else _RUNNER + "\n_tf_main()"
        result = self._portal_call(worker, code, json.dumps(payload))
        if result.worker_died or result.value is None:
            why = result.error or "the tool produced no reply"
            kind = "timeout" if result.timed_out else "sandbox"
            return {"ok": False, "kind": kind, "error": f"the sandbox stopped the tool: {why}"}, False
        if result.truncated:
            return {
                "ok": False,
                "kind": "crash",
                "error": "the tool's reply is over the sandbox's size limit",
            }, False
        try:
            reply = json.loads(ast.literal_eval(result.value))
        except (ValueError, SyntaxError, TypeError):
            reply = None
        if not isinstance(reply, dict):  # the generated code tampered with the runner: drop the worker
            return {"ok": False, "kind": "crash", "error": "the sandbox's reply is malformed"}, False
        return reply, True

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
        reply = self.request(payload, world)
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
        """Load ``source`` in a fresh sandbox: each named function's parameter names. ValueError says what failed."""
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
    def _portal_call(self, worker: SandboxWorker, code: str, stdin: str) -> Any:
        with self._lock:
            if self._portal is None:
                self._portal_cm = anyio.from_thread.start_blocking_portal()
                self._portal = self._portal_cm.__enter__()
            portal = self._portal
        return portal.call(lambda: worker.run(code, stdin=stdin))

    def _bound_to(self, world: World) -> _Bound:
        """The record of ``world``'s worker (made on its first call; forgotten when it is gone)."""
        with self._lock:
            bound = self._bound.get(id(world))
            if bound is None or bound.world() is not world:  # an id reused by a later world
                bound = self._bound[id(world)] = _Bound(weakref.ref(world))
                weakref.finalize(world, self._world_gone, id(world), bound)
            return bound

    def _world_gone(self, key: int, bound: _Bound) -> None:
        """A world was freed (its session closed): kill its worker now, reap it later. Runs in
        whichever thread freed it, so it only signals."""
        with self._lock:
            if self._bound.get(key) is bound:
                del self._bound[key]
            worker, bound.worker = bound.worker, None
        if worker is not None:
            worker.kill()
            self._dead.append(worker)

    def _spawn(self, bound: _Bound | None = None) -> SandboxWorker:
        """A fresh worker (for ``bound``'s world), within max_workers: the least recently used
        idle worker of another world makes room, or this waits for one."""
        while True:
            with self._lock:
                if self._live < self.max_workers:
                    self._live += 1
                    break
                idle = sorted(
                    (b for b in self._bound.values() if b is not bound and b.worker is not None),
                    key=lambda b: b.last_used,
                )
            for victim in idle:
                if victim.lock.acquire(blocking=False):  # not running a call now
                    try:
                        self._drop(victim)
                    finally:
                        victim.lock.release()
                    break
            else:
                self._reap()
                time.sleep(0.05)  # every worker is running a call: wait for one to finish
        try:
            worker = SandboxWorker.spawn(self.limits, hide=None)
        except BaseException:
            with self._lock:
                self._live -= 1
            raise
        self.isolation = worker.isolation
        return worker

    def _drop(self, bound: _Bound) -> None:
        """Kill and reap the worker of ``bound`` (the caller holds its lock); its world's next
        call gets a fresh one."""
        with self._lock:  # _world_gone may take it at the same time
            worker, bound.worker, bound.uses = bound.worker, None, 0
        if worker is not None:
            self._close(worker)

    def _close(self, worker: SandboxWorker) -> None:
        worker.close_sync()
        with self._lock:
            self._live -= 1

    def _reap(self) -> None:
        while True:
            try:
                worker = self._dead.popleft()
            except IndexError:
                return
            self._close(worker)

    def close(self) -> None:
        """Kill every worker and stop the event loop thread."""
        with self._lock:
            bound = list(self._bound.values())
            self._bound.clear()
        for record in bound:
            with record.lock:
                self._drop(record)
        self._reap()
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
