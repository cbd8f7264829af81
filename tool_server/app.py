"""Compose the Starlette app: registry → executor → HTTP API + MCP endpoint, with middleware."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from tool_server.api.auth import AuthMiddleware, BodyLimitMiddleware, bound_addresses, load_tokens
from tool_server.api.internal_errors import internal_error_message, log_internal_error
from tool_server.api.mcp import McpEndpoint
from tool_server.api.origin import HostPolicy, RequestOriginMiddleware
from tool_server.api.retrieve import RetrieveEndpoint
from tool_server.api.routes import HttpApi, error_response
from tool_server.api.stream import CallStream
from tool_server.config import Config, ConfigError
from tool_server.executor.executor import Executor
from tool_server.memory_trim import IdleTrimmer, malloc_trim_function
from tool_server.metrics import Metrics
from tool_server.registry import Registry
from tool_server.sandbox_mode import log_mode, probe, sandbox_users

log = logging.getLogger("tool_server")


def configure_sandbox(config: Config) -> None:
    """This replica's slice of sandbox uids, claimed on the node when ``claims_dir`` is set."""
    from tools.sandbox import configure_uids

    try:
        sandbox = config.sandbox
        auto = sandbox.replicas if sandbox.replica_index is None else None
        uids = configure_uids(sandbox.uids(), sandbox.claims_dir, replicas=auto)
        log.info("sandbox uids %d-%d", uids[0], uids[-1])
    except (ValueError, OSError) as exc:
        raise ConfigError(str(exc)) from None


def build_registry(config: Config) -> Registry:
    registry = Registry()
    for spec in config.tools:
        if spec.enabled:
            registry.add_spec(spec, default_timeout_s=config.limits.default_timeout_s)
    for spec in config.verifiers:
        if spec.enabled:
            registry.add_spec(spec, verifier=True, default_timeout_s=config.limits.default_timeout_s)
    if any(spec.enabled for spec in config.environments):
        from tool_server.environments import add_environments  # packs import their own code

        add_environments(registry, config.environments, config.limits.default_timeout_s)
    registry.define_toolsets(config.toolsets)
    return registry


def build_upstreams(config: Config) -> list[Any]:
    """The ``mcpServers`` (and VS Code's ``servers``) entries as UpstreamServers, not started.

    ``serve`` and ``check-config`` both come here, so they accept and refuse the same configs.
    """
    entries = upstream_entries(config)
    if not entries:
        return []
    from tool_server.upstream.hosting import load_upstreams

    try:
        return load_upstreams(entries, separator=config.upstream_separator)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def upstream_entries(config: Config) -> dict[str, Any]:
    both = set(config.mcpServers) & set(config.servers)
    if both:
        raise ConfigError(f"upstream servers {sorted(both)} are in both mcpServers and servers; keep one")
    return {**config.mcpServers, **config.servers}


