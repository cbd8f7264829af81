"""What the server speaks: the batched HTTP API and its WebSocket stream, the MCP endpoint,
its OpenAPI description, the Search-R1 ``/retrieve`` route, and the auth, size and connection
limits in front of them.

* ``routes``: ``/v1/calls``, ``/v1/verify``, ``/v1/tools``, sessions, health (``HttpApi``);
* ``stream``: ``/v1/stream``, the same calls over one WebSocket, answered as they finish (``CallStream``);
* ``mcp``: the official MCP SDK's low-level server over the registry and executor;
* ``openapi``: the OpenAPI 3.1 document of the HTTP API;
* ``retrieve``: Search-R1's ``POST /retrieve``, served by a configured search tool;
* ``auth``: bearer tokens (a token is a tenant) and request-size limits, as ASGI middleware;
* ``origin``: what a web page could send refused (a foreign Host or Origin, a POST body not
  declared JSON), as ASGI middleware;
* ``connections``: header and body read timeouts and a cap on open connections for uvicorn.

``tool_server.app`` composes them; nothing here is imported by the executor or the tools.
"""
