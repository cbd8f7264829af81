"""The MCP endpoint collects the young GC generation every few requests (SDK cycles)."""

from __future__ import annotations

import gc

import anyio
import pytest

from tool_server.mcp_endpoint import _CollectingEvery


def test_young_generation_is_collected_every_n_requests_even_when_the_app_fails() -> None:
    calls: list[str] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        calls.append(scope["path"])
        if scope["path"] == "/boom":
            raise RuntimeError("handler failed")

    collections: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "stop":
            collections.append(info["generation"])

    wrapped = _CollectingEvery(app, requests=3)

    async def main() -> None:
        for path in ["/a", "/b"]:
            await wrapped({"path": path}, None, None)
        assert collections == []
        with pytest.raises(RuntimeError):
            await wrapped({"path": "/boom"}, None, None)  # the third request, failed: still counted
        assert collections == [0]
        for path in ["/c", "/d", "/e"]:
            await wrapped({"path": path}, None, None)
        assert collections == [0, 0]

    gc.callbacks.append(on_gc)
    threshold = gc.get_threshold()
    gc.set_threshold(10**9)  # no automatic collection may blur the count
    try:
        anyio.run(main)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_gc)
    assert calls == ["/a", "/b", "/boom", "/c", "/d", "/e"]
