"""Packs served to many sessions: where each session's world lives, and what it started from.

``EnvHost`` holds the loaded packs by id. A session (``protocol.SessionState``) gets one
world per pack it uses, created at its first call from the task the session is bound
to (``bind``: the task's patched state) or, unbound, from the pack's initial state, and
dropped when the session closes. The server wraps ``call`` as one stateful tool per
pack tool and ``verify`` as the ``tool_use`` verifier; nothing here knows the server.

Who calls: a task may give its simulated user tools of its own (``metadata["user_tools"]``;
τ²'s dual control, the customer's phone). They act on the same world, but only calls made
as the ``USER`` reach them (the server reads that from the call id,
``protocol.messages.is_user_call``), and the user reaches nothing else (``refusal``).

``open_pack`` reads a pack from a directory or from a ``module:callable`` source, for
the server's config, the ``tool-server env`` commands and the data builder alike.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from protocol import (
    ErrorKind,
    SessionState,
    ToolContext,
    ToolError,
    ToolOutput,
    VerifyRequest,
    VerifyResult,
)
from tools.envs.pack import EnvTask, Pack, load_pack
from tools.envs.world import CallRecord, RefusedCall, World, jsonable

__all__ = [
    "AGENT",
    "USER",
    "USER_TOOLS",
    "Binding",
    "EnvHost",
    "load_directory",
    "open_pack",
    "parse_arguments",
    "refusal",
    "resolve_ground_truth",
]

_WORLDS_KEY = "toolfactory.env.worlds"  # SessionState.data: pack id -> _SessionWorld
_BINDING_KEY = "toolfactory.env.binding"  # SessionState.data: the session's Binding
MODES = ("train", "eval")
AGENT, USER = "assistant", "user"  # who makes a call (τ²'s requestors)
USER_TOOLS = "user_tools"  # EnvTask.metadata: the tools only the task's simulated user may call
_SNAPSHOT_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def open_pack(ref: str, arguments: Mapping[str, Any] | None = None) -> Pack:
    """A pack from a directory (``load_pack``) or a ``package.module:callable`` returning one.

    Raises ValueError naming what is wrong (no such directory, not importable, not a Pack).
    """
    arguments = dict(arguments or {})
    module_name, sep, attr = ref.partition(":")
    if sep and module_name and attr and "/" not in module_name and not Path(ref).exists():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"environment source {ref!r}: cannot import {module_name!r}: {exc}") from exc
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise ValueError(f"environment source {ref!r}: {module_name} has no callable {attr!r}")
        try:
            pack = factory(**arguments)
        except TypeError as exc:
            raise ValueError(f"environment source {ref!r}: bad arguments {arguments}: {exc}") from exc
        if not isinstance(pack, Pack):
            raise ValueError(f"environment source {ref!r} returned {type(pack).__name__}, not a Pack")
        return pack
    if arguments:
        raise ValueError(f"environment {ref!r} is a directory: 'arguments' only apply to a source")
    if not Path(ref).expanduser().is_dir():
        raise ValueError(f"environment {ref!r} is neither a pack directory nor a 'module:callable' source")
    return load_directory(ref)


def load_directory(path: str | Path) -> Pack:
    """A pack directory: a trusted one imports its tools module (``load_pack``); a built one
    (``trusted: false`` in pack.yaml, written by the builder) runs its tools in the sandbox."""
    meta_path = Path(path).expanduser() / "pack.yaml"
    meta = yaml.safe_load(meta_path.read_text()) if meta_path.is_file() else None
    if isinstance(meta, dict) and meta.get("trusted") is False:
        from tools.envs.builder.loader import load_built_pack  # the sandbox, only when needed

        return load_built_pack(path)
    return load_pack(path)


def parse_arguments(pairs: Iterable[str]) -> dict[str, Any]:
    """``["seed=3", "world=shop"]`` -> ``{"seed": 3, "world": "shop"}``: a source's arguments
    from a command line (values parsed as YAML). ValueError names a malformed pair."""
    arguments = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"argument {pair!r} must look like key=value")
        arguments[key.strip()] = yaml.safe_load(value)
    return arguments


@dataclass(frozen=True, slots=True)
class Binding:
    """The task a session plays: its worlds of ``pack`` start from that task's state."""

    pack: str
    task: str


