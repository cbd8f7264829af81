"""How a tool describes itself, without importing the server.

A tool is a plain function (sync or async) or a class whose instances are
callable. Its typed signature gives the input schema; ``@tool(...)`` attaches a
``ToolMeta`` record with everything else the executor needs to know. Parameters
annotated ``ToolContext`` are injected by the server and never appear in the
schema.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from protocol.images import image_block

META_KEY = "toolfactory"  # key under the MCP Tool ``_meta`` that holds ToolMeta fields
# ``_meta`` keys of an MCP ``tools/call`` request that our server reads (others ignore them).
SESSION_META_KEY = f"{META_KEY}/session"  # the trajectory's session id
CALL_ID_META_KEY = f"{META_KEY}/call_id"  # the client's idempotency key
ENV_META_KEY = f"{META_KEY}/environment"  # {"pack", "task"}: the environment task the session plays
INSTANCE_META_KEY = f"{META_KEY}/instance"  # the server process the client expects the session on
_ATTR = "__toolfactory_meta__"

ToolKind = Literal["program", "model", "agent", "verifier", "upstream"]


@dataclass(frozen=True, slots=True)
class ToolMeta:
    """Execution metadata, published in the MCP descriptor under ``_meta.toolfactory``."""

    name: str | None = None  # defaults to the function name
    description: str | None = None  # defaults to the docstring's first paragraph
    kind: ToolKind = "program"
    timeout_s: float = 30.0
    max_concurrency: int | None = None  # None: only the global limit applies
    idempotent: bool = True  # safe to retry with the same call_id
    cacheable: bool = False  # same arguments -> same result; cache it
    stateful: bool = False  # needs a session (one per trajectory)
    version: str = "1"  # part of the cache key; bump when outputs change
    title: str | None = None
    # Sync functions run in a worker thread unless marked non-blocking (bounded,
    # microsecond-scale work such as the calculator), which runs on the event loop.
    blocking: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "timeout_s": self.timeout_s,
            "max_concurrency": self.max_concurrency,
            "idempotent": self.idempotent,
            "cacheable": self.cacheable,
            "stateful": self.stateful,
            "version": self.version,
        }


F = TypeVar("F", bound=Callable[..., Any])


def tool(fn: F | None = None, /, **meta: Any) -> Any:
    """Mark a function or class as a tool: ``@tool`` or ``@tool(timeout_s=5, cacheable=True)``."""

    def mark(target: F) -> F:
        setattr(target, _ATTR, ToolMeta(**meta))
        return target

    return mark(fn) if fn is not None else mark


def verifier(fn: F | None = None, /, **meta: Any) -> Any:
    """Mark a reward function. It takes ``request: VerifyRequest`` and returns a VerifyResult."""
    meta.setdefault("kind", "verifier")
    return tool(fn, **meta)


def get_tool_meta(target: Any) -> ToolMeta:
    """The ToolMeta of a function, class or instance (a default one when unmarked)."""
    meta = getattr(target, _ATTR, None)
    if meta is None and not isinstance(target, type):
        meta = getattr(type(target), _ATTR, None)
    return meta if meta is not None else ToolMeta()


def with_overrides(meta: ToolMeta, **overrides: Any) -> ToolMeta:
    """Config-file overrides of a tool's metadata (unknown keys are an error)."""
    return replace(meta, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(slots=True)
class ToolOutput:
    """Explicit output: MCP content blocks and/or structured data.

    A tool may instead return a ``str`` (one text block), or a dict / list /
    dataclass (structured output, also rendered as JSON text). Image blocks
    (``ToolOutput.image``, ``protocol.images``) are checked against the server's limits.
    """

    content: list[dict[str, Any]] = field(default_factory=list)
    structured: Any = None
    is_error: bool = False

    @classmethod
    def text(cls, text: str, structured: Any = None) -> ToolOutput:
        return cls([{"type": "text", "text": text}], structured)

    @classmethod
    def image(
        cls, raw: bytes, mime_type: str | None = None, text: str | None = None, structured: Any = None
    ) -> ToolOutput:
        """One PNG or JPEG image (encoded bytes; the type read from them), after ``text`` if given."""
        blocks = [{"type": "text", "text": text}] if text else []
        return cls([*blocks, image_block(raw, mime_type)], structured)


class SessionState:
    """Per-trajectory state a stateful tool keeps between calls.

    ``data`` is private to the session; ``on_close`` callbacks run when the
    session is released or expires (kill an interpreter, delete a DB copy).
    """

    __slots__ = ("id", "data", "_closers")

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.data: dict[str, Any] = {}
        self._closers: list[Callable[[], Awaitable[None] | None]] = []

    def on_close(self, callback: Callable[[], Awaitable[None] | None]) -> None:
        self._closers.append(callback)

    async def close(self) -> None:
        """Run every callback, newest first, even past one that fails (a broken cleanup must
        not leave an interpreter running); then raise what failed."""
        closers, self._closers = self._closers, []
        errors: list[Exception] = []
        for callback in reversed(closers):
            try:
                outcome = callback()
                if outcome is not None:
                    await outcome
            except Exception as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ExceptionGroup(f"{len(errors)} cleanups of session {self.id!r} failed", errors)


@runtime_checkable
class ToolContext(Protocol):
    """What the server hands a tool that asks for it (annotate a parameter ``ToolContext``)."""

    @property
    def session(self) -> SessionState | None: ...

    @property
    def call_id(self) -> str: ...

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Run another tool through the same executor (limits, timeouts, metrics).

        Returns a ``protocol.Result``; agent tools use this for their inner calls.
        """
        ...
