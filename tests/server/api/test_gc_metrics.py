"""The server reports its garbage collections and how long they held it (/metrics), and freezes
what it loaded at start."""

from __future__ import annotations

import asyncio
import gc
import re

import httpx

from tests.support.server import ServerProcess
from tool_server.app import create_app
from tool_server.config import config_from_dict
from tool_server.executor.gc_pacing import YOUNG_BUDGET


def test_metrics_report_the_collections_of_a_busy_server(server: ServerProcess) -> None:
    # Enough kept results that the pacer must collect the young generation (each owes it 2).
    calls_needed = YOUNG_BUDGET
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for start in range(0, calls_needed, 4000):
            calls = [
                {"call_id": f"gc-metrics-{i}", "name": "echo", "arguments": {"text": "x"}}
                for i in range(start, min(start + 4000, calls_needed))
            ]
            response = client.post("/v1/calls", json={"calls": calls})
            assert response.status_code == 200, response.text
        metrics = client.get("/metrics").text
    young = re.search(r'^toolfactory_gc_pause_seconds_count\{generation="0"\} (\S+)$', metrics, re.M)
    assert young is not None, metrics
    assert float(young.group(1)) >= 1
    longest = re.search(r"^toolfactory_gc_pause_longest_seconds (\S+)$", metrics, re.M)
    assert longest is not None and float(longest.group(1)) > 0


def test_the_lifespan_freezes_what_start_up_loaded_when_the_process_froze_its_own() -> None:
    config = config_from_dict({"tools": [{"target": "tools.testing:echo"}]}, environ={})
    app = create_app(config, bind_host="127.0.0.1")

    async def main() -> tuple[int, int]:
        async with app.router.lifespan_context(app):
            return gc.get_freeze_count(), len(gc.callbacks)

    callbacks = len(gc.callbacks)
    gc.freeze()  # as `tool-server serve` does before serving (cli.tune_gc)
    try:
        frozen_before = gc.get_freeze_count()
        frozen, watching = asyncio.run(main())
    finally:
        gc.unfreeze()
    assert frozen > frozen_before  # what the lifespan built was frozen too
    assert watching == callbacks + 1 and len(gc.callbacks) == callbacks  # pauses watched while serving only
