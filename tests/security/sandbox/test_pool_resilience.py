"""The pool's background thread survives errors; a /metrics scrape walks no /proc on the loop.

Gaps closed (sandbox review, follow-up):

* ``SandboxPool``'s background thread had no catch-all: one unexpected exception ended it,
  and with it every refill and memory re-measure for the rest of the process. Now it logs
  the error (once per distinct message), counts it (``sandbox_maintenance_errors_total``),
  backs off and keeps running.
* ``gauges()`` re-measured stale memory figures itself, i.e. on the event loop when
  ``/metrics`` is scraped (a few ms of /proc reads per 100 workers). Now it serves the
  background thread's last measurement and only asks that thread to re-measure.

Real pools, real confined workers and real /proc reads throughout. The one injected fault:
the first test replaces a single internal method of one pool instance (``_wants_spare``,
which the background thread alone calls) with one that raises once and then calls the
real method; nothing can make the real method raise from outside.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
import pytest

import tools.sandbox.interpreter as interpreter
from tools.sandbox import SandboxPool


async def _until(predicate: Any, what: str) -> None:
    with anyio.fail_after(60):  # a deadline for progress, not a timing assertion
        while not predicate():
            await anyio.sleep(0.05)
    assert predicate(), what


async def test_the_background_thread_survives_an_error_and_keeps_refilling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = SandboxPool(1)
    real = pool._wants_spare
    raised: list[str] = []

    def fails_once() -> bool:
        if not raised:
            raised.append(threading.current_thread().name)
            raise RuntimeError("injected: one bad round")
        return real()

    caplog.set_level(logging.ERROR, logger="tools.sandbox.pool")
    async with pool:
        pool._wants_spare = fails_once  # type: ignore[method-assign]
        lease = await pool.acquire()  # takes the only spare: the background thread must refill
        try:
            await _until(lambda: pool.idle_count == 1, "the pool was refilled after the error")
            assert raised == ["sandbox-pool"]
            assert pool._thread is not None and pool._thread.is_alive()
            assert pool.gauges()["sandbox_maintenance_errors_total"] == 1
            logged = [r for r in caplog.records if r.name == "tools.sandbox.pool"]
            assert len(logged) == 1 and logged[0].exc_info is not None
            assert "injected: one bad round" in caplog.text
            assert (await lease.run("6 * 7")).value == "42"
        finally:
            await pool.release(lease)


async def test_a_scrape_reads_no_proc_on_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Figures made stale by calls; ``gauges()`` on the loop thread (what the /metrics handler
    runs, through ``PythonTool.gauges``) must leave every /proc walk to the background thread."""
    loop_thread = threading.get_ident()
    walks: list[int] = []
    real_held = interpreter.held

    def recording_held(root: int, counted: set[int], *, precise: bool, alone: bool = False) -> int:
        walks.append(threading.get_ident())
        return real_held(root, counted, precise=precise, alone=alone)

    monkeypatch.setattr(interpreter, "held", recording_held)
    async with SandboxPool(0, max_workers=8) as pool:
        leases = [await pool.acquire() for _ in range(4)]
        try:
            for lease in leases:
                assert (await lease.run("x = 1")).exit_code == 0  # its figure is stale now
            walks.clear()
            pool.gauges()
            assert loop_thread not in walks
            # The scrape asked the background thread to measure: the next one sees the figures.
            await _until(lambda: not pool._memory_stale(), "the background thread re-measured")
            assert walks and loop_thread not in walks
            assert pool.gauges()["sandbox_memory_bytes"] > 4 << 20
        finally:
            for lease in leases:
                await pool.release(lease)
