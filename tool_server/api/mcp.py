"""The MCP endpoint: the official SDK's low-level server over our registry and executor.

``/mcp`` serves the default toolset and ``/mcp/{toolset}`` any named one. The SDK
answers both the stateless 2026-07-28 protocol and the older handshake versions;
we run it stateless with JSON responses.

A call finds its trajectory session (its world) in the first of:

* ``_meta["toolfactory/session"]``, for clients that can set ``_meta`` (the trainer);
* the URL, ``/mcp/{toolset}/s/{session}``: any client, either protocol era. A harness
  binds the id to a task and releases it with ``/v1/sessions``, as for any session;
* the MCP session of a handshake-era client: its ``initialize`` is answered with an
  ``Mcp-Session-Id`` (``_McpSessions``), which the client sends on every later request
  and whose ``DELETE`` (sent when the client closes) releases the world.

The last two apply to tools that keep state per session (``keeps_session_state``):
stateless tools and verifiers run without one, as before, so they need no session and
work on any replica.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
from typing import Any

import mcp_types as types
import orjson
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import TypeAdapter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from protocol import (
    CALL_ID_META_KEY,
    ENV_META_KEY,
    INSTANCE_META_KEY,
    META_KEY,
    SESSION_META_KEY,
    Call,
    ErrorKind,
    Result,
    ToolError,
)
from protocol.messages import MAX_ID_LENGTH
from tool_server.api.auth import is_loopback
from tool_server.api.queued_bytes import QueuedBytes
from tool_server.api.routes import caller_of, request_header
from tool_server.config import Config
from tool_server.executor.executor import ANONYMOUS, Caller, Executor, unknown_tool_message
from tool_server.executor.gc_pacing import YOUNG_BUDGET
from tool_server.registry import ToolEntry
from tool_server.sessions import SessionStore
from tools.envs.host import refusal

# A young collection every this many MCP requests (_McpAsgi owes the GC pacer its share per
# request). Each stateless request leaves ~14 objects in reference cycles inside the SDK, but a
# collection also walks what the requests in flight hold: at 1,024 concurrent MCP callers, one
# every 1,024 requests took 15-40 ms of CPU; every 256, a quarter of that, for the same total.
MCP_REQUESTS_PER_COLLECT = 256
MCP_CYCLE_OBJECTS = YOUNG_BUDGET // MCP_REQUESTS_PER_COLLECT
MCP_SESSION_HEADER = "mcp-session-id"
_MCP_SESSION_KEY = MCP_SESSION_HEADER.encode()  # as ASGI scopes spell header names
# The Mcp-Session-Id we issue: "mcp-", the issuing process's instance id (SessionStore.instance),
# "-", a random part. Only ids of this shape name a world: any other value is not ours.
_ISSUED_ID = re.compile(r"mcp-([0-9a-f]{16})-[0-9a-f]{24}")
_MCP_SESSION_ELSEWHERE = (
    "this MCP session's world is not on this server process: it was opened on instance {instance}, "
    "which restarted or is another replica (an MCP session stays on the process that issued it), "
    "so its state is lost here and is not started again empty. Reconnect (a new MCP session) to start a new world"
)
_MCP_SESSION_GONE = (
    "this MCP session's world was released or expired (idle for longer than sessions.ttl_s = {ttl:g} s); "
    "its state is gone. Reconnect (a new MCP session) to start a new world"
)


def transport_security(config: Config, bind_host: str) -> TransportSecuritySettings:
    """Host/Origin checks against DNS rebinding: strict on loopback, configured otherwise.

    On a non-loopback bind the reachable host names are unknown to us; bearer auth
    (required there) is what protects the server, and ``mcp.allowed_hosts`` turns
    the Host check on for those names.
    """
    if config.server.allowed_hosts:
        # Every route, this one included, checks Host and Origin against the loopback names, the
        # bound addresses and these names (tool_server/api/origin.py); this narrower list would
        # refuse the names listed there.
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = list(config.mcp.allowed_hosts)
    origins = list(config.mcp.allowed_origins)
    if is_loopback(bind_host):
        hosts += ["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost"]
        origins += ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        )
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=bool(hosts), allowed_hosts=hosts, allowed_origins=origins
    )


def _to_call_tool_result(
    result: Result, instance: str | None = None, session: str | None = None
) -> types.CallToolResult:
    structured = result.structured
    if structured is not None and not isinstance(structured, dict):
        structured = {"result": structured}
    meta: dict[str, Any] = {
        "call_id": result.call_id,
        "elapsed_ms": result.elapsed_ms,
        "cached": result.cached,
    }
    if result.error is not None:
        meta["error_kind"] = result.error.kind.value
    if instance is not None:
        meta["instance"] = instance
    if session is not None:  # the world it ran in: a harness scores it (/v1/verify) by this id
        meta["session"] = session
    return types.CallToolResult(
        content=[_content_block(block) for block in result.content]
        or [types.TextContent(type="text", text="")],
        structured_content=structured,
        is_error=result.is_error,
        meta={META_KEY: meta},
    )


_CONTENT_BLOCK = TypeAdapter(types.ContentBlock)


def _content_block(block: dict[str, Any]) -> Any:
    """A result's content block as an SDK object: text built directly (the common case)."""
    if block.get("type") == "text" and len(block) == 2:
        return types.TextContent(type="text", text=block["text"])
    return _CONTENT_BLOCK.validate_python(block)


