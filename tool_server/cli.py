"""``tool-server``: serve the tools, list them, or check a config file."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from tool_server.api.auth import all_loopback, bound_addresses, load_tokens
from tool_server.api.origin import HostPolicy
from tool_server.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load_config
from tool_server.registry import ALL_TOOLSETS, Registry

# Keepalive pings on /v1/stream connections: one every interval, closed when a pong is later.
WS_PING_INTERVAL_S = 20.0
WS_PING_TIMEOUT_S = 20.0


def _add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"YAML config file (default: the built-in {DEFAULT_CONFIG_PATH.name}: built-in tools and corpus). "
        "Any key can be overridden by TOOLFACTORY__SECTION__KEY environment variables.",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tool-server",
        description="toolfactory tool server: MCP at /mcp, batched HTTP API at /v1/calls, verifiers at /v1/verify.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server (uvicorn, one worker)")
    _add_config_arg(serve)
    serve.add_argument("--host", default=None, help="bind address (default from config: 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=None, help="port (default from config: 8000; 0 = any free port)"
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow binding a non-loopback address without auth tokens (never do this on a shared network)",
    )
    serve.add_argument("--log-level", default=None, help="uvicorn/server log level (default: info)")

    tools = sub.add_parser("tools", help="list the configured tools and their schemas as JSON")
    _add_config_arg(tools)
    tools.add_argument("--toolset", default=None, help="only this toolset ('*' or none given: every tool)")
    tools.add_argument(
        "--probe",
        action="store_true",
        help="start the upstream MCP servers (mcpServers) and list their tools too; without it they are left out",
    )

    check = sub.add_parser(
        "check-config",
        help="load the config, import every tool and check the mcpServers entries as serve does; "
        "exit 2 on a configuration error, 1 when --probe finds an upstream down or a name clash",
    )
    _add_config_arg(check)
    check.add_argument(
        "--probe",
        action="store_true",
        help="also start each upstream MCP server and list its tools and clashes",
    )
    from tool_server.env_cli import add_env_parser

    add_env_parser(sub, _add_config_arg)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:
        # `tool-server tools | head`: the reader left; say nothing more, as cat does. Point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        if args.command == "serve":
            return _serve(config, args)
        if args.command == "env":
            from tool_server.env_cli import run_env

            return run_env(args, config)
        from tool_server.app import build_registry, build_upstreams

        registry = build_registry(config)
        upstreams = build_upstreams(config)  # the same checks as serve: keys, ${VAR}s, names
        _check_as_serve(config, registry)
        report = _probe(upstreams, registry, config.default_toolset) if args.probe else []
        if args.command == "tools":
            if args.toolset not in (None, ALL_TOOLSETS, *registry.toolsets):
                known = ", ".join(sorted(registry.toolsets)) or "none"
                raise ConfigError(
                    f"--toolset: no toolset named {args.toolset!r}; known toolsets: {known}, '*'"
                )
            sys.stdout.write(
                orjson.dumps(registry.descriptors(args.toolset), option=orjson.OPT_INDENT_2).decode()
            )
            sys.stdout.write("\n")
            if upstreams and not args.probe:
                print(f"tool-server: {_left_out(upstreams)}", file=sys.stderr)
            for line in (line for ok, line in report if not ok):
                print(f"tool-server: {line}", file=sys.stderr)  # their tools are missing from the list
            return 0
        print(f"config OK: {len(registry.entries)} tools, toolsets: {', '.join(sorted(registry.toolsets))}")
        if not registry.entries and not upstreams:
            print(SERVES_NOTHING, file=sys.stderr)
        if upstreams and not args.probe:
            print(_left_out(upstreams))
        for ok, line in report:
            print(line if ok else f"PROBLEM {line}")
        return 0 if all(ok for ok, _ in report) else 1
    except ConfigError as exc:
        print(f"tool-server: configuration error: {exc}", file=sys.stderr)
        return 2


# A config of one's own replaces the built-in one: without `extends: builtin` (or tools of its
# own) it is valid and serves nothing, which a newcomer found only as an empty /ui.
SERVES_NOTHING = (
    "warning: this config serves nothing (no tools, verifiers, environments or upstream servers): "
    "a config file replaces the built-in one; add `extends: builtin` to keep the built-in tools"
)


def _check_as_serve(config: Config, registry: Registry) -> None:
    """Refuse what ``serve`` refuses beyond the registry and the upstreams (checked by the
    caller): the parts ``create_app`` builds from the config, in this environment (tokens from
    $TOOLFACTORY_TOKENS or auth.tokens_file), without starting anything."""
    from tool_server.api.queued_bytes import QueuedBytes
    from tool_server.api.routes import HttpApi
    from tool_server.executor.executor import Executor

    tokens = load_tokens(config.auth)  # a short token, a missing tokens_file
    allowed_hosts = [*config.server.allowed_hosts, *config.mcp.allowed_hosts]
    HostPolicy.build([], allowed_hosts, tokens=bool(tokens))  # spelling; "*" needs tokens
    executor = Executor(registry, config)  # per-tenant shares of calls and sessions
    QueuedBytes(config.limits)  # its bounds fit a request of the largest size
    if config.workbench.enabled:  # its index limits and tokenizer file
        from tool_server.workbench.routes import Workbench

        api = HttpApi(
            executor, default_toolset=config.default_toolset, retry_after_s=config.limits.retry_after_s
        )
        Workbench(config, api, token_required=bool(tokens)).close()


def _left_out(upstreams: list[Any]) -> str:
    names = ", ".join(server.name for server in upstreams)
    return (
        f"{len(upstreams)} upstream MCP server(s) configured ({names}); not started, so their tools are "
        "left out: --probe starts them and lists their tools"
    )


def _probe(upstreams: list[Any], registry: Any, default_toolset: str | None) -> list[tuple[bool, str]]:
    """Start every upstream (at once), add their tools to ``registry``, report each; stop them.

    One ``(ok, line)`` per finding: a server's tools, or why it is down, or a name clash.
    """
    if not upstreams:
        return []
    from tool_server.upstream.hosting import Upstreams

    group = Upstreams(upstreams, registry, [default_toolset] if default_toolset else [])

    async def run() -> list[tuple[bool, str]]:
        await group.start(wait=True)
        try:
            return [finding for server in upstreams for finding in _probe_findings(group, server)]
        finally:
            await group.stop()

    return asyncio.run(run())


def _probe_findings(group: Any, server: Any) -> list[tuple[bool, str]]:
    status = group.status(server)
    if not server.healthy:
        return [(False, f"upstream {server.name}: {status['state']}: {status['last_error']}")]
    names = [tool.name for tool in server.catalog]
    version = status["protocol_version"]
    findings = [(True, f"upstream {server.name}: ready ({version}), {len(names)} tools: {', '.join(names)}")]
    return findings + [(False, f"upstream {server.name}: {clash}") for clash in status["clashes"]]


def tune_gc(threshold: int) -> None:
    """Fewer young-generation collections, and none over the objects built at startup.

    The registry, schemas and search index live as long as the process: freezing them
    keeps every later collection from walking them again. Serving a batch of trivial
    calls is about a quarter cheaper (bench/README.md).
    """
    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)


def _serve(config, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    import uvicorn

    from tool_server.app import create_app

    host = args.host if args.host is not None else config.server.host
    port = config.server.port if args.port is None else args.port
    if host is None:
        print(
            "tool-server: server.host is empty (an empty TOOLFACTORY__SERVER__HOST?). Give the address "
            "to listen on: 127.0.0.1 for this machine only, 0.0.0.0 for every interface (needs tokens).",
            file=sys.stderr,
        )
        return 2
    addresses = bound_addresses(host, port)
    if not addresses:
        print(f"tool-server: cannot resolve the bind address {host!r}", file=sys.stderr)
        return 2
    insecure = args.insecure or config.server.insecure
    # Decided from the addresses the listener binds, not from the spelling of host
    # ("" binds every interface).
    if not all_loopback(addresses) and not load_tokens(config.auth) and not insecure:
        print(
            f"tool-server: refusing to bind {host!r} ({', '.join(addresses)}) without auth. Set tokens in "
            f"${config.auth.tokens_env} (e.g. TOOLFACTORY_TOKENS=<secret of 16+ chars>) or "
            "auth.tokens_file, or pass --insecure.",
            file=sys.stderr,
        )
        return 2
    from tool_server.listen import AnnouncingServer, port_in_use

    taken = port_in_use(addresses, port)  # before the start-up, which takes seconds and says ready
    if taken:
        print(f"tool-server: {taken}", file=sys.stderr)
        return 3
    log_level = (args.log_level or config.server.log_level).lower()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)
    app = create_app(config, bind_host=host)
    if not all_loopback(addresses) and not config.server.allow_weak_sandbox and app.state.sandbox_users:
        # Before the port opens: code a model wrote must not be reachable from the network
        # with only the weak sandbox unless the operator said so (tool_server/sandbox_mode.py).
        from tool_server.sandbox_mode import probe, weak_exposure

        app.state.sandbox_mode = mode = probe()  # the lifespan logs it
        refusal = weak_exposure(mode, app.state.sandbox_users, f"{host!r} ({', '.join(addresses)})")
        if refusal is not None:
            print(f"tool-server: {refusal}", file=sys.stderr)
            return 2
    tune_gc(config.server.gc_threshold)
    from tool_server.api.connections import guarded_protocol, limits_from_config
    from tool_server.api.ws_frames import guarded_websocket_protocol

    protocol = guarded_protocol(limits_from_config(config.server, config.limits.retry_after_s))
    app.state.connection_guard = protocol.guard  # its counts go to /metrics
    uv_config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=config.server.shutdown_grace_s,
        # Header/body timeouts and the connection cap live in the protocol; uvicorn's own
        # limit_concurrency would also count in-flight requests (see connections.py).
        http=protocol,
        timeout_keep_alive=config.server.keep_alive_s,  # type: ignore[arg-type]  # a float works
        limit_concurrency=None,
        backlog=4096,
        # /v1/stream (api/stream.py): counted as connections; a frame is a request body, so the
        # same size limit, refused before it is read whole; pings find dead peers (an unanswered
        # one closes the connection). No per-message deflate: it costs CPU on every frame, and
        # the HTTP answers are not compressed either.
        ws=guarded_websocket_protocol(protocol.guard),
        ws_max_size=config.limits.max_request_bytes,
        ws_ping_interval=WS_PING_INTERVAL_S,
        ws_ping_timeout=WS_PING_TIMEOUT_S,
        ws_per_message_deflate=False,
    )
    server = AnnouncingServer(uv_config, tools=lambda: len(app.state.registry.entries))
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is a stop, not an error
        server.run()
    return 0 if server.started else 3  # 3: uvicorn's start-up failure (a bind that failed all the same)


if __name__ == "__main__":
    raise SystemExit(main())
