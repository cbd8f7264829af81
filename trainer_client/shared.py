"""Small helpers that the CLI, the GRPO trainer and the veRL plug-ins share."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_client.client.tool_client import ToolClient

URL_ENV = "TOOLFACTORY_URL"  # the tool server (or comma-separated replicas) when none is given


def plain(value: Any) -> Any:
    """OmegaConf containers, numpy arrays and scalars (veRL and parquet rows hand all
    three) as plain JSON-able Python: dicts with string keys, lists, numbers."""
    if type(value).__name__ in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf  # only present where veRL is

        return plain(OmegaConf.to_container(value, resolve=True))
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        return plain(value.tolist())  # numpy array or scalar
    return value


class LoopClients:
    """One ``ToolClient`` per event loop and key, shared by everything on that loop.

    Sharing is the point: the calls of concurrent trajectories (or scorings) on a loop
    are batched into few POSTs. A client is bound to the loop it was made on, so each
    loop gets its own; weak keys let a closed loop drop its clients.
    """

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, ToolClient]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, key: Hashable, make: Callable[[], ToolClient]) -> ToolClient:
        """The running loop's client for ``key``; ``make`` builds one (again after a close)."""
        clients = self._by_loop.setdefault(asyncio.get_running_loop(), {})
        client = clients.get(key)
        if client is None or client.closed:
            client = clients[key] = make()
        return client

    async def aclose(self) -> None:
        """Close the running loop's clients."""
        for client in self._by_loop.pop(asyncio.get_running_loop(), {}).values():
            await client.aclose()


class CliError(Exception):
    """A user error: printed as ``error: ...`` with exit status 2."""
