"""Bearer-token auth and request-size limits, as plain ASGI middleware (cheap per request)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tool_server.config import AuthConfig, ConfigError


def sees_server_wide(scope: Scope, *, public_by_choice: bool = False) -> bool:
    """Whether the caller may see figures that name every tool and upstream (``/metrics``,
    ``/readyz``'s checks, the workbench's live page): a token for every toolset, or a server
    without tokens. Not a token scoped to some toolsets (the other tools are not its to list),
    nor a caller without a token on a public path, unless ``public_by_choice``: the figures
    are the path's whole answer and the operator listed it in ``auth.public_paths``."""
    state = scope.get("state") or {}
    if public_by_choice and state.get("public"):
        return True
    return not state.get("anonymous") and state.get("toolsets") is None


@dataclass(frozen=True, slots=True)
class Token:
    secret: str
    toolsets: frozenset[str] | None  # None: every tool
    # A token is a tenant: stored results and sessions belong to it. Derived from the
    # secret (not its position in the list), so every replica names it the same way.
    tenant: str = field(init=False)
    secret_bytes: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        secret = self.secret.encode()
        object.__setattr__(self, "secret_bytes", secret)
        object.__setattr__(self, "tenant", "t-" + hashlib.sha256(secret).hexdigest()[:16])


def parse_token_entries(text: str, source: str) -> list[Token]:
    """``secret`` or ``secret:toolsetA+toolsetB``; entries separated by commas or newlines."""
    tokens = []
    for raw in text.replace(",", "\n").splitlines():
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        secret, _, scopes = entry.partition(":")
        secret = secret.strip()
        if len(secret) < 16:
            raise ConfigError(f"{source}: a token must be at least 16 characters long (got {len(secret)})")
        toolsets = frozenset(s.strip() for s in scopes.split("+") if s.strip()) or None
        tokens.append(Token(secret, toolsets))
    return tokens


def load_tokens(config: AuthConfig, environ: dict[str, str] | None = None) -> list[Token]:
    environ = dict(os.environ) if environ is None else environ
    tokens = parse_token_entries(environ.get(config.tokens_env, ""), f"${config.tokens_env}")
    if config.tokens_file:
        path = Path(config.tokens_file)
        try:
            tokens += parse_token_entries(path.read_text(), str(path))
        except FileNotFoundError:
            raise ConfigError(f"auth.tokens_file {path} does not exist") from None
    return tokens


def bound_addresses(host: str, port: int = 0) -> list[str]:
    """The addresses a listener on ``host`` binds, resolved the way the server resolves them.

    ``""`` (like ``0.0.0.0`` and ``::``) means every interface: asyncio passes it to
    getaddrinfo with AI_PASSIVE, which answers the wildcard addresses. ``[::1]`` is read
    as ``::1``. A name that does not resolve binds nothing (an empty list).
    """
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError):
        return []
    return sorted({info[4][0] for info in infos})


def all_loopback(addresses: list[str]) -> bool:
    """True when there are addresses and every one is a loopback address."""
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def is_loopback(host: str) -> bool:
    """True only when every address a listener on ``host`` would bind is a loopback one.

    Decided from the resolved addresses, never from the spelling: ``""`` binds every
    interface, and a name may resolve to public addresses.
    """
    return all_loopback(bound_addresses(host))


def error_body(path: str, kind: str, message: str) -> dict:
    """A middleware's refusal: a JSON-RPC error on the MCP endpoint, our error object elsewhere."""
    if path == "/mcp" or path.startswith("/mcp/"):
        # MCP clients show a JSON-RPC error's message; any other body only as
        # "Server returned an error response".
        return {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": f"{kind}: {message}"}}
    return {"error": {"kind": kind, "message": message}}


async def send_json(
    send: Send,
    status: int,
    body: dict,
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    prefix: str = "http",
) -> None:
    """An HTTP answer with a JSON body; ``prefix="websocket.http"`` refuses a WebSocket handshake."""
    payload = orjson.dumps(body)
    await send(
        {
            "type": f"{prefix}.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ]
            + (headers or []),
        }
    )
    await send({"type": f"{prefix}.response.body", "body": payload})


# Scopes a middleware checks: plain requests and WebSocket handshakes (GET /v1/stream). Any
# other (lifespan) passes through.
GUARDED_SCOPES = frozenset({"http", "websocket"})
_DENIAL_RESPONSE = "websocket.http.response"  # the ASGI extension uvicorn offers


async def refuse(
    scope: Scope, send: Send, status: int, body: dict, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Refuse a request, or a WebSocket handshake before it is accepted, with our JSON error.

    A handshake gets the same HTTP answer as a request where the server speaks the ASGI
    ``websocket.http.response`` extension (uvicorn does); elsewhere a close before accept,
    which the server sends as a bare 403. Either way no WebSocket is opened.
    """
    if scope["type"] == "http":
        await send_json(send, status, body, headers)
    elif _DENIAL_RESPONSE in (scope.get("extensions") or {}):
        await send_json(send, status, body, headers, prefix="websocket.http")
    else:
        await send({"type": "websocket.close", "code": 1008})  # 1008: policy violation


class AuthMiddleware:
    """Checks ``Authorization: Bearer``; stores the token's allowed toolsets in ``scope["state"]``.

    A WebSocket handshake is checked as a request is: its token decides the tenant and the
    toolsets of the whole connection, and without a valid one no WebSocket is opened (401).
    """

    def __init__(self, app: ASGIApp, tokens: list[Token], public_paths: list[str]) -> None:
        self.app = app
        self.tokens = tokens
        self.public = set(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in GUARDED_SCOPES or not self.tokens:
            await self.app(scope, receive, send)
            return
        token = self._match(scope)
        if scope["path"] in self.public:  # served to anyone; a valid token still says who asks
            state = scope.setdefault("state", {})
            state["public"] = True
            if token is None:
                state["anonymous"] = True
            else:
                state["toolsets"] = token.toolsets
                state["tenant"] = token.tenant
            await self.app(scope, receive, send)
            return
        if token is None:
            message = "missing or invalid bearer token (send 'Authorization: Bearer <token>')"
            body = error_body(scope["path"], "unauthorized", message)
            await refuse(scope, send, 401, body, [(b"www-authenticate", b'Bearer realm="toolfactory"')])
            return
        state = scope.setdefault("state", {})
        state["toolsets"] = token.toolsets
        state["tenant"] = token.tenant
        await self.app(scope, receive, send)

    def _match(self, scope: Scope) -> Token | None:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, secret = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return None
                # Bytes, not str: compare_digest refuses str with non-ASCII characters,
                # and any byte a client sends must end in 401, never in a 500.
                secret = secret.strip()
                found = None
                for token in self.tokens:  # compare against all: no timing hint of which matched
                    if hmac.compare_digest(token.secret_bytes, secret):
                        found = token
                return found
        return None


class BodyLimitMiddleware:
    """Rejects bodies over ``max_bytes`` with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # a WebSocket's frames: limited by api/stream.py and ws_max_size
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    await send_json(
                        send, 400, {"error": {"kind": "bad_request", "message": "bad Content-Length"}}
                    )
                    return
                if too_big:
                    await self._reject(send)
                    return
                # The server reads exactly Content-Length bytes: nothing more to count.
                await self.app(scope, receive, send)
                return
        received = 0
        limit = self.max_bytes

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        await send_json(
            send,
            413,
            {
                "error": {
                    "kind": "too_large",
                    "message": f"request body exceeds the limit of {self.max_bytes} bytes; "
                    "split the batch into smaller requests",
                }
            },
        )


class _TooLarge(Exception):
    pass
