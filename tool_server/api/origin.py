"""Refuse what a web page could make a browser send: drive-by calls and DNS rebinding.

A page the user happens to visit can make the browser send requests to this server, which
the server alone can tell apart from its real clients:

* **Host** (DNS rebinding: the attacker's name, re-pointed at 127.0.0.1, makes the page
  same-origin with the server): only the loopback names, the addresses the server is bound
  to, and the names listed in ``server.allowed_hosts`` are answered; any other gets 421.
* **Origin** (a page of another site): refused with 403 unless its host passes the same
  check. The server answers no CORS preflight, so such a page could not read the answer
  anyway; this also stops what it could send blind.
* **Content-Type**: a POST whose body is not declared JSON gets 415. ``text/plain``, form
  encodings and no type at all are what a page may send cross-site without a preflight;
  ``application/json`` always needs one, which the server never grants.

A WebSocket handshake (``GET /v1/stream``) gets the same Host and Origin checks, refused
before the connection opens: a browser lets any page open a WebSocket to any address (no
preflight, and the page reads every frame), and always sends the page's Origin with it, so
the Origin check is what stops cross-site WebSocket hijacking on a server without tokens.

A bearer token is the other guard: a page cannot send one it does not know, so with tokens
set ``server.allowed_hosts: ["*"]`` may turn the Host check off (behind a load balancer
that many names reach). Plain ASGI, one pass over the headers, decisions on Host and Origin
values cached: about 2 µs per request, as much as the body-size check (measured in process on
a loaded 2-core machine).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from tool_server.api.auth import GUARDED_SCOPES, error_body, refuse
from tool_server.config import ConfigError

LOOPBACK_NAMES = frozenset({"localhost"})  # loopback IP literals pass as addresses
ANY_HOST = "*"
# Methods whose body the handlers read. A cross-site page may send a POST with a "simple"
# content type; PUT and PATCH always need a preflight, but cost nothing to check.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSON_TYPES = frozenset({b"application/json"})
# The workbench's upload takes a JSON-lines file as it is.
JSON_LINES_TYPES = JSON_TYPES | {b"application/x-ndjson", b"application/jsonl"}
BODY_TYPES = {"/ui/api/upload": JSON_LINES_TYPES}
_CACHE_LIMIT = 1024  # distinct Host / Origin values remembered (a client can send any)


def split_host(value: str) -> tuple[str, str | None] | None:
    """``"Name:8000"`` -> ``("name", "8000")``, ``"[::1]"`` -> ``("::1", None)``; None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:  # no port; more than one colon is an IPv6 address without brackets
        host, port = value, None
    if not host or (port is not None and not port.isdigit()):
        return None
    return host.removesuffix("."), port


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which Host values this server answers; see the module docstring."""

    any_host: bool
    any_address: bool  # bound to every interface: any IP literal is one of ours
    addresses: frozenset[str]  # the bound IP addresses (loopback ones always pass)
    names: frozenset[str]  # host names accepted with any port
    names_with_port: frozenset[tuple[str, str]]

    @classmethod
    def build(cls, bound: Iterable[str], allowed_hosts: Iterable[str], *, tokens: bool) -> HostPolicy:
        """From the addresses the listener binds and ``server.allowed_hosts``; ConfigError on a
        malformed entry, or on ``"*"`` without tokens (it would leave loopback open to any page)."""
        allowed = list(allowed_hosts)
        if ANY_HOST in allowed and not tokens:
            raise ConfigError(
                'server.allowed_hosts: "*" turns the Host check off, which only bearer tokens make safe: '
                "set auth tokens (TOOLFACTORY_TOKENS), or list the names clients use instead"
            )
        names: set[str] = set()
        with_port: set[tuple[str, str]] = set()
        for entry in allowed:
            if entry == ANY_HOST:
                continue
            parsed = split_host(entry.removesuffix(":*")) if isinstance(entry, str) else None
            if parsed is None or "/" in entry:
                raise ConfigError(
                    f"server.allowed_hosts: {entry!r} is not a host name; give 'name' (any port), "
                    "'name:port' or '*'"
                )
            host, port = parsed
            if port is None:
                names.add(host)
            else:
                with_port.add((host, port))
        addresses = {_normal_ip(a) for a in bound}
        any_address = any(ipaddress.ip_address(a).is_unspecified for a in addresses if a)
        return cls(
            ANY_HOST in allowed,
            any_address,
            frozenset(a for a in addresses if a),
            frozenset(names),
            frozenset(with_port),
        )

    def allows(self, host: str, port: str | None) -> bool:
        if self.any_host or host in LOOPBACK_NAMES or host in self.names:
            return True
        if port is not None and (host, port) in self.names_with_port:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a name: only the listed ones (a rebinding attack needs a name)
        return address.is_loopback or self.any_address or str(address) in self.addresses


def _normal_ip(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address.split("%")[0]))
    except ValueError:
        return ""


class RequestOriginMiddleware:
    """421 for a foreign Host, 403 for a foreign Origin, 415 for a POST body not declared JSON."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy
        self._hosts: dict[bytes, bool] = {}
        self._origins: dict[bytes, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in GUARDED_SCOPES:
            await self.app(scope, receive, send)
            return
        host = origin = content_type = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"content-type":
                content_type = value
        path = scope["path"]
        # No Host at all is not a browser (HTTP/1.0 by hand): nothing to rebind.
        if host is not None and not (self._hosts.get(host) or self._decide(self._hosts, host, self._host_ok)):
            await self._refuse(scope, send, 421, _host_message(host))
            return
        if origin is not None and not self._decide(self._origins, origin, self._origin_ok):
            await self._refuse(scope, send, 403, _origin_message(origin))
            return
        if scope.get("method") in BODY_METHODS:  # a WebSocket handshake has no method: a GET
            accepted = BODY_TYPES.get(path, JSON_TYPES)
            if content_type in accepted:  # the usual exact spelling: no parsing
                media = content_type
            else:
                media = content_type.split(b";", 1)[0].strip().lower() if content_type else b""
            if media not in accepted:
                await self._refuse(
                    scope, send, 415, _type_message(scope["method"], path, content_type, accepted)
                )
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _decide(cache: dict[bytes, bool], value: bytes, decide: Callable[[str], bool]) -> bool:
        known = cache.get(value)
        if known is None:
            known = decide(value.decode("latin-1"))
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[value] = known
        return known

    def _host_ok(self, value: str) -> bool:
        parsed = split_host(value)
        return parsed is not None and self.policy.allows(*parsed)

    def _origin_ok(self, value: str) -> bool:
        if self.policy.any_host:
            return True
        try:
            parts = urlsplit(value.strip())
            port = parts.port
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # "null" (a sandboxed frame, a file), or not a web page
        return self.policy.allows(parts.hostname.removesuffix("."), None if port is None else str(port))

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
        await refuse(scope, send, status, error_body(scope["path"], "bad_request", message))


def _host_message(host: bytes) -> str:
    shown = host.decode("latin-1")[:200]
    name = (split_host(shown) or (shown, None))[0]
    return (
        f"Host {shown!r} is not a name this server answers to (a guard against DNS rebinding). "
        "Use the server's address (http://127.0.0.1:PORT or localhost on this machine), or add "
        f"the name to server.allowed_hosts (e.g. TOOLFACTORY__SERVER__ALLOWED_HOSTS='[\"{name}\"]')"
    )


def _origin_message(origin: bytes) -> str:
    return (
        f"Origin {origin.decode('latin-1')[:200]!r} is not allowed: this server answers no other "
        "site's web pages. Open the workbench from this server (/ui), or add that page's host to "
        "server.allowed_hosts"
    )


def _type_message(method: str, path: str, content_type: bytes | None, accepted: frozenset[bytes]) -> str:
    got = repr(content_type.decode("latin-1")[:100]) if content_type else "none"
    wanted = " or ".join(sorted(t.decode() for t in accepted))
    return (
        f"{method} {path} takes a body of Content-Type {wanted} (got {got}): send the header "
        "'Content-Type: application/json' (curl -H, or httpx/requests json=...)"
    )
