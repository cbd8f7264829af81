"""The worker's seccomp filter: no new namespaces, mounts, ptrace or other kernel attack surface.

Hardening (security campaign, point 9): the sandboxed uid could create a user namespace
(and so mount, and reach every namespaced kernel interface as "root"), ptrace its own
children, or open AF_VSOCK sockets, which a network namespace does not confine. Real
confined workers throughout.
"""

from __future__ import annotations

import ast
import os
from collections.abc import AsyncIterator

import anyio
import pytest

from tools.sandbox import SandboxLimits, SandboxWorker

LIMITS = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=256)
BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)


@pytest.fixture
async def worker() -> AsyncIterator[SandboxWorker]:
    if BPF is None:
        pytest.skip("the filter knows x86_64 and aarch64 only")
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, LIMITS)
    yield worker
    await worker.aclose()


PROBES = r"""
import ctypes, errno, os, socket, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def outcome(ret):
    return "ok" if ret >= 0 else errno.errorcode[ctypes.get_errno()]
out = {}
out["unshare(user)"] = outcome(libc.unshare(0x10000000))
out["unshare(user|mount)"] = outcome(libc.unshare(0x10020000))
out["unshare(net)"] = outcome(libc.unshare(0x40000000))
out["mount"] = outcome(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
out["bpf"] = outcome(libc.syscall(BPF, 0, None, 0))
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
out["ptrace(attach child)"] = outcome(libc.ptrace(16, child, None, None))
os.kill(child, 9)
os.waitpid(child, 0)
try:
    socket.socket(40, socket.SOCK_STREAM).close()  # AF_VSOCK
    out["socket(vsock)"] = "ok"
except OSError as exc:
    out["socket(vsock)"] = errno.errorcode[exc.errno]
out["prctl(subreaper off)"] = outcome(libc.prctl(36, 0, 0, 0, 0))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
out["Seccomp"] = status["Seccomp"].strip()
out["NoNewPrivs"] = status["NoNewPrivs"].strip()
# what ordinary code needs still works: fork, threads, subprocesses, ctypes callbacks
box = []
worker = threading.Thread(target=box.append, args=(1,))
worker.start()
worker.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
import subprocess, sys
out["subprocess"] = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout
compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
values = (ctypes.c_int * 3)(3, 1, 2)
libc.qsort(values, 3, ctypes.sizeof(ctypes.c_int), compare(lambda a, b: a[0] - b[0]))
out["thread"], out["ctypes callback"] = box, list(values)
out
"""


async def test_namespaces_mounts_ptrace_and_vsock_are_refused(worker: SandboxWorker) -> None:
    result = await worker.run(PROBES.replace("BPF", str(BPF)))
    assert result.error is None and result.value is not None, result
    out = ast.literal_eval(result.value)
    refused = {
        "unshare(user)": "EPERM",
        "unshare(user|mount)": "EPERM",
        "unshare(net)": "EPERM",
        "mount": "EPERM",
        "bpf": "EPERM",
        "ptrace(attach child)": "EPERM",
        "socket(vsock)": "EPERM",
        "prctl(subreaper off)": "EPERM",
    }
    assert {k: out[k] for k in refused} == refused
    assert (out["Seccomp"], out["NoNewPrivs"]) == ("2", "1")  # a filter is in place, no setuid gains
    assert out["fork"] == 7 and out["subprocess"] == "42\n"
    assert out["thread"] == [1] and out["ctypes callback"] == [1, 2, 3]
    assert worker.isolation["seccomp"].startswith("filter"), worker.isolation


async def test_clone3_reports_enosys_so_libc_falls_back_to_clone(worker: SandboxWorker) -> None:
    """clone3 passes its flags in memory the filter cannot read: it is refused as unknown."""
    result = await worker.run(
        "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "args = (ctypes.c_uint64 * 11)(0x10000000)  # CLONE_NEWUSER\n"
        "libc.syscall(435, args, ctypes.sizeof(args)), errno.errorcode[ctypes.get_errno()]"
    )
    assert result.value == "(-1, 'ENOSYS')", result