@dataclass(slots=True)
class _SessionWorld:
    world: World
    task: EnvTask | None  # what the world started from (None: the pack's initial state)


def resolve_ground_truth(ground_truth: Any) -> Binding:
    """``{"pack": P, "task": T}`` (a task's ground truth in data and verify requests)."""
    if (
        not isinstance(ground_truth, Mapping)
        or not isinstance(ground_truth.get("pack"), str)
        or not isinstance(ground_truth.get("task"), str)
    ):
        raise ToolError(
            f'ground_truth must be {{"pack": <pack id>, "task": <task id>}}, got {str(ground_truth)[:200]}',
            ErrorKind.INVALID_ARGUMENTS,
        )
    return Binding(ground_truth["pack"], ground_truth["task"])


class EnvHost:
    """The packs a server serves, and the worlds of its sessions."""

    def __init__(self) -> None:
        self.packs: dict[str, Pack] = {}
        self.prefixes: dict[str, str] = {}
        # Worlds created and freed (a finalizer counts each one reclaimed): for /metrics and
        # the tests that show a released session's world is gone. Tools run in threads.
        self._lock = threading.RLock()  # a finalizer may run inside a locked block
        self.worlds_created = 0
        self.worlds_freed = 0

    def add(self, pack: Pack, prefix: str = "") -> Pack:
        """Serve ``pack``; ``prefix`` is what its served tool names have in front of its own."""
        if pack.id in self.packs:
            raise ValueError(f"two environments have the id {pack.id!r}; serve each pack once")
        self.packs[pack.id] = pack
        self.prefixes[pack.id] = prefix
        return pack

    def resolve(self, pack_id: str, task_id: str) -> tuple[Pack, EnvTask]:
        """The pack and task of those ids; LookupError says which is unknown and what exists."""
        pack = self.packs.get(pack_id)
        if pack is None:
            known = ", ".join(sorted(self.packs)) or "none"
            raise LookupError(f"no environment pack {pack_id!r} on this server; packs: {known}")
        try:
            return pack, pack.task(task_id)
        except KeyError:
            sample = ", ".join(t.id for t in pack.tasks[:5])
            raise LookupError(
                f"pack {pack_id!r} has no task {task_id!r} ({len(pack.tasks)} tasks, e.g. {sample or 'none'})"
            ) from None

    # ----------------------------------------------------------------- sessions

    def bind(self, session: SessionState, pack_id: str, task_id: str) -> Binding:
        """Make ``session`` play ``task_id`` of ``pack_id``: its world will start from that task.

        Idempotent for the same task. LookupError for an unknown pack or task; ToolError
        (bad_request) when the session plays another task or already has a world of the pack.
        """
        self.resolve(pack_id, task_id)
        binding = Binding(pack_id, task_id)
        current = session.data.get(_BINDING_KEY)
        if current == binding:
            return binding
        if current is not None:
            raise ToolError(
                f"session {session.id!r} already plays task {current.task!r} of pack {current.pack!r}; "
                "one session plays one task: use a new session id",
                ErrorKind.BAD_REQUEST,
            )
        if pack_id in session.data.get(_WORLDS_KEY, {}):
            raise ToolError(
                f"session {session.id!r} already made calls in pack {pack_id!r} from its initial state; "
                "bind a session to a task before its first call",
                ErrorKind.BAD_REQUEST,
            )
        session.data[_BINDING_KEY] = binding
        return binding

    def binding(self, session: SessionState | None) -> Binding | None:
        return None if session is None else session.data.get(_BINDING_KEY)

    def world(self, session: SessionState, pack: Pack) -> _SessionWorld:
        """The session's world of ``pack``, created on first use and dropped when the session closes."""
        worlds: dict[str, _SessionWorld] | None = session.data.get(_WORLDS_KEY)
        if worlds is None:
            worlds = session.data[_WORLDS_KEY] = {}
            session.on_close(lambda: _forget_worlds(session))
        held = worlds.get(pack.id)
        if held is None:
            binding = session.data.get(_BINDING_KEY)
            task = pack.task(binding.task) if binding is not None and binding.pack == pack.id else None
            held = worlds[pack.id] = _SessionWorld(pack.new_world(task), task)
            with self._lock:
                self.worlds_created += 1
            weakref.finalize(held.world, self._count_freed)
        return held

    def existing_world(self, session: SessionState | None, pack: Pack) -> _SessionWorld | None:
        if session is None:
            return None
        return (session.data.get(_WORLDS_KEY) or {}).get(pack.id)

    def call(
        self,
        session: SessionState | None,
        pack: Pack,
        name: str,
        arguments: dict[str, Any],
        requestor: str = AGENT,
    ) -> Any:
        """Run tool ``name`` of ``pack`` in the session's world; a JSON-able snapshot of its output.

        A tool the session's task does not expose is refused (and logged as a failed call),
        without naming the task's tools: some are held back until a later turn (BFCL
        miss_func), and the server cannot tell which the trajectory has been shown.
        ``requestor`` is who calls: the agent, or the task's simulated ``USER``, who alone may
        call the task's user tools (``refusal``).
        """
        if session is None:
            raise ToolError(
                f"{name} acts on a session's world: send a session id with the call",
                ErrorKind.BAD_REQUEST,
            )
        held = self.world(session, pack)
        message = refusal(held.task, name, requestor)
        if message is not None:
            held.world.calls.append(CallRecord(name, dict(arguments), error=message))
            raise ToolError(message, ErrorKind.UNKNOWN_TOOL)
        return _snapshot(pack.call(held.world, name, arguments))

    def refuse(
        self,
        session: SessionState | None,
        pack: Pack,
        name: str,
        arguments: dict[str, Any],
        message: str,
        requestor: str = AGENT,
    ) -> None:
        """Note a call to tool ``name`` that the server refused on its schema (``message``), in
        its place among the session's calls (``World.refused``): it never ran, but a benchmark
        that checks no schema (τ²) would have run it, and its verdict replays it."""
        if session is None:
            return
        world = self.world(session, pack).world
        world.refused.append(
            RefusedCall(len(world.calls), CallRecord(name, dict(arguments), error=message), requestor)
        )

    def gauges(self) -> dict[str, float]:
        """For /metrics: worlds alive in memory (freed ones drop out) and created since start."""
        with self._lock:
            created, freed = self.worlds_created, self.worlds_freed
        return {"worlds_live": float(created - freed), "worlds_created": float(created)}

    def _count_freed(self) -> None:
        with self._lock:
            self.worlds_freed += 1

    # ----------------------------------------------------------------- the reward

    def verify(self, request: VerifyRequest, ctx: ToolContext) -> VerifyResult:
        """Score a trajectory in an environment (the tool_use reward).

        ``ground_truth`` names the pack and task; the world scored is the request's
        session's (None without a session). Arguments: ``mode`` (train | eval) and
        ``weights`` (reward component -> weight). The details hold gold values only for a
        caller that may see gold (``ctx.sees_gold``; a context without it may not).
        """
        wanted = resolve_ground_truth(request.ground_truth)
        try:
            pack, task = self.resolve(wanted.pack, wanted.task)
        except LookupError as exc:
            raise ToolError(str(exc), ErrorKind.INVALID_ARGUMENTS) from None
        mode = request.arguments.get("mode", "train")
        if mode not in MODES:
            raise ToolError(f"mode must be one of {MODES}, got {mode!r}", ErrorKind.INVALID_ARGUMENTS)
        weights = request.arguments.get("weights")
        if weights is not None and not isinstance(weights, Mapping):
            raise ToolError("weights must map reward components to numbers", ErrorKind.INVALID_ARGUMENTS)
        world = self._world_to_score(ctx.session, pack, task)
        from tools.verifiers.tool_use.reward import score  # the reward (loaded on first use)

        try:
            return score(
                pack,
                task,
                world,
                _unprefixed(request, self.prefixes[pack.id]),
                mode=mode,
                weights=weights,
                reveal_gold=getattr(ctx, "sees_gold", False),
            )
        except ValueError as exc:  # bad weights
            raise ToolError(str(exc), ErrorKind.INVALID_ARGUMENTS) from None

    def _world_to_score(self, session: SessionState | None, pack: Pack, task: EnvTask) -> World | None:
        if session is None:
            return None
        bound = self.binding(session)
        if bound is not None and bound.pack == pack.id and bound.task != task.id:
            raise ToolError(
                f"session {session.id!r} played task {bound.task!r}, but ground_truth names {task.id!r}",
                ErrorKind.INVALID_ARGUMENTS,
            )
        held = self.existing_world(session, pack)
        if held is None:  # no call ran: the world is still the task's starting state
            return pack.new_world(task)
        if held.world.base is not pack.base_state(task):
            raise ToolError(
                f"session {session.id!r} started from the pack's initial state, not from task "
                f"{task.id!r}; bind the session to the task before its first call",
                ErrorKind.INVALID_ARGUMENTS,
            )
        return held.world


