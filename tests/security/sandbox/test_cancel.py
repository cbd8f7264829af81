"""A call cancelled from outside (the server's per-call timeout cancels the tool's coroutine)
frees everything its sandbox held.

Hole closed (sandbox review): ``run_python`` closes its worker in a ``finally``, but inside a
cancelled scope the close gave up at its first await: the worker's four fds and pidfd stayed
open for good, its uid stayed taken and its host directory stayed on disk, once per
cancelled call (the code verifier runs every candidate through ``run_python``). Real
workers throughout.
"""

from __future__ import annotations

import os

import anyio

from tools.sandbox import SandboxLimits, run_python
from tools.sandbox.host import HOSTDIRS

LIMITS = SandboxLimits(timeout_s=30, memory_mb=256)


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


async def test_a_cancelled_run_python_leaves_no_fd_uid_or_directory_behind() -> None:
    assert (await run_python("1 + 1", limits=LIMITS)).value == "2"  # the template is up
    before = open_fds()
    with anyio.move_on_after(1.0) as scope:
        await run_python("while True: pass", timeout_s=30, limits=LIMITS)
    assert scope.cancelled_caught
    assert open_fds() <= before, "the cancelled call's fds are still open"
    assert HOSTDIRS.root is None or os.listdir(HOSTDIRS.root) == []
