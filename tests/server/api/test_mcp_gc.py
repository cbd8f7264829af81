"""Each MCP request owes the GC pacer the objects the SDK leaves in cycles: collected in small steps."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import anyio
import pytest

from tool_server.api.mcp import MCP_CYCLE_OBJECTS, _McpAsgi
from tool_server.api.queued_bytes import QueuedBytes
from tool_server.app import build_registry
from tool_server.config import config_from_dict
from tool_server.executor.executor import Executor


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """Generations collected while the test runs; no automatic collection may blur the count."""
    seen: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    gc.callbacks.append(on_gc)
    threshold = gc.get_threshold()
    gc.set_threshold(10**9)
    try:
        yield seen
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_gc)


def test_requests_owe_their_cycles_and_collect_every_budget_even_when_the_app_fails(
    collections: list[int],
) -> None:
    config = config_from_dict({"tools": [{"target": "tools.testing:echo"}]}, environ={})
    executor = Executor(build_registry(config), config)
    executor.gc_pacer.budget = 3 * MCP_CYCLE_OBJECTS  # a collection every third request
    calls: list[str] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        calls.append(scope["path"])
        if scope["path"] == "/boom":
            raise RuntimeError("handler failed")

    wrapped = _McpAsgi(app, executor, QueuedBytes(config.limits))

    def request(path: str) -> dict:
        return {"type": "http", "method": "PUT", "path": path, "headers": [], "path_params": {}}

    async def main() -> None:
        for path in ["/a", "/b"]:
            await wrapped(request(path), None, None)  # type: ignore[arg-type]
        assert collections == []
        with pytest.raises(RuntimeError):
            await wrapped(request("/boom"), None, None)  # type: ignore[arg-type]  # the third, failed: counted
        assert collections == [0]
        for path in ["/c", "/d", "/e"]:
            await wrapped(request(path), None, None)  # type: ignore[arg-type]
        assert collections == [0, 0]

    anyio.run(main)
    assert calls == ["/a", "/b", "/boom", "/c", "/d", "/e"]
