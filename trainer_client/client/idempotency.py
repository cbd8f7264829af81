"""Which tools may run twice, learned from each replica's ``GET /v1/tools``."""

from __future__ import annotations

import asyncio
import logging

import httpx
import orjson

from trainer_client.client.records import VERIFY, Pending, Replica, declares_idempotent

log = logging.getLogger("trainer_client.client")


class IdempotencyCatalog:
    """Tool name -> declared idempotent by every replica that listed it.

    A replica's list is read once (again after it was down: maybe a new process, a new
    config), in the background of its first POST: nothing on the hot path. A tool two
    replicas disagree on, or one not listed, counts as not idempotent.
    """

    def __init__(self, http: httpx.AsyncClient, headers: dict[str, str], timeout_s: float) -> None:
        self._http = http
        self._headers = headers
        self._timeout_s = timeout_s
        self._idempotent: dict[str, bool] = {}

    def is_idempotent(self, item: Pending) -> bool:
        """May this call run twice? Verifiers only score; a tool must say so (unknown: no)."""
        if item.endpoint is VERIFY:
            return True
        return self._idempotent.get(item.payload.name, False)

    async def settle(self, items: list[Pending], replicas: list[Replica]) -> None:
        """If some of these tools are not known yet, give tool lists being fetched a moment."""
        if all(item.endpoint is VERIFY or item.payload.name in self._idempotent for item in items):
            return
        fetching = [r.described for r in replicas if r.described is not None and not r.described.done()]
        if fetching:
            await asyncio.wait(fetching, timeout=self._timeout_s)

    async def learn(self, replica: Replica) -> None:
        """Read the replica's tool list; failures leave its tools unknown (not idempotent)."""
        try:
            response = await self._http.get(
                replica.url + "/v1/tools",
                params={"toolset": "*"},
                headers=self._headers,
                timeout=self._timeout_s,
            )
            response.raise_for_status()
            tools = orjson.loads(response.content).get("tools") or []
        except (httpx.HTTPError, ValueError) as exc:  # unreachable, an old server: expected
            log.info(
                "could not list the tools of %s (%r); unknown tools count as not idempotent", replica.url, exc
            )
            return
        except Exception as exc:  # a bug: keep the traceback; the tools stay unknown
            log.error("unexpected error listing the tools of %s", replica.url, exc_info=exc)
            return
        for descriptor in tools:
            name = descriptor.get("name") if isinstance(descriptor, dict) else None
            if isinstance(name, str):
                self._idempotent[name] = self._idempotent.get(name, True) and declares_idempotent(descriptor)
