"""Upstream MCP servers (stdio or streamable HTTP) re-exported under a namespace.

``load_upstreams`` makes one ``UpstreamServer`` per ``mcpServers`` entry; ``Upstreams``
starts them and keeps the registry in step with their tool lists. The parts:

* ``hosting``: ``Upstreams`` and ``load_upstreams``, the whole set as the server sees it;
* ``config``: an entry's transport (``StdioSpec``/``HttpSpec``) and options;
* ``server``: ``UpstreamServer``, one server's settings, catalog and calls;
* ``tools``: exported names, argument checks, ``UpstreamTool``;
* ``calls``: what a call sends besides its arguments, and what its outcome becomes;
* ``supervisor``: the connection kept alive (reconnects, probes, tool-list changes);
* ``sessions``: the per-session processes of a ``per_session`` server;
* ``transport``, ``stdio`` and ``stderr``: the connection, the bounded stdio reader, and what
  the process said;
* ``reaper``: the small process a stdio server runs under, which takes every process the
  server started down with it (at release, at shutdown, and when the tool server dies).

Argument and result schemas from upstreams are checked with ``tools.patterns`` (patterns on
RE2, in linear time); a tool whose pattern RE2 cannot run is not served.
"""

from tool_server.upstream.hosting import (
    CLIENT_ONLY_KEYS,
    MAX_NAME_LENGTH,
    OPTION_KEYS,
    HttpSpec,
    StdioSpec,
    Upstreams,
    UpstreamServer,
    UpstreamTool,
    export_names,
    load_upstreams,
    parse_servers,
    parse_spec,
    relevant_stderr,
    schema_validator,
)

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
