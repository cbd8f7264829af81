"""The MCP endpoint collects the young GC generation every few requests (SDK cycles)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import anyio
import pytest

from tool_server.api.mcp import _CollectingEvery


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


def test_young_generation_is_collected_every_n_requests_even_when_the_app_fails(
    collections: list[int],
) -> None:
    calls: list[str] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        calls.append(scope["path"])
        if scope["path"] == "/boom":
            raise RuntimeError("handler failed")

    wrapped = _CollectingEvery(app, requests=3, long_lived=lambda: 0, max_long_lived=100)

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

    anyio.run(main)
    assert calls == ["/a", "/b", "/boom", "/c", "/d", "/e"]


def test_collection_is_skipped_while_many_long_lived_results_were_stored(collections: list[int]) -> None:
    stored = [0]

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        stored[0] += scope["stored"]

    wrapped = _CollectingEvery(app, requests=2, long_lived=lambda: stored[0], max_long_lived=100)

    async def main() -> None:
        for batch_results in [60, 60]:  # 120 results stored since the start: skip
            await wrapped({"stored": batch_results}, None, None)
        assert collections == []
        for batch_results in [30, 30]:  # 60 since the last decision: collect
            await wrapped({"stored": batch_results}, None, None)
        assert collections == [0]

    anyio.run(main)
