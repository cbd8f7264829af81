"""Bytes of calls admitted and not yet answered: bounded per connection, per tenant and in all.

The executor bounds how many calls are admitted (``admission``), not how large they are: a
client could queue 4,096 frames of 16 MiB on one stream behind a busy session, and the server
held every one of them. Each calls body (a ``POST /v1/calls`` or ``/v1/verify`` body, a stream
frame, an MCP ``POST``) is counted here by its size from when it is admitted until it is answered; one that would
take a bound past its limit is refused whole as ``overloaded`` (429 + Retry-After on HTTP, an
``overloaded`` result per call on a stream), so a retry repeats exactly what was refused.

A POST connection carries one request at a time (its body is at most ``limits.max_request_bytes``);
the per-connection bound is a stream's, whose frames run concurrently.
"""

from __future__ import annotations

from typing import Any

from tool_server.config import ConfigError
from tool_server.executor.admission import ANONYMOUS_TENANT

__all__ = ["ConnectionBytes", "QueuedBytes"]

MIB = 1024 * 1024


class ConnectionBytes:
    """What one stream connection holds now."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


class QueuedBytes:
    """The bytes of admitted calls bodies not yet answered, in all and by tenant."""

    __slots__ = ("limit", "tenant_limit", "connection_limit", "held", "_by_tenant")

    def __init__(self, limits: Any) -> None:
        self.limit: int = limits.max_queued_bytes
        share = limits.max_queued_bytes_per_tenant
        self.tenant_limit: int = min(self.limit, share) if share is not None else self.limit * 3 // 4
        self.connection_limit: int = limits.max_queued_bytes_per_connection
        for key, value in (
            ("max_queued_bytes", self.limit),
            ("max_queued_bytes_per_tenant", self.tenant_limit),
            ("max_queued_bytes_per_connection", self.connection_limit),
        ):
            if value < limits.max_request_bytes:  # a request of the largest size must fit alone
                raise ConfigError(
                    f"limits.{key} ({value}) must be at least limits.max_request_bytes "
                    f"({limits.max_request_bytes}): a request of that size would never be admitted"
                )
        self.held = 0
        self._by_tenant: dict[str, int] = {}

    def take(self, tenant: str, size: int, connection: ConnectionBytes | None = None) -> str | None:
        """Count a body of ``size`` bytes as admitted; or, without counting it, why it may not be."""
        if self.held + size > self.limit:
            return (
                f"server busy: {_mib(self.held)} of requests admitted and not yet answered, limit "
                f"{_mib(self.limit)} (limits.max_queued_bytes); retry later with the same call_ids"
            )
        by = self._by_tenant
        tenant_held = by.get(tenant, 0)
        if tenant != ANONYMOUS_TENANT and tenant_held + size > self.tenant_limit:
            return (
                f"your token holds {_mib(tenant_held)} of requests admitted and not yet answered; one "
                f"token may hold {_mib(self.tenant_limit)} (limits.max_queued_bytes_per_tenant); "
                "retry later with the same call_ids"
            )
        if connection is not None:
            if connection.held + size > self.connection_limit:
                return (
                    f"this connection holds {_mib(connection.held)} of frames not yet answered; one "
                    f"connection may hold {_mib(self.connection_limit)} "
                    "(limits.max_queued_bytes_per_connection); resend once answers have come"
                )
            connection.held += size
        self.held += size
        by[tenant] = tenant_held + size
        return None

    def give_back(self, tenant: str, size: int, connection: ConnectionBytes | None = None) -> None:
        self.held -= size
        by = self._by_tenant
        left = by[tenant] - size
        if left:
            by[tenant] = left
        else:
            del by[tenant]  # no entry per tenant that has nothing queued
        if connection is not None:
            connection.held -= size

    def of(self, tenant: str) -> int:
        """Bytes the tenant holds now."""
        return self._by_tenant.get(tenant, 0)


def _mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"
