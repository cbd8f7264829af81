"""Memory a session holds outside its worker's own address space counts against its caps.

Holes closed (issue 30, point 1): (1) SysV segments made in a worker's IPC namespace,
attached, filled and detached, stayed held between calls (12 x 64 MB: the host's shared
memory grew by 768 MB) while the fleet's figure did not move; (2) the memory of the children
a call forks was counted nowhere (6 children of 200 MB each took 1-1.5 GB past a 512 MB fleet
cap), and neither were pages of a shared mapping that a child filled. Now segments die when
detached (the worker's IPC namespace has ``shm_rmid_forced`` and a cap), and the figure is
the whole process tree's plus each shared memory object it maps, checked during calls, after
them and by the pool. Everything is measured here from the host, independently of the
sandbox's own accounting. Real confined workers throughout.
"""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from tools.sandbox import SandboxLimits, SandboxPool, SandboxWorker

HOARD_SEGMENTS = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = 0
for _ in range(12):  # 768 MB, three times the session's cap
    sid = libc.shmget(0, 64 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if sid < 0:
        break
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, 64 << 20)
    libc.shmdt(ctypes.c_void_p(addr))  # detached: held by no process
    made += 1
made
"""

# What the SysV segments of a process's IPC namespace hold, read from the host by entering it.
SEGMENTS_OF = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(f"/proc/{sys.argv[1]}/ns/ipc", os.O_RDONLY)
assert libc.setns(fd, 0x08000000) == 0, ctypes.get_errno()  # CLONE_NEWIPC
rows = [line.split() for line in open("/proc/sysvipc/shm").readlines()[1:]]
print(sum(int(row[3]) for row in rows if row))  # their sizes
"""

# A shared mapping a child fills, then cut down to one page: the object keeps every page
# (RLIMIT_AS counts only the page left; the worker's own PSS has none of them).
HIDE_IN_SHARED_MAPPING = r"""
import ctypes, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
kept = []
for _ in range(ROUNDS):
    m = mmap.mmap(-1, 200 << 20)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    if os.fork() == 0:
        ctypes.memset(addr, 1, 200 << 20)
        os._exit(0)
    os.wait()
    libc.munmap(ctypes.c_void_p(addr + 4096), ctypes.c_size_t((200 << 20) - 4096))
    kept.append(m)
len(kept)
"""

FORK_HOGS = r"""
import os, time
children = []
for _ in range(CHILDREN):
    pid = os.fork()
    if pid == 0:
        block = bytearray(MB << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(3)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""


async def spawn(limits: SandboxLimits) -> SandboxWorker:
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, limits)
    if "root" not in worker.isolation:
        await worker.aclose()
        pytest.skip("needs the strong mode (root, namespaces)")
    return worker


def segment_bytes(pid: int) -> int:
    done = subprocess.run(
        [sys.executable, "-c", SEGMENTS_OF, str(pid)], capture_output=True, text=True, timeout=60, check=True
    )
    return int(done.stdout)


async def test_detached_sysv_segments_are_not_held_between_calls() -> None:
    worker = await spawn(SandboxLimits(timeout_s=60, memory_mb=256))
    try:
        result = await worker.run(HOARD_SEGMENTS)
        assert result.error is None, result
        assert int(result.value or "0") >= 1  # it could make and fill segments
        held = await anyio.to_thread.run_sync(segment_bytes, worker.proc.pid)
        assert held == 0, f"{held >> 20} MB of SysV segments held between calls"
    finally:
        await worker.aclose()


async def test_shared_memory_a_child_filled_counts_in_the_sessions_figure() -> None:
    worker = await spawn(SandboxLimits(timeout_s=60, memory_mb=256))
    try:
        result = await worker.run(HIDE_IN_SHARED_MAPPING.replace("ROUNDS", "1"))
        assert result.error is None and result.value == "1", result
        figure = await anyio.to_thread.run_sync(worker.memory_bytes)
        assert figure >= 200 << 20, f"the session's figure is {figure >> 20} MB"
        cap = await worker.run(HIDE_IN_SHARED_MAPPING.replace("ROUNDS", "2"))  # 400 more: over 256
        assert cap.worker_died and "over its memory limit of 256 MB" in (cap.error or ""), cap
    finally:
        await worker.aclose()


async def test_the_children_of_a_call_count_against_the_sessions_cap() -> None:
    worker = await spawn(SandboxLimits(timeout_s=60, memory_mb=256, max_processes=16))
    try:
        code = FORK_HOGS.replace("CHILDREN", "6").replace("MB", "200")  # each under RLIMIT_AS
        result = await worker.run(code)
        assert result.worker_died, result
        assert "over its memory limit of 256 MB" in (result.error or ""), result.error
    finally:
        await worker.aclose()


async def test_the_children_of_a_call_count_against_the_fleets_budget() -> None:
    limits = SandboxLimits(timeout_s=60, memory_mb=400, max_processes=16)
    async with SandboxPool(0, limits, max_total_memory_mb=256) as pool:
        worker = await pool.acquire()
        try:
            if "root" not in worker.isolation:
                pytest.skip("needs the strong mode (root, namespaces)")
            code = FORK_HOGS.replace("CHILDREN", "2").replace("MB", "150")  # under its own 400
            result = await worker.run(code)
            assert result.worker_died, result
            assert "sandbox memory was over its limit" in (result.error or ""), result.error
            assert pool.gauges()["sandbox_memory_stops_total"] == 1
        finally:
            await pool.release(worker)
