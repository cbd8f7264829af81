"""Admission: which calls the executor takes on, counted in all and per tenant.

A call is admitted (counted) from the moment it is started until it has finished,
whether it runs or waits for a slot. The server holds at most ``capacity`` admitted
calls (``limits.max_concurrency + limits.max_queue``) and one tenant at most its share;
a batch is admitted whole or refused whole, so a retry repeats exactly what was refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tool_server.config import ConfigError

__all__ = ["ANONYMOUS", "Admission", "Caller", "Overloaded", "tenant_share"]

ANONYMOUS_TENANT = "anonymous"  # the one tenant of a server without tokens


class Overloaded(Exception):
    """A batch cannot be admitted: the queue is full. The HTTP layer answers 429."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call: the tenant owning its stored results and sessions, and what it may use.

    ``allowed`` is the set of tool names the caller's token may call (None: every tool).
    ``sees_gold``: whether a verifier's details may show it gold values (``sees_server_wide``:
    a token for every toolset, or a server without tokens; in-process callers are the server's own).
    """

    tenant: str = ANONYMOUS_TENANT
    allowed: frozenset[str] | None = None
    sees_gold: bool = True
    # Where the caller's call_ids are kept: ``key_prefix + call_id`` (tenant_key_prefix).
    key_prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_prefix", tenant_key_prefix(self.tenant))


def tenant_key_prefix(tenant: str) -> str:
    """What a tenant's keys in the idempotency store start with: its name, length first, so
    that no two tenants' keys can be equal. Keys are strings, not (tenant, call_id) tuples:
    the garbage collector does not track strings, and a store of 200,000 tuples is walked."""
    return f"{len(tenant)}:{tenant}:"


ANONYMOUS = Caller()


def tenant_share(limits: Any) -> int:
    """Admitted calls one token may hold: the configured share, or 3/4 of the capacity.

    3/4 by default: a busy tenant still gets most of the queue (batches as large as before
    fit), while a quarter stays open to the other tenants however much one of them posts.
    """
    capacity = limits.max_concurrency + limits.max_queue
    share = limits.max_admitted_per_tenant
    if share is not None and share < 1:
        raise ConfigError(f"limits.max_admitted_per_tenant must be at least 1 (or null), got {share}")
    return min(capacity, share) if share is not None else max(1, capacity * 3 // 4)


class Admission:
    """Admitted calls not yet finished, in all and by tenant, against the capacity and shares."""

    __slots__ = ("capacity", "tenant_share", "admitted", "_by_tenant")

    def __init__(self, limits: Any) -> None:
        self.capacity = limits.max_concurrency + limits.max_queue
        self.tenant_share = tenant_share(limits)
        self.admitted = 0  # running + waiting
        self._by_tenant: dict[str, int] = {}

    def share(self, tenant: str) -> int:
        # A server without tokens has one tenant: it may fill the whole capacity.
        return self.capacity if tenant == ANONYMOUS_TENANT else self.tenant_share

    def check_batch(self, tenant: str, size: int) -> None:
        """Raise ``Overloaded`` unless a batch of ``size`` calls fits now.

        A batch that never fits is a 429 too, not a 413: a client that learns its window from
        429s (ToolClient) then sends at most what was admitted, where splitting on 413 re-sent
        every call once per halving. The message says that waiting alone will not help.
        """
        if size > self.share(tenant):
            limit = "limits.max_concurrency + limits.max_queue"
            if self.share(tenant) < self.capacity:
                limit = "limits.max_admitted_per_tenant"
            raise Overloaded(
                f"a batch of {size} calls is never admitted at once here: one token may hold at "
                f"most {self.share(tenant)} admitted calls ({limit}); send smaller batches"
            )
        if self.admitted + size > self.capacity:
            raise Overloaded(
                f"server busy: {self.admitted} calls admitted, capacity {self.capacity}; "
                f"retry this batch of {size} later with the same call_ids"
            )
        held = self._by_tenant.get(tenant, 0)
        if held + size > self.share(tenant):
            raise Overloaded(
                f"your token holds {held} admitted calls; one token may hold "
                f"{self.share(tenant)} (limits.max_admitted_per_tenant); "
                f"retry this batch of {size} later with the same call_ids"
            )

    def refusal(self, tenant: str) -> str | None:
        """Why one more call may not be admitted now (None: it may)."""
        if self.admitted >= self.capacity:
            return "server busy: queue full; retry later"
        if self._by_tenant.get(tenant, 0) >= self.share(tenant):
            return (
                "your token holds as many admitted calls as one token may "
                f"({self.share(tenant)}, limits.max_admitted_per_tenant); retry later"
            )
        return None

    def take(self, tenant: str) -> None:
        self.admitted += 1
        by = self._by_tenant
        by[tenant] = by.get(tenant, 0) + 1

    def give_back(self, tenant: str) -> None:
        self.admitted -= 1
        self._by_tenant[tenant] -= 1