class _McpAsgi:
    """What ``/mcp`` adds around the SDK's ASGI app, in one pass over each request.

    * ``/mcp/{toolset}`` for a toolset that does not exist: 404 naming the known ones (the
      same answer as ``GET /v1/tools?toolset=...``), so a typo (``/mcp/verifier``) is not an
      endpoint with no tools;
    * MCP sessions (trajectory worlds for clients that cannot set ``_meta``): ``initialize``
      (handshake era) on a URL without a session is answered with a new ``Mcp-Session-Id``,
      which the client sends on every later request of its connection; ``DELETE`` with that
      header, or on ``/mcp/{toolset}/s/{session}``, releases the session (the caller's own;
      anything else is already gone to it), 200 either way; ``GET`` with that header is 405,
      as the spec allows: a stateless endpoint has no server-initiated stream. Nothing is
      stored per MCP session: the trajectory session is opened by the first call that needs
      it, and expires like any other (``sessions.ttl_s``);
    * a JSON-RPC request whose ``id`` is neither a string nor an integer is refused: on the
      older protocol versions the SDK takes it for a notification and answers 202 with no
      reply, so the client would wait for an answer that never comes. The body is read here
      (MCP bodies are small; the body limit applies) and handed on;
    * a POST's body counts against the server's queued bytes (api/queued_bytes.py, shared with
      ``/v1/calls`` and the stream) until it is answered; past a bound it is refused whole (429,
      a JSON-RPC error, ``Retry-After``);
    * each request owes the GC pacer its share of a young collection (one every
      ``MCP_REQUESTS_PER_COLLECT`` requests): the SDK leaves ~14 objects in reference cycles per
      stateless request (its per-request runner and connection point at each other), which the
      server's high GC threshold would let pile up until one long collection (bench/README.md).

    One class, not one per concern: each ASGI layer cost a few microseconds a request.
    """

    def __init__(self, app: ASGIApp, executor: Executor, queued_bytes: QueuedBytes) -> None:
        self.app = app
        self.executor = executor
        self.queued_bytes = queued_bytes
        self.retry_after = str(executor.config.limits.retry_after_s)
        self.registry = executor.registry
        self.sessions: SessionStore = executor.sessions
        self.pacer = executor.gc_pacer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._handle(scope, receive, send)
        finally:
            self.pacer.owe(MCP_CYCLE_OBJECTS)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path_params = scope.get("path_params") or {}
        toolset = path_params.get("toolset")
        if toolset is not None and toolset not in self.registry.toolsets:
            known = ", ".join(sorted(self.registry.toolsets)) or "none"
            message = f"no toolset named {toolset!r}; known toolsets: {known} (or /mcp for the default one)"
            await send_json_rpc_error(send, 404, -32601, message)
            return
        in_url = path_params.get("session")
        if in_url is not None and not _is_id(in_url):
            message = f"the session in the URL must be at most {MAX_ID_LENGTH} characters"
            await send_json_rpc_error(send, 400, -32600, message)
            return
        header = request_header(scope, _MCP_SESSION_KEY)
        issued = header if header is not None and _ISSUED_ID.fullmatch(header) else None
        method = scope["method"]
        if method == "POST":
            messages: list[Message] = []
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request" or not message.get("more_body", False):
                    break
            body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
            bad_id, initialize = _inspect(body)
            if bad_id:
                await send_json_rpc_error(
                    send, 400, -32600, "Invalid Request: id must be a string or an integer"
                )
                return
            if initialize and in_url is None and header is None:
                send = self._issuing(send)

            async def replay() -> Message:
                return messages.pop(0) if messages else await receive()

            # Counted as a calls body is on the other paths: from admission until answered.
            tenant, size = caller_of(scope, self.registry).tenant, len(body)
            refused = self.queued_bytes.take(tenant, size)
            if refused is not None:
                self.executor.metrics.rejected.inc()
                await send_json_rpc_error(send, 429, -32000, refused, retry_after=self.retry_after)
                return
            try:
                await self.app(scope, replay, send)
            finally:
                self.queued_bytes.give_back(tenant, size)
        elif method == "DELETE" and (in_url or issued):
            await self._release(scope, send, in_url or issued)  # type: ignore[arg-type]
        elif method == "GET" and issued:
            message = "this endpoint is stateless: it offers no server-initiated stream (use POST)"
            await send_json_rpc_error(send, 405, -32600, message, allow="POST, DELETE")
        else:
            await self.app(scope, receive, send)

    def _issuing(self, send: Send) -> Send:
        """``send``, adding a new Mcp-Session-Id to a successful answer to ``initialize``."""

        async def issue(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 200:
                issued = f"mcp-{self.sessions.instance}-{secrets.token_hex(12)}"
                headers = [*message.get("headers", []), (_MCP_SESSION_KEY, issued.encode())]
                message = {**message, "headers": headers}
            await send(message)

        return issue

    async def _release(self, scope: Scope, send: Send, session: str) -> None:
        tenant = caller_of(scope, self.registry).tenant
        released = await self.sessions.release(tenant, session)
        self.executor.metrics.sessions.set(len(self.sessions))
        payload = orjson.dumps({"session": session, "released": released})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


async def send_json_rpc_error(
    send: Send,
    status: int,
    code: int,
    message: str,
    *,
    allow: str | None = None,
    retry_after: str | None = None,
) -> None:
    """An HTTP error whose body MCP clients can show: a JSON-RPC error with no id."""
    payload = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    if retry_after is not None:
        headers.append((b"retry-after", retry_after.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _inspect(body: bytes) -> tuple[bool, bool]:
    """Whether the body holds a request with a bad id, and whether it holds an ``initialize``."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False, False  # the SDK answers a parse error itself
    bad_id = initialize = False
    for item in data if isinstance(data, list) else [data]:
        if isinstance(item, dict) and "method" in item and "id" in item:
            request_id = item["id"]
            bad_id = bad_id or isinstance(request_id, bool) or not isinstance(request_id, str | int)
            initialize = initialize or item["method"] == "initialize"
    return bad_id, initialize


def keeps_session_state(entry: ToolEntry) -> bool:
    """Whether a call of ``entry`` takes the URL's or the MCP session's world.

    Tools with state per session do; so do upstream tools that are sent the session in
    ``_meta``. Verifiers never do: from inside a session one would show the policy its gold.
    """
    if entry.is_verifier:
        return False
    upstream_meta = entry.upstream is not None and bool(getattr(entry.upstream, "session_meta", False))
    return entry.meta.stateful or entry.needs_session or upstream_meta


class McpEndpoint:
    """``queued_bytes``: the server's bound on bodies admitted and not yet answered, shared with
    the HTTP API and the stream (api/queued_bytes.py)."""

    def __init__(self, executor: Executor, config: Config, bind_host: str, queued_bytes: QueuedBytes) -> None:
        self.executor = executor
        self.registry = executor.registry
        self.default_toolset = config.default_toolset
        self._tool_cache: dict[tuple[str | None, int], list[types.Tool]] = {}
        self._visible_cache: dict[tuple[str | None, int], set[str]] = {}
        self._id_prefix = os.urandom(6).hex()
        self._id_counter = itertools.count()
        self.server = Server(
            config.mcp.server_name,
            version="0.1.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            # Without this hook the SDK checks Mcp-Param headers by running tools/list
            # (every descriptor serialised) on each tools/call: a third of its cost.
            get_tool_input_schema=self._input_schema,
        )
        self.session_manager = StreamableHTTPSessionManager(
            app=self.server,
            json_response=True,
            stateless=True,
            security_settings=transport_security(config, bind_host),
            max_request_body_size=config.limits.max_request_bytes,
        )
        self.asgi = _McpAsgi(StreamableHTTPASGIApp(self.session_manager), executor, queued_bytes)

    def _new_call_id(self) -> str:
        # Only the client can retry with the same id, so a call without one needs an id
        # that is unique, not unguessable: a counter (uuid4 costs a urandom syscall).
        return f"mcp-{self._id_prefix}-{next(self._id_counter)}"

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        entry = self.registry.entries.get(name)
        return entry.input_schema if entry is not None else None

    def _scope(self, ctx: Any) -> tuple[str | None, Caller]:
        """The toolset named in the URL, and who calls (tenant, tools the token allows)."""
        request = getattr(ctx, "request", None)
        toolset = self.default_toolset
        caller = ANONYMOUS
        if request is not None:
            toolset = request.path_params.get("toolset", toolset)
            caller = caller_of(request.scope, self.registry)
        if toolset is not None and toolset not in self.registry.toolsets:
            toolset = None if toolset == self.default_toolset else toolset
        return toolset, caller

    def _visible(self, toolset: str | None, allowed: frozenset[str] | None) -> list[str]:
        names = (
            self.registry.names_in(toolset) if toolset in self.registry.toolsets or toolset is None else []
        )
        return [n for n in names if allowed is None or n in allowed]

    async def _list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        toolset, caller = self._scope(ctx)
        allowed = caller.allowed
        key = (toolset, self.registry.version)
        tools = self._tool_cache.get(key) if allowed is None else None
        if tools is None:
            tools = [
                types.Tool.model_validate(self.registry.entries[n].descriptor())
                for n in self._visible(toolset, allowed)
            ]
            if allowed is None:
                self._tool_cache[key] = tools
        hidden = self._refused_by_task(ctx, caller)
        if hidden:
            tools = [tool for tool in tools if tool.name not in hidden]
        return types.ListToolsResult(tools=tools)

    def _refused_by_task(self, ctx: Any, caller: Caller) -> frozenset[str]:
        """The tools the task of the URL's session (``/mcp/{toolset}/s/{session}``, bound to a
        task) would refuse its agent: a list that offered them would invite calls that fail."""
        request = getattr(ctx, "request", None)
        host = self.registry.environments
        session_id = request.path_params.get("session") if request is not None else None
        if session_id is None or host is None:
            return frozenset()
        binding = host.binding(self.executor.sessions.peek(caller.tenant, session_id))
        if binding is None:
            return frozenset()
        pack, task = host.resolve(binding.pack, binding.task)
        prefix = host.prefixes.get(pack.id, "")
        return frozenset(prefix + tool.name for tool in pack.tools if refusal(task, tool.name) is not None)

    def _visible_set(self, toolset: str | None, allowed: frozenset[str] | None) -> set[str]:
        if allowed is not None:
            return set(self._visible(toolset, allowed))
        key = (toolset, self.registry.version)
        names = self._visible_cache.get(key)
        if names is None:
            names = self._visible_cache[key] = set(self._visible(toolset, None))
        return names

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        toolset, caller = self._scope(ctx)
        visible = self._visible_set(toolset, caller.allowed)
        meta = params.meta or {}
        call_id = meta.get(CALL_ID_META_KEY)
        session = meta.get(SESSION_META_KEY)
        expected = meta.get(INSTANCE_META_KEY)
        if call_id is not None or session is not None or expected is not None:  # else nothing to check
            for key, value in (
                (CALL_ID_META_KEY, call_id),
                (SESSION_META_KEY, session),
                (INSTANCE_META_KEY, expected),
            ):
                if value is not None and not _is_id(value):
                    message = (
                        f"_meta[{key!r}] must be a non-empty string of at most {MAX_ID_LENGTH} characters"
                    )
                    return _to_call_tool_result(Result.failure("", ErrorKind.BAD_REQUEST, message))
        mcp_session = False  # the world is the MCP session's (Mcp-Session-Id)
        if session is None and params.name in visible:
            session, issuer, mcp_session = self._implicit_session(ctx, params.name)
            expected = issuer or expected  # an MCP session's id names its process
        call = Call(call_id or self._new_call_id(), params.name, params.arguments or {}, session)
        if params.name not in visible:  # hint only at what this endpoint serves (none in a session)
            message = unknown_tool_message(params.name, visible, in_session=session is not None)
            result = Result.failure(call.call_id, ErrorKind.UNKNOWN_TOOL, message)
        elif session is not None and (lost := self.executor.sessions.fence(expected, session)):
            message = _MCP_SESSION_ELSEWHERE.format(instance=expected) if mcp_session else lost
            result = Result.failure(call.call_id, ErrorKind.UNKNOWN_SESSION, message)
        elif ENV_META_KEY in meta and (refused := self._bind(caller, session, meta[ENV_META_KEY])):
            result = Result.failure(call.call_id, *refused)
        else:
            result = await self.executor.run_one(call, caller)
            if mcp_session and result.error is not None and result.error.kind == ErrorKind.UNKNOWN_SESSION:
                # The generic text asks for a new session id, which such a client cannot choose.
                message = _MCP_SESSION_GONE.format(ttl=self.executor.sessions.ttl_s)
                result = Result.failure(call.call_id, ErrorKind.UNKNOWN_SESSION, message, result.elapsed_ms)
        instance = self.executor.sessions.instance if session else None
        return _to_call_tool_result(result, instance, session)

    def _implicit_session(self, ctx: Any, name: str) -> tuple[str | None, str | None, bool]:
        """The world of a call that names no session in ``_meta``: the URL's session, else the
        MCP session's, for a tool that keeps state per session (``keeps_session_state``).

        Returns the session id, the process (instance) that issued it, for an MCP session's,
        and whether it is the MCP session's.
        """
        request = getattr(ctx, "request", None)
        entry = self.registry.entries.get(name)
        if request is None or entry is None or not keeps_session_state(entry):
            return None, None, False
        in_url = request.path_params.get("session")
        if in_url is not None:
            return in_url, None, False
        header = request.headers.get(MCP_SESSION_HEADER)
        issued = _ISSUED_ID.fullmatch(header) if header else None
        if issued is None:
            return None, None, False
        return header, issued.group(1), True

    def _bind(self, caller: Caller, session: str | None, environment: Any) -> tuple[ErrorKind, str] | None:
        """Bind the call's session to ``_meta[ENV_META_KEY]`` (an environment task); why not, if refused.

        MCP has no session endpoint, so a client binds on a call (the first one, or every
        one: binding again to the same task changes nothing).
        """
        from tool_server.environments import check_environment

        if session is None:
            message = (
                f"_meta[{ENV_META_KEY!r}] binds the call's session: send _meta[{SESSION_META_KEY!r}] too, "
                "or call through /mcp/{toolset}/s/{session}"
            )
            return ErrorKind.BAD_REQUEST, message
        try:
            pack, task = check_environment(self.registry.environments, environment)
            state = self.executor.sessions.open(caller.tenant, session)
            self.registry.environments.bind(state, pack, task)
        except LookupError as exc:
            return ErrorKind.BAD_REQUEST, str(exc.args[0])
        except ToolError as exc:
            return exc.kind, exc.message
        return None


def _is_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH
