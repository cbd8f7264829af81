"""The kernel calls the sandbox makes through ctypes: constants, the libc handle, mount(2).

Standard library only: loaded by the template (``worker.py --template``) as a sibling
of the worker's own code, and shared copy-on-write by every worker it forks.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "LIBC",
    "MACHINE",
    "Mount",
    "drop_capabilities",
    "libc_call",
    "mounter",
]

MACHINE = os.uname().machine
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
)  # fmt: skip
CLONE_NEW_ANY = 0x7E020000  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 4096, 16384, 1 << 18, 2
PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 22, 36, 38
AF_VSOCK = 40  # host <-> VM sockets: not confined by a network namespace

# Made once, in the template, so that a worker's first steps allocate and touch less of its own.
LIBC = ctypes.CDLL(None, use_errno=True)
for _name in ("mount", "umount2", "unshare", "setns", "syscall", "prctl", "capset"):
    getattr(LIBC, _name)  # resolved and cached on LIBC now

Mount = Callable[..., None]  # mount(src, target, fstype, flags, data=None), from mounter()


def libc_call(libc: ctypes.CDLL, what: str, fn: Any, *args: Any) -> None:
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mounter(libc: ctypes.CDLL) -> Mount:
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]

    def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        src, fstype, data = (None if a is None else a.encode() for a in (src, fstype, data))
        libc_call(libc, "mount " + target, libc.mount, src, target.encode(), fstype, flags, data)

    return mount


def drop_capabilities(libc: ctypes.CDLL) -> None:
    """capset(2) with empty sets: no capabilities left, in any namespace."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, twice (64-bit sets)
    libc_call(libc, "capset", libc.capset, header, data)
