"""Kernel objects that outlive a process or escape the memory limits are a session's own.

Holes closed (sandbox review): (1) every worker shared the host's IPC namespace, so a SysV
shared memory segment made by one session (mode 0666) could be attached and read by
another session, and stayed on the host, holding its memory, after both workers were gone;
(2) ``memfd_create`` gave a session memory that neither RLIMIT_AS, nor the tmpfs caps, nor
the fleet's memory figure count: 192 MB held open by a worker limited to 128 MB, measured
as 13 MB. Real confined workers throughout.
"""

from __future__ import annotations

import ctypes
import secrets

import anyio
import pytest

from tools.sandbox import SandboxLimits, SandboxWorker

LIMITS = SandboxLimits(timeout_s=20, memory_mb=128, max_file_mb=16)

SHM = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
KEY = {key}
"""

MAKE_SEGMENT = (
    SHM
    + r"""
sid = libc.shmget(KEY, 1 << 20, 0o1000 | 0o666)  # IPC_CREAT, readable and writable by anyone
assert sid >= 0, ctypes.get_errno()
addr = libc.shmat(sid, None, 0)  # kept attached: a segment no process has attached dies at once
ctypes.memmove(addr, b"{secret}", {size})
"""
)

FIND_SEGMENT = (
    SHM
    + r"""
sid = libc.shmget(KEY, 0, 0)
if sid < 0:
    print("no segment", ctypes.get_errno())
else:
    print(ctypes.string_at(libc.shmat(sid, None, 0), {size}).decode())
"""
)


async def spawn() -> SandboxWorker:
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, LIMITS)
    if "root" not in worker.isolation:
        await worker.aclose()
        pytest.skip("needs the strong mode (root, mount namespaces)")
    return worker


def host_segments(key: int) -> list[str]:
    """SysV shared memory segments with ``key`` in the host's (the test's) IPC namespace."""
    with open("/proc/sysvipc/shm") as fh:
        rows = [line.split() for line in fh.readlines()[1:]]
    return [row[1] for row in rows if row and int(row[0]) == key]


async def test_a_sysv_segment_is_seen_by_no_other_session_and_dies_with_its_worker() -> None:
    key = secrets.randbelow(1 << 30) + 1
    secret = secrets.token_hex(8)
    maker, reader = await spawn(), await spawn()
    try:
        made = await maker.run(MAKE_SEGMENT.format(key=key, secret=secret, size=len(secret)))
        assert made.error is None, made
        found = await reader.run(FIND_SEGMENT.format(key=key, size=len(secret)))
        assert found.error is None, found
        assert secret not in found.stdout and found.stdout.startswith("no segment"), found.stdout
        assert host_segments(key) == []  # not in the server's namespace either
        assert "ipc" in maker.isolation, maker.isolation
        again = await maker.run(FIND_SEGMENT.format(key=key, size=len(secret)))
        assert again.stdout.strip() == secret  # the session itself keeps its own segment
    finally:
        await maker.aclose()
        await reader.aclose()
        libc = ctypes.CDLL(None)
        for shmid in host_segments(key):  # without the fix: do not leave it on the host
            libc.shmctl(int(shmid), 0, None)  # IPC_RMID


HOARD = r"""
import os
held = []
try:
    for _ in range(24):  # 192 MB, over the 128 MB address-space limit
        fd = os.memfd_create("hoard")
        os.write(fd, b"x" * (8 << 20))
        held.append(fd)
except OSError as exc:
    print(type(exc).__name__)
print(len(held) * 8)
"""


async def test_memory_held_in_memfds_cannot_pass_the_memory_limit() -> None:
    worker = await spawn()
    try:
        result = await worker.run(HOARD)
        assert result.error is None, result
        held_mb = int(result.stdout.split()[-1])
        assert held_mb < LIMITS.memory_mb, result.stdout
        assert result.stdout.startswith("PermissionError"), result.stdout
    finally:
        await worker.aclose()