def create_app(
    config: Config, *, bind_host: str | None = None, environ: dict[str, str] | None = None
) -> Starlette:
    """The whole server as one ASGI app. ``bind_host`` decides the Host checks (RequestOriginMiddleware).

    ``tool-server serve`` may have probed the sandbox already (``app.state.sandbox_mode``);
    otherwise the lifespan does, when a served tool runs untrusted code in it.
    """
    bind_host = config.server.host if bind_host is None else bind_host
    configure_sandbox(config)
    registry = build_registry(config)
    metrics = Metrics()
    executor = Executor(registry, config, metrics)
    api = HttpApi(executor, default_toolset=config.default_toolset, retry_after_s=config.limits.retry_after_s)
    tokens = load_tokens(config.auth, environ)
    # mcp.allowed_hosts named the hosts of /mcp before every route checked Host: they stay good.
    allowed_hosts = [*config.server.allowed_hosts, *config.mcp.allowed_hosts]
    hosts = HostPolicy.build(bound_addresses(bind_host), allowed_hosts, tokens=bool(tokens))
    upstreams = _upstreams(build_upstreams(config), registry, config.default_toolset)
    # Starlette tries routes in order: the hot ones (/v1/calls, the stream, then MCP) come first.
    calls_route, *other_routes = api.routes()
    stream = CallStream(
        api,
        max_frame_bytes=config.limits.max_request_bytes,
        max_in_flight=config.limits.max_calls_per_batch,
    )
    routes: list[Any] = [
        calls_route,
        WebSocketRoute("/v1/stream", stream),
        Route("/v1/stream", _stream_over_http, methods=["GET"]),
    ]
    mcp = McpEndpoint(executor, config, bind_host, api.queued_bytes) if config.mcp.enabled else None
    if mcp is not None:
        routes += [
            Route("/mcp", mcp.asgi, methods=["GET", "POST", "DELETE"]),
            Route("/mcp/{toolset}", mcp.asgi, methods=["GET", "POST", "DELETE"]),
            # A session in the URL: a world for MCP clients that cannot set _meta (api/mcp.py).
            Route("/mcp/{toolset}/s/{session}", mcp.asgi, methods=["GET", "POST", "DELETE"]),
        ]
    routes += other_routes
    if config.retrieve.tool and config.retrieve.tool in registry:
        retrieve = RetrieveEndpoint(executor, api, config.retrieve.tool, config.retrieve.default_topk)
        routes.append(Route("/retrieve", retrieve.handle, methods=["POST"]))
    public_paths = list(config.auth.public_paths)
    workbench = None
    if config.workbench.enabled:
        from tool_server.workbench.routes import Workbench

        workbench = Workbench(config, api, token_required=bool(tokens))
        routes += workbench.routes()
        public_paths += workbench.public_paths  # the page's static files; its data needs the token

    sandboxed = sandbox_users(registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await executor.start()
        if sandboxed:
            mode = getattr(app.state, "sandbox_mode", None) or await anyio.to_thread.run_sync(probe)
            log_mode(mode, sandboxed)
            api.sandbox = mode.summary(sandboxed)
        if upstreams is not None:
            # In the background: /healthz answers now, each upstream's tools join as it comes up.
            await upstreams.start()
            api.readiness_checks += _upstream_checks(upstreams, metrics)
        async with contextlib.AsyncExitStack() as stack:
            if mcp is not None:
                await stack.enter_async_context(mcp.session_manager.run())
            if gc.get_freeze_count():
                # The process froze what it built before serving (`tool-server serve`: tune_gc):
                # what the tools loaded at start (indexes, pools) joins it, so no collection
                # walks it again.
                gc.collect()
                gc.freeze()
            metrics.gc_pauses.watch()
            stack.callback(metrics.gc_pauses.unwatch)
            trimmer = IdleTrimmer(
                config.server.memory_trim_idle_s,
                lambda: (executor.admitted, executor.results_stored, *executor.store_sizes().values()),
                malloc_trim_function(),
            )
            stack.callback(asyncio.create_task(trimmer.run()).cancel)
            api.ready = True
            log.info("tool server started: %d tools", len(registry.entries))  # ready once it listens: cli
            try:
                yield
            finally:
                api.ready = False
                await executor.drain(config.server.shutdown_grace_s)
        if upstreams is not None:
            await upstreams.stop()  # all at once, handshakes in progress included
        await executor.stop()
        if workbench is not None:
            workbench.close()

    async def on_error(request: Request, exc: Exception) -> Response:
        # Only our own bugs land here: a tool's fault is a result, admission failures 429.
        request_id = log_internal_error(log, f"{request.method} {request.url.path}", exc)
        return error_response(500, "internal", internal_error_message(request_id))

    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(BodyLimitMiddleware, max_bytes=config.limits.max_request_bytes),
            Middleware(AuthMiddleware, tokens=tokens, public_paths=public_paths),
            Middleware(RequestOriginMiddleware, policy=hosts),
        ],
        lifespan=lifespan,
        exception_handlers={Exception: on_error},
    )
    app.state.executor = executor
    app.state.registry = registry
    app.state.tokens = tokens
    app.state.sandbox_users = sandboxed
    return app


async def _stream_over_http(request: Request) -> Response:
    """A plain GET of the stream: say that it is a WebSocket (426 Upgrade Required)."""
    return error_response(
        426,
        "bad_request",
        "/v1/stream is a WebSocket: connect to ws://HOST:PORT/v1/stream (wss:// behind TLS), e.g. with "
        "trainer_client.client.stream.StreamClient; POST /v1/calls takes the same calls over HTTP",
        {"Upgrade": "websocket"},
    )


def _upstreams(servers: list[Any], registry: Registry, default_toolset: str | None) -> Any:
    if not servers:
        return None
    from tool_server.upstream.hosting import Upstreams

    return Upstreams(servers, registry, [default_toolset] if default_toolset else [])


def _upstream_checks(upstreams: Any, metrics: Metrics) -> list[Any]:
    """/readyz entries: which upstreams are up, starting or down, and their name clashes.

    Only servers marked ``required`` decide readiness; the others are reported. Read-only:
    the registry follows the upstreams by itself (``Upstreams.reconcile``).
    """

    def summary() -> tuple[str, bool, dict[str, Any]]:
        ok, detail = upstreams.summary()
        return "upstreams", ok, detail

    def check_of(server: Any) -> Any:
        def check() -> tuple[str, bool, dict[str, Any]]:
            status = upstreams.status(server)
            metrics.upstream_up.labels(server.name).set(1 if server.healthy else 0)
            metrics.upstream_restarts.labels(server.name).set(status["restarts"])
            return f"upstream:{server.name}", server.healthy or not server.required, status

        return check

    return [summary, *(check_of(server) for server in upstreams.servers)]