def refusal(task: EnvTask | None, name: str, requestor: str = AGENT) -> str | None:
    """Why ``requestor`` may not call tool ``name`` in ``task``'s world (None: it may).

    A task's user tools (``metadata["user_tools"]``: τ²'s dual control, the customer's phone)
    are the simulated user's alone, and the user may call nothing else; the agent may call
    the tools the task exposes (``task.tools``; None: all). The message is what the caller
    sees, and what the call log keeps.
    """
    user_tools = (task.metadata.get(USER_TOOLS) or ()) if task is not None else ()
    if requestor == USER:
        if name in user_tools:
            return None
        if not user_tools:
            return (
                f"a simulated user's call to {name!r}: this session's task gives its user no tools; "
                "bind the session to a task whose user acts through tools before its first call"
            )
        return f"the simulated user may call only its own tools ({', '.join(user_tools)}), not {name!r}"
    if name in user_tools:
        return (
            f"tool {name!r} is the user's (it acts on their side, e.g. their phone): the agent cannot "
            "call it; ask the user to do it"
        )
    if task is not None and task.tools is not None and name not in task.tools:
        return (
            f"tool {name!r} is not available in this task (not yet, or not at all); "
            "call only the tools the task has given you so far"
        )
    return None


def _unprefixed(request: VerifyRequest, prefix: str) -> VerifyRequest:
    """The request with its tool messages named as the pack names its tools (as world.calls does)."""
    if not prefix or not request.messages:
        return request
    messages = [
        {**m, "name": m["name"][len(prefix) :]}
        if m.get("role") == "tool" and isinstance(m.get("name"), str) and m["name"].startswith(prefix)
        else m
        for m in request.messages
    ]
    return dataclasses.replace(request, messages=messages)


def _forget_worlds(session: SessionState) -> None:
    session.data.pop(_WORLDS_KEY, None)
    session.data.pop(_BINDING_KEY, None)


def _snapshot(output: Any) -> Any:
    """The output as plain JSON values: results are kept (idempotency) beyond the world's life,
    and must neither change with it nor keep its records alive. A ToolOutput's content blocks
    are already plain (an image's base64 text is not copied); its structured part is snapshot."""
    if output is None or isinstance(output, str | int | float | bool):
        return output
    if isinstance(output, ToolOutput):
        return ToolOutput(list(output.content), _snapshot(output.structured), output.is_error)
    return orjson.loads(orjson.dumps(output, default=jsonable, option=_SNAPSHOT_OPTIONS))
