"""A pool closed while it is starting keeps nothing alive.

Hole closed (sandbox review): ``close`` during ``start`` (a server shut down while it was
coming up) found no worker yet and returned; ``start`` then put its first worker in the
closed pool and started the background thread, so that worker, its uid and its host
directory lived on until the process exited. Real pool and workers.
"""

from __future__ import annotations

import anyio
import pytest

from tools.sandbox import SandboxError, SandboxPool
from tools.sandbox.uids import UIDS


async def test_a_pool_closed_while_starting_leaves_no_worker() -> None:
    held = UIDS.in_use
    pool = SandboxPool(2)
    failed: list[BaseException] = []

    async def start() -> None:
        try:
            await pool.start()
        except SandboxError as exc:
            failed.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(start)
        await anyio.sleep(0)  # start has begun: its first worker is being forked
        await pool.close()
    assert pool.idle_count == 0 and pool._thread is None
    assert UIDS.in_use == held
    if failed:
        assert "closed" in str(failed[0])
    with pytest.raises(SandboxError, match="closed"):
        await pool.acquire()
