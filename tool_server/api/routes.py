"""The batched HTTP API for trainers: /v1/calls, /v1/verify, /v1/tools, sessions, health.

Bodies are parsed with orjson into protocol records; every bad input gets a 4xx
JSON error ``{"error": {"kind", "message"}}`` that says what to fix.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from protocol import (
    Call,
    ErrorInfo,
    ErrorKind,
    ProtocolError,
    Result,
    ToolError,
    VerifyResult,
    decode_calls,
    decode_verify_requests,
    encode,
    new_session_id,
)
from protocol.messages import MAX_ID_LENGTH
from tool_server.api.auth import sees_server_wide
from tool_server.api.openapi import openapi_spec
from tool_server.api.queued_bytes import ConnectionBytes, QueuedBytes
from tool_server.executor.admission import ANONYMOUS_TENANT
from tool_server.executor.executor import Caller, Executor, Overloaded
from tool_server.executor.records import result_json
from tool_server.registry import Registry
from tool_server.sessions import INSTANCE_HEADER

T = TypeVar("T")
R = TypeVar("R")
_INSTANCE_KEY = INSTANCE_HEADER.encode()  # as ASGI scopes spell header names: lower-case bytes


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(encode(body), status_code=status, media_type="application/json", headers=headers)


def error_response(
    status: int, kind: ErrorKind | str, message: str, headers: dict[str, str] | None = None
) -> Response:
    return json_response({"error": {"kind": str(kind), "message": message}}, status, headers)


class _PlainAsgi:
    """A ``body -> Response`` handler as a plain ASGI app, for the hot route.

    Starlette wraps a function endpoint in a Request and an exception-handling layer
    per request; for /v1/calls that was a sizeable part of the HTTP cost of a batch
    (bench/README.md).
    Errors still reach the app's exception handlers, which sit outside the router.
    """

    def __init__(self, handler: Callable[[bytes, Scope], Awaitable[Response]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client has gone: nothing to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        response = await self.handler(chunks[0] if len(chunks) == 1 else b"".join(chunks), scope)
        await response(scope, receive, send)


def caller_of(scope: Scope, registry: Registry) -> Caller:
    """The caller of a request, from what AuthMiddleware put in ``scope["state"]``.

    Gold (a verifier's details) is for the callers the workbench shows gold to: ``sees_server_wide``.
    """
    state = scope.get("state") or {}
    toolsets = state.get("toolsets")
    allowed = None
    if toolsets is not None:
        allowed = frozenset(name for ts in toolsets for name in registry.names_in(ts))
    return Caller(state.get("tenant", ANONYMOUS_TENANT), allowed, sees_server_wide(scope))


def request_header(scope: Scope, name: bytes) -> str | None:
    """One request header (``name`` in lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def instance_expected(scope: Scope) -> str | None:
    """The process the client expects its sessions on: its ``X-Toolfactory-Instance`` header."""
    return request_header(scope, _INSTANCE_KEY)


FROM_SCOPE = object()  # run_calls: read the expected instance from the scope's headers

_SESSION_STATUS = {ErrorKind.OVERLOADED: 429, ErrorKind.BAD_REQUEST: 409}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a calls body did not run: the HTTP status and error it is answered with, and the
    calls it held when it decoded (a stream answers each of them with a failure result)."""

    status: int
    kind: ErrorKind
    message: str
    calls: Sequence[Call] = ()


class HttpApi:
    """Route handlers bound to one executor; ``caller`` tells who sends a request."""

    def __init__(self, executor: Executor, *, default_toolset: str | None, retry_after_s: int) -> None:
        self.executor = executor
        self.registry = executor.registry
        self.default_toolset = default_toolset
        self.retry_after = str(retry_after_s)
        self.max_batch = executor.config.limits.max_calls_per_batch
        self.queued_bytes = QueuedBytes(executor.config.limits)  # bodies admitted, not yet answered
        self._calls_batches = executor.metrics.batches.labels("calls")  # looked up once: ~1 µs a batch
        self.ready = False
        self.readiness_checks: list[Any] = []  # callables returning (name, healthy, detail)
        # Which sandbox untrusted code gets (tool_server/sandbox_mode.py), set at start.
        self.sandbox: dict[str, Any] = {"mode": "unused", "tools": []}
        # Every answer names this process, so a client sees a restart at the same address.
        self._instance = (_INSTANCE_KEY, executor.sessions.instance.encode())

    def caller(self, scope: Scope) -> Caller:
        return caller_of(scope, self.registry)

    def answer(self, body: Any, status: int = 200) -> Response:
        """A JSON answer naming this process (appended raw: a headers dict costs ~3 µs a response)."""
        return self.answer_encoded(encode(body), status)

    def answer_encoded(self, body: bytes, status: int = 200) -> Response:
        """``answer`` for a body already encoded."""
        response = Response(body, status_code=status, media_type="application/json")
        response.raw_headers.append(self._instance)
        return response

    def routes(self) -> list[Route]:
        """The HTTP API's routes, ``/v1/calls`` (the hot one) first."""
        return [
            Route("/v1/calls", _PlainAsgi(self.calls_body), methods=["POST"]),
            Route("/v1/verify", self.verify, methods=["POST"]),
            Route("/v1/tools", self.tools, methods=["GET"]),
            Route("/v1/sessions", self.create_session, methods=["POST"]),
            Route("/v1/sessions/renew", self.renew_sessions, methods=["POST"]),
            # :path, so that an id with '/' or '..' in it reaches the handler (404), not a redirect.
            Route("/v1/sessions/{session_id:path}", self.release_session, methods=["DELETE"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]

    async def calls_body(self, body: bytes, scope: Scope) -> Response:
        """``POST /v1/calls``: ``run_calls``, answered over HTTP."""
        answer = await self.run_calls(body, scope)
        if isinstance(answer, bytes):
            return self.answer_encoded(answer)
        headers = {"Retry-After": self.retry_after} if answer.kind == ErrorKind.OVERLOADED else None
        return error_response(answer.status, answer.kind, answer.message, headers)

    async def run_calls(
        self,
        body: bytes,
        scope: Scope,
        caller: Caller | None = None,
        expected_instance: str | None | object = FROM_SCOPE,
        connection: ConnectionBytes | None = None,
    ) -> bytes | Refusal:
        """Run a calls body ``{"calls": [...]}`` for the caller of ``scope``: the answer
        ``{"results": [...]}`` (one result per call, in order), or why none of it ran.

        The one path of a batch: ``POST /v1/calls`` and each frame of ``/v1/stream``
        (api/stream.py) come here, with the request's or the handshake's scope (its token,
        its instance header). ``caller`` and ``expected_instance`` (``instance_expected(scope)``):
        given when the caller has them already (a stream reads them once per connection);
        ``connection``: what a stream's frames hold (``QueuedBytes``).
        """
        try:
            calls = decode_calls(body)
        except ProtocolError as exc:
            return Refusal(400, exc.kind, exc.message)
        if len(calls) > self.max_batch:
            return Refusal(
                413,
                ErrorKind.TOO_LARGE,
                f"{len(calls)} calls in one batch; the limit is {self.max_batch}",
                calls,
            )
        self._calls_batches.inc()
        self.executor.metrics.batch_size.observe(len(calls))
        if caller is None:
            caller = self.caller(scope)
        tenant, size, queued = caller.tenant, len(body), self.queued_bytes
        refused = queued.take(tenant, size, connection)
        if refused is not None:
            self.executor.metrics.rejected.inc()
            return Refusal(429, ErrorKind.OVERLOADED, refused, calls)
        try:
            results = await self._fenced(
                scope,
                calls,
                [c.session for c in calls],
                lambda kept: self.executor.run_batch(kept, caller),
                lambda call, why: Result.failure(call.call_id, ErrorKind.UNKNOWN_SESSION, why),
                expected_instance,
            )
        except Overloaded as exc:
            self.executor.metrics.rejected.inc()
            return Refusal(429, ErrorKind.OVERLOADED, str(exc), calls)
        finally:
            queued.give_back(tenant, size, connection)
        # Each kept result is sent as the JSON it was kept as: encoded once (records.result_json).
        return b'{"results":[' + b",".join([result_json(r) for r in results]) + b"]}"

    async def _fenced(
        self,
        scope: Scope,
        items: list[T],
        sessions: Sequence[str | None],
        run: Callable[[list[T]], Awaitable[list[R]]],
        refuse: Callable[[T, str], R],
        expected: str | None | object = FROM_SCOPE,
    ) -> list[R]:
        """Run the items, less those whose session the client expects on another process
        (``SessionStore.fence``): those are answered ``unknown_session`` in their place."""
        if expected is FROM_SCOPE:
            expected = instance_expected(scope)
        store = self.executor.sessions
        if expected is None or expected == store.instance:  # the usual case: nothing to refuse
            return await run(items)
        assert isinstance(expected, str)
        refused = {
            i: why for i, s in enumerate(sessions) if s is not None and (why := store.fence(expected, s))
        }
        ran = iter(await run([x for i, x in enumerate(items) if i not in refused]))
        return [refuse(x, refused[i]) if i in refused else next(ran) for i, x in enumerate(items)]

    async def verify(self, request: Request) -> Response:
        body = await request.body()
        try:
            requests = decode_verify_requests(body)
        except ProtocolError as exc:
            return error_response(400, exc.kind, exc.message)
        if len(requests) > self.max_batch:
            return error_response(
                413,
                ErrorKind.TOO_LARGE,
                f"{len(requests)} requests in one batch; the limit is {self.max_batch}",
            )
        self.executor.metrics.batches.labels("verify").inc()
        caller = self.caller(request.scope)
        refused = self.queued_bytes.take(caller.tenant, len(body))
        if refused is not None:
            self.executor.metrics.rejected.inc()
            return error_response(429, ErrorKind.OVERLOADED, refused, {"Retry-After": self.retry_after})
        try:
            results = await self._fenced(
                request.scope,
                requests,
                [r.session for r in requests],
                lambda kept: self.executor.verify_batch(kept, caller),
                lambda r, why: VerifyResult(
                    0.0,
                    request_id=r.request_id,
                    is_error=True,
                    error=ErrorInfo(ErrorKind.UNKNOWN_SESSION, why),
                ),
            )
        except Overloaded as exc:
            self.executor.metrics.rejected.inc()
            return error_response(429, ErrorKind.OVERLOADED, str(exc), {"Retry-After": self.retry_after})
        finally:
            self.queued_bytes.give_back(caller.tenant, len(body))
        return self.answer({"results": results})

    async def tools(self, request: Request) -> Response:
        toolset = request.query_params.get("toolset") or self.default_toolset
        if toolset == "*" or (toolset == self.default_toolset and toolset not in self.registry.toolsets):
            toolset = None
        if toolset is not None and toolset not in self.registry.toolsets:
            known = ", ".join(sorted(self.registry.toolsets)) or "none"
            return error_response(
                404, ErrorKind.BAD_REQUEST, f"no toolset named {toolset!r}; known toolsets: {known}"
            )
        allowed = self.caller(request.scope).allowed
        tools = [d for d in self.registry.descriptors(toolset) if allowed is None or d["name"] in allowed]
        return json_response({"tools": tools, "toolset": toolset})

    async def create_session(self, request: Request) -> Response:
        body = await request.body()
        session_id = environment = None
        if body.strip():
            try:
                data = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                return error_response(400, ErrorKind.BAD_REQUEST, f"body is not valid JSON: {exc}")
            if not isinstance(data, dict):
                return error_response(
                    400,
                    ErrorKind.BAD_REQUEST,
                    'body must be an object: {} or {"session": "<id>", "environment": {"pack": P, "task": T}}',
                )
            session_id = data.get("session")
            environment = data.get("environment")
            if session_id is not None and (
                not isinstance(session_id, str) or not session_id or len(session_id) > MAX_ID_LENGTH
            ):
                return error_response(
                    400,
                    ErrorKind.BAD_REQUEST,
                    f"session must be a non-empty string of at most {MAX_ID_LENGTH} characters",
                )
        sessions = self.executor.sessions
        host = self.registry.environments
        if environment is not None:  # checked first: a bad binding leaves no session behind
            from tool_server.environments import check_environment

            try:
                pack, task = check_environment(host, environment)
            except LookupError as exc:  # an unknown pack or task
                return error_response(404, ErrorKind.BAD_REQUEST, str(exc.args[0]))
            except ToolError as exc:
                return error_response(400, exc.kind, exc.message)
        try:
            state = sessions.create(self.caller(request.scope).tenant, session_id or new_session_id())
            if environment is not None:
                host.bind(state, pack, task)  # refused (409) when it already plays another task
        except ToolError as exc:  # the table is full (429), the id is taken or already bound (409)
            headers = {"Retry-After": self.retry_after} if exc.kind == ErrorKind.OVERLOADED else None
            return error_response(_SESSION_STATUS.get(exc.kind, 400), exc.kind, exc.message, headers)
        self.executor.metrics.sessions.set(len(sessions))
        answer: dict[str, Any] = {"session": state.id, "ttl_s": sessions.ttl_s}
        if environment is not None:
            answer["environment"] = {"pack": pack, "task": task}
        return self.answer(answer, 201)

    async def renew_sessions(self, request: Request) -> Response:
        """Keep the caller's open sessions alive: ``{"sessions": [ids]}`` restarts their TTL.

        What the trainer client sends for the sessions of its live trajectories (every third
        of the ``ttl_s`` answered here), so a trajectory whose policy generates for longer
        than the TTL keeps its world; one whose client is gone stops renewing and expires.
        The answer lists the ids the caller holds no open session of (released, expired, not
        opened yet, another token's): they are not opened; ``closed`` names those of them the
        caller held and that were released or expired (gone for good).
        """
        store = self.executor.sessions
        try:
            data = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return error_response(400, ErrorKind.BAD_REQUEST, f"body is not valid JSON: {exc}")
        ids = data.get("sessions") if isinstance(data, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            return error_response(
                400,
                ErrorKind.BAD_REQUEST,
                'body must be {"sessions": ["<session id>", ...]} (non-empty strings)',
            )
        if len(ids) > store.max_sessions:  # more than can be open: not a client renewing its own
            return error_response(
                413, ErrorKind.TOO_LARGE, f"{len(ids)} ids in one renewal; at most {store.max_sessions}"
            )
        unknown, closed = store.renew(self.caller(request.scope).tenant, ids)
        answer = {
            "renewed": len(ids) - len(unknown),
            "unknown": unknown,
            "closed": closed,
            "ttl_s": store.ttl_s,
        }
        return self.answer(answer)

    async def release_session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        refused = await self.release(session_id, request.scope)
        if refused is not None:
            return error_response(404, ErrorKind.UNKNOWN_SESSION, refused)
        return self.answer({"released": session_id})

    async def release(self, session_id: str, scope: Scope) -> str | None:
        """Close the caller's session (``DELETE /v1/sessions/{id}``, a stream's release frame):
        None when it was closed, else why not. Another tenant's session is just not open."""
        released = await self.executor.sessions.release(self.caller(scope).tenant, session_id)
        self.executor.metrics.sessions.set(len(self.executor.sessions))
        if released:
            return None
        return f"no open session {session_id[:MAX_ID_LENGTH]!r} (expired, released, or not yours)"

    async def healthz(self, request: Request) -> Response:
        return self.answer({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Ready or not (200/503) for anyone; what each check found, and which sandbox confines
        untrusted code, only to a caller who may see every tool (upstream names and their last
        errors say what the server talks to)."""
        checks = {}
        healthy = self.ready
        for check in self.readiness_checks:
            name, ok, detail = check()
            checks[name] = {"ok": ok, **detail}
            healthy = healthy and ok
        status = 200 if healthy else 503
        body: dict[str, Any] = {"status": "ready" if healthy else "not ready"}
        if sees_server_wide(request.scope):
            body |= {
                # which process answered: a readiness loop tells its own server from another one
                # already on the port (README: `grep "\"pid\":$!"`)
                "pid": os.getpid(),
                "tools": len(self.registry.entries),
                "in_flight": self.executor.admitted,
                "sandbox": self.sandbox,
                "checks": checks,
            }
        return self.answer(body, status)

    async def metrics(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if not sees_server_wide(request.scope, public_by_choice=True):  # a Prometheus without a token
            return error_response(
                403,
                ErrorKind.UNAUTHORIZED,
                "the metrics name every tool and upstream: they need a token for every toolset",
            )
        m = self.executor.metrics
        m.in_flight.set(self.executor.running)
        m.queue_depth.set(max(0, self.executor.admitted - self.executor.running))
        m.sessions.set(len(self.executor.sessions))
        for store, (entries, size) in self.executor.store_sizes().items():
            m.store_entries.labels(store).set(entries)
            m.store_bytes.labels(store).set(size)
        for tool, figures in self.executor.tool_gauges().items():
            for name, value in figures.items():
                m.tool_gauges.labels(tool, name).set(value)
        guard = getattr(request.app.state, "connection_guard", None)  # set by `tool-server serve`
        if guard is not None:
            m.connections_open.set(guard.open)
            for event, count in guard.counts.items():
                m.connection_events.labels(event.replace(" ", "_")).set(count)
        for check in self.readiness_checks:
            check()  # refreshes upstream gauges
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, request: Request) -> Response:
        return json_response(openapi_spec())
