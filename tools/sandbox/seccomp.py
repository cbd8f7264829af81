"""The seccomp filter every worker installs last: syscall tables and the classic BPF program.

Why each group of syscalls is refused is in ``tools.sandbox``'s docstring. The program is
built once at import (in the template: every worker shares it). Standard library only.
"""

from __future__ import annotations

import ctypes

from .libc import AF_VSOCK, CLONE_NEW_ANY, MACHINE, PR_SET_CHILD_SUBREAPER, PR_SET_SECCOMP, libc_call

__all__ = ["DENIED", "SECCOMP_FILTER", "SYSCALLS", "install_seccomp", "seccomp_program"]

# The tables below keep one line per group: ruff would put one item a line.
# fmt: off
# Syscalls the seccomp filter refuses (EPERM), by group; why is in tools.sandbox's docstring.
DENIED = (
    # new namespaces, mounts, changing root: the filesystem and network confinement stay as set up
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "open_tree_attr",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # reaching into other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp",
    # memory outside every limit: a memfd's pages count neither to RLIMIT_AS nor to the tmpfs caps
    "memfd_create", "memfd_secret",
    # large kernel attack surface no Python code needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key",
    # host administration (these need capabilities the worker lacks; refused outright anyway)
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "syslog", "quotactl", "quotactl_fd", "lookup_dcookie", "fanotify_init", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "open_by_handle_at", "iopl", "ioperm",
    "uselib",
)
SYSCALLS = {  # machine: (AUDIT_ARCH, {name: number})
    "x86_64": (0xC000003E, dict(
        unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161, open_tree=428,
        open_tree_attr=467, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433,
        mount_setattr=442, ptrace=101, process_vm_readv=310, process_vm_writev=311, process_madvise=440,
        pidfd_getfd=438, kcmp=312, bpf=321, perf_event_open=298, userfaultfd=323, io_uring_setup=425,
        io_uring_enter=426, io_uring_register=427, keyctl=250, add_key=248, request_key=249,
        kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313, delete_module=176,
        reboot=169, swapon=167, swapoff=168, acct=163, syslog=103, quotactl=179, quotactl_fd=443,
        lookup_dcookie=212, fanotify_init=300, vhangup=153, settimeofday=164, clock_settime=227,
        clock_adjtime=305, adjtimex=159, open_by_handle_at=304, iopl=172, ioperm=173, uselib=134,
        memfd_create=319, memfd_secret=447, clone=56, clone3=435, socket=41, prctl=157, seccomp=317,
    )),
    "aarch64": (0xC00000B7, dict(
        unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51, open_tree=428,
        open_tree_attr=467, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433,
        mount_setattr=442, ptrace=117, process_vm_readv=270, process_vm_writev=271, process_madvise=440,
        pidfd_getfd=438, kcmp=272, bpf=280, perf_event_open=241, userfaultfd=282, io_uring_setup=425,
        io_uring_enter=426, io_uring_register=427, keyctl=219, add_key=217, request_key=218,
        kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273, delete_module=106,
        reboot=142, swapon=224, swapoff=225, acct=89, syslog=116, quotactl=60, quotactl_fd=443,
        lookup_dcookie=18, fanotify_init=262, vhangup=58, settimeofday=170, clock_settime=112,
        clock_adjtime=266, adjtimex=171, open_by_handle_at=265,
        memfd_create=279, memfd_secret=447, clone=220, clone3=435, socket=198, prctl=167, seccomp=277,
    )),
}

# fmt: on


def seccomp_program(arch: int, nrs: dict[str, int]) -> list[tuple[int, int, int, int]]:
    """Classic BPF: wrong arch kills, denied syscalls fail with EPERM, everything else runs."""
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    code = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if MACHINE == "x86_64":
        code += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # x32 syscall numbers
    for nr in sorted({nrs[name] for name in DENIED if name in nrs}):
        code += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    code += [(jeq, 0, 1, nrs["clone3"]), (ret, 0, 0, enosys)]  # flags out of reach: libc falls back to clone
    for name, test, value in (
        ("clone", jset, CLONE_NEW_ANY),  # fork and threads yes, new namespaces no
        ("socket", jeq, AF_VSOCK),
        ("prctl", jeq, PR_SET_CHILD_SUBREAPER),  # orphans must keep coming back to the worker
    ):
        code += [
            (jeq, 0, 4, nrs[name]),
            (ld, 0, 0, 16),
            (test, 0, 1, value),
            (ret, 0, 0, eperm),
            (ret, 0, 0, allow),
        ]
    code.append((ret, 0, 0, allow))
    return code


class SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_filter() -> SockFprog | None:
    """The filter program, built once at import (in the template: every worker shares it)."""
    if MACHINE not in SYSCALLS:
        return None
    code = seccomp_program(*SYSCALLS[MACHINE])
    return SockFprog(len(code), (SockFilter * len(code))(*code))


SECCOMP_FILTER = seccomp_filter()


def install_seccomp(libc: ctypes.CDLL) -> str:
    prog = SECCOMP_FILTER
    if prog is None:
        return f"unavailable: no syscall table for {MACHINE}"
    nrs = SYSCALLS[MACHINE][1]
    long = ctypes.c_long
    try:  # every thread (a preloaded module may have started some), else this one only
        libc_call(libc, "seccomp", libc.syscall, long(nrs["seccomp"]), long(1), long(1), ctypes.byref(prog))
    except OSError:
        try:
            libc_call(
                libc,
                "prctl(SECCOMP)",
                libc.prctl,
                long(PR_SET_SECCOMP),
                long(2),
                ctypes.byref(prog),
                long(0),
                long(0),
            )
        except OSError as exc:
            return f"unavailable: {exc}"
    return (
        f"filter: {prog.len} instructions "
        "(no namespaces, mounts, ptrace, memfd, bpf, io_uring, keyrings, vsock)"
    )
