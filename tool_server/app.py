"""Compose the Starlette app: registry → executor → HTTP API + MCP endpoint, with middleware."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tool_server.auth import AuthMiddleware, BodyLimitMiddleware, load_tokens
from tool_server.config import Config, ConfigError
from tool_server.executor import Executor
from tool_server.http_api import HttpApi, error_response
from tool_server.mcp_endpoint import McpEndpoint
from tool_server.metrics import Metrics
from tool_server.registry import Registry
from tool_server.retrieve import RetrieveEndpoint

log = logging.getLogger("tool_server")


def build_registry(config: Config) -> Registry:
    registry = Registry()
    for spec in config.tools:
        if spec.enabled:
            registry.add_spec(spec, default_timeout_s=config.limits.default_timeout_s)
    for spec in config.verifiers:
        if spec.enabled:
            registry.add_spec(spec, verifier=True, default_timeout_s=config.limits.default_timeout_s)
    registry.define_toolsets(config.toolsets)
    return registry


def build_upstreams(config: Config) -> list[Any]:
    if not config.mcpServers:
        return []
    from tool_server.upstream import load_upstreams

    try:
        return load_upstreams(config.mcpServers, separator=config.upstream_separator)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def create_app(
    config: Config, *, bind_host: str | None = None, environ: dict[str, str] | None = None
) -> Starlette:
    """The whole server as one ASGI app. ``bind_host`` decides the MCP Host checks."""
    bind_host = config.server.host if bind_host is None else bind_host
    registry = build_registry(config)
    metrics = Metrics()
    executor = Executor(registry, config, metrics)
    api = HttpApi(executor, default_toolset=config.default_toolset, retry_after_s=config.limits.retry_after_s)
    tokens = load_tokens(config.auth, environ)
    upstreams = build_upstreams(config)
    # Starlette tries routes in order: the hot ones (/v1/calls, then MCP) come first.
    calls_route, *other_routes = api.routes()
    routes: list[Any] = [calls_route]
    mcp = McpEndpoint(executor, config, bind_host) if config.mcp.enabled else None
    if mcp is not None:
        routes += [
            Route("/mcp", mcp.asgi, methods=["GET", "POST", "DELETE"]),
            Route("/mcp/{toolset}", mcp.asgi, methods=["GET", "POST", "DELETE"]),
        ]
    routes += other_routes
    if config.retrieve.tool and config.retrieve.tool in registry:
        retrieve = RetrieveEndpoint(executor, api, config.retrieve.tool, config.retrieve.default_topk)
        routes.append(Route("/retrieve", retrieve.handle, methods=["POST"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await executor.start()
        for upstream in upstreams:
            await upstream.start()  # returns even when unreachable; a supervisor keeps reconnecting
            _register_upstream(registry, upstream, config.default_toolset)
            api.readiness_checks.append(_upstream_check(upstream, registry, metrics, config.default_toolset))
        async with contextlib.AsyncExitStack() as stack:
            if mcp is not None:
                await stack.enter_async_context(mcp.session_manager.run())
            api.ready = True
            log.info("tool server ready: %d tools", len(registry.entries))
            try:
                yield
            finally:
                api.ready = False
                await executor.drain(config.server.shutdown_grace_s)
        for upstream in upstreams:
            await upstream.stop()
        await executor.stop()

    async def on_error(request: Request, exc: Exception) -> Response:
        # Only our own bugs land here: a tool's fault is a result, admission failures 429.
        request_id = uuid.uuid4().hex[:12]
        log.error(
            "unhandled error on %s %s (request %s)",
            request.method,
            request.url.path,
            request_id,
            exc_info=exc,
        )
        return error_response(
            500,
            "internal",
            f"internal server error (a bug in toolfactory); the server log has it under request {request_id}",
        )

    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(BodyLimitMiddleware, max_bytes=config.limits.max_request_bytes),
            Middleware(AuthMiddleware, tokens=tokens, public_paths=config.auth.public_paths),
        ],
        lifespan=lifespan,
        exception_handlers={Exception: on_error},
    )
    app.state.executor = executor
    app.state.registry = registry
    app.state.tokens = tokens
    return app


def _register_upstream(registry: Registry, upstream: Any, default_toolset: str | None) -> None:
    """Match the registry to the upstream's tool list: it may come up, or change, after start.

    New tools are added; tools it no longer lists are removed (a call to one then gets
    ``unknown_tool`` instead of an upstream error). Only called with a fresh list.
    """
    offered = {descriptor["name"] for descriptor in upstream.tools}
    for name in [n for n, e in registry.entries.items() if e.upstream is upstream and n not in offered]:
        log.warning("upstream %s no longer offers tool %r; removed", getattr(upstream, "name", "?"), name)
        registry.remove(name)
    for descriptor in upstream.tools:
        name = descriptor["name"]
        existing = registry.get(name)
        if existing is not None:
            if existing.upstream is not upstream:
                log.error("upstream tool %r clashes with a configured tool; not exposed", name)
            continue

        async def call(call: Any, timeout_s: float, _name: str = name) -> Any:
            return await upstream.call(
                upstream.local_name(_name), call.arguments, timeout_s, call_id=call.call_id
            )

        registry.add_upstream_tool(descriptor, upstream, call, [default_toolset] if default_toolset else [])


def _upstream_check(upstream: Any, registry: Registry, metrics: Metrics, default_toolset: str | None) -> Any:
    def check() -> tuple[str, bool, dict[str, Any]]:
        status = upstream.status()
        if upstream.healthy:
            _register_upstream(registry, upstream, default_toolset)
        metrics.upstream_up.labels(upstream.name).set(1 if upstream.healthy else 0)
        metrics.upstream_restarts.labels(upstream.name).set(status.get("restarts", 0))
        return f"upstream:{upstream.name}", bool(upstream.healthy), status

    return check
