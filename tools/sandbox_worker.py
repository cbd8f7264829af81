"""The sandbox's side: the template process and the workers it forks.

``tools.sandbox_zygote`` starts ``python -I sandbox_worker.py --template STAGE``: the *template*
(a zygote) imports this module and a fixed list of standard modules (``COMMON_MODULES``),
freezes them for the garbage collector, and then only ever answers two requests from the
server on its socket: "fork a worker with this config and these four fds" and "reap this
worker". It never receives code. As root it also builds, once per ``hide`` list and in a
mount namespace of its own, the read-only root every worker gets (``build_root``; a
worker's ``unshare(CLONE_NEWNS)`` copies it), and keeps ``SPARES_PER_ROOT`` spare children
that have entered their namespaces and that root ahead of demand; a fork request is handed
to a spare when one is ready. Each child (spare or forked on demand) closes the template's
socket and every fd not its own, re-seeds ``random`` once it has its session, then confines
its own process (namespaces, new root, its session's mounts, uid, limits, seccomp: what each
step guarantees is in ``tools.sandbox``'s docstring) and serves requests framed on its
control pipes: each request's code is ``exec``-ed in one persistent namespace, and the value
of a trailing expression is returned like a REPL does.

Standard library only, nothing from the project: it runs under whichever interpreter the
server names, with the project's files hidden. The interpreter reads and compiles this
file before any of it runs, so the file need not be visible from inside the new root.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import ctypes
import gc
import io
import json
import linecache
import os
import random
import resource
import select
import signal
import socket
import stat
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

MACHINE = os.uname().machine
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x08000000, 0x10000000, 0x40000000
CLONE_NEW_ANY = 0x7E020000  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 4096, 16384, 1 << 18, 2
PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 22, 36, 38
AF_VSOCK = 40  # host <-> VM sockets: not confined by a network namespace

# The tables below keep one line per group: ruff would put one item a line.
# fmt: off
# What the new root shows of the host besides the interpreter (all read-only).
SYSTEM_PATHS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
)
DEVICES = ("null", "zero", "full", "random", "urandom")
SESSION_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")  # a worker's own, writable: mounted per session
IDENTITY_FILES = ("/etc/passwd", "/etc/group")  # naming the worker's uid: bound per session

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

Mount = Callable[..., None]  # mount(src, target, fstype, flags, data=None), from mounter()


def send(obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(CTL_OUT, data) :]


def read_exact(n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(CTL_IN, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def receive() -> dict[str, Any] | None:
    head = read_exact(4)
    body = head and read_exact(int.from_bytes(head, "big"))
    return None if body is None else json.loads(body)


def libc_call(libc: ctypes.CDLL, what: str, fn: Any, *args: Any) -> None:
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def blocked(path: str, hidden: set[str]) -> tuple[str, str] | None:
    """(dir, child): the first directory on the way to path that is hidden or others cannot enter."""
    cur = "/"
    for comp in [c for c in path.split("/") if c]:
        if cur in hidden or not os.stat(cur).st_mode & stat.S_IXOTH:
            return cur, comp
        cur = os.path.join(cur, comp)
    return None


def within(path: str, tops: list[str]) -> bool:
    return any(path == top or path.startswith(top.rstrip("/") + "/") for top in tops)


def mounter(libc: ctypes.CDLL) -> Mount:
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]

    def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        src, fstype, data = (None if a is None else a.encode() for a in (src, fstype, data))
        libc_call(libc, "mount " + target, libc.mount, src, target.encode(), fstype, flags, data)

    return mount


class Root:
    """The new root under construction at top: host paths are shown at the same place inside it."""

    def __init__(self, mount: Mount, top: str) -> None:
        self.mount, self.top, self.covers = mount, top, []

    def inner(self, path: str) -> str:
        return self.top + path

    def mkdirs(self, path: str) -> None:
        if not os.path.lexists(self.inner(path)):
            os.makedirs(self.inner(path), 0o755)

    def tmpfs(self, path: str, options: str) -> None:
        self.mkdirs(path)
        self.mount("tmpfs", self.inner(path), "tmpfs", MS_NOSUID | MS_NODEV, options)

    def bind(self, path: str, flags: int = MS_RDONLY | MS_NOSUID | MS_NODEV) -> None:
        """Bind one host file or directory (not what is mounted below it) at the same path."""
        host, inner = os.stat(path), self.inner(path)
        try:
            seen = os.stat(inner)
            if (seen.st_dev, seen.st_ino) == (host.st_dev, host.st_ino):
                return  # already visible through a tree shown before
        except FileNotFoundError:
            pass
        if stat.S_ISDIR(host.st_mode):
            self.mkdirs(path)
        elif not os.path.lexists(inner):
            self.mkdirs(os.path.dirname(path))
            os.close(os.open(inner, os.O_CREAT | os.O_WRONLY, 0o644))
        self.mount(path, inner, None, MS_BIND)
        self.mount(None, inner, None, MS_REMOUNT | MS_BIND | flags)  # a bind ignores flags: remount

    def show(self, path: str, hops: int = 0) -> None:
        """Make a host path visible, read-only, with every symlink on the way to it (if it exists)."""
        parts = [c for c in path.split("/") if c]
        cur = "/"
        for i, comp in enumerate(parts):
            nxt = os.path.join(cur, comp)
            try:
                mode = os.lstat(nxt).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return
            if stat.S_ISLNK(mode):
                if hops > 40:
                    raise OSError(f"too many symlinks on the way to {path}")
                target = os.readlink(nxt)
                if not os.path.lexists(self.inner(nxt)):
                    os.symlink(target, self.inner(nxt))
                rest = "/".join(parts[i + 1 :])
                return self.show(os.path.normpath(os.path.join(cur, target, rest)), hops + 1)
            if i < len(parts) - 1:
                self.mkdirs(nxt)
            cur = nxt
        self.bind(cur)

    def cover(self, path: str) -> None:
        """Hide a path that a shown tree reveals: an empty tmpfs over a directory, /dev/null over a file."""
        inner = self.inner(path)
        if os.path.islink(inner) or not os.path.exists(inner):
            return
        if os.path.isdir(inner):
            self.tmpfs(path, "size=16k,nr_inodes=64,mode=0755")
        else:
            self.mount("/dev/null", inner, None, MS_BIND)
        self.covers.append(inner)

    def write(self, path: str, text: str) -> None:
        self.mkdirs(os.path.dirname(path))
        with open(self.inner(path), "w") as fh:
            fh.write(text)

    def seal(self) -> None:
        for inner in self.covers:
            self.mount(None, inner, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def interpreter_paths(hidden: list[str]) -> list[str]:
    """Its prefixes and executable, and the sys.path entries outside hidden dirs (or inside a prefix)."""
    prefixes = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}
    real_prefixes = [os.path.realpath(p) for p in prefixes]
    paths = prefixes | {sys.executable}
    for entry in sys.path:
        if entry and os.path.exists(entry):
            real = os.path.realpath(entry)
            if within(real, real_prefixes) or not within(real, hidden):
                paths.add(entry)
    return sorted(paths)


def mount_proc(root: Root) -> str:
    """A /proc of its own that lists only processes of its uid (hidepid needs Linux >= 5.8)."""
    root.mkdirs("/proc")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:
        root.mount("proc", root.inner("/proc"), "proc", flags, "hidepid=invisible")
        return "own processes only (hidepid)"
    except OSError as exc:
        root.mount("proc", root.inner("/proc"), "proc", flags)
        return f"host processes visible ({exc})"


def identity(uid: int | None) -> tuple[str, str]:
    """/etc/passwd and /etc/group: root and, as root, the worker's own uid."""
    named = uid is not None
    return (
        "root:x:0:0::/root:/usr/sbin/nologin\n"
        + (f"sandbox:x:{uid}:{uid}::/tmp:/usr/sbin/nologin\n" if named else ""),
        "root:x:0:\n" + (f"sandbox:x:{uid}:\n" if named else ""),
    )


def private_tmpfs(mount: Mount, top: str, uid: int | None) -> None:
    """The session's writable places: size-capped tmpfs mounts, mode 0700, owned by its uid."""
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    for path, size in zip(SESSION_TMPFS, (CONFIG["tmpfs_mb"], 4, 4), strict=True):
        mount(
            "tmpfs",
            top + path,
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={size}m,nr_inodes=4096,mode=0700{owner}",
        )


def build_root(mount: Mount, top: str, hide: list[str], *, uid: int | None = None, own: bool = False) -> str:
    """A tmpfs at top laid out like /, holding only what Python needs (deny by default), sealed
    read-only. Returns how /proc is confined.

    Shared (``own`` false): what it holds is the same for every session of one ``hide`` list,
    so the template builds it once per list in its own mount namespace and each worker gets
    it as a copy; the session's parts (``session_mounts``) go on its empty mount points later.
    Own: a worker builds it for itself with its private tmpfs mounts first, so that interpreter
    files under /tmp (a venv there) are shown on top of them, and its identity files in place.
    """
    mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    root = Root(mount, top)
    for path in SESSION_TMPFS:
        root.mkdirs(path)
    if own:
        private_tmpfs(mount, top, uid)
    for path, text in zip(IDENTITY_FILES, identity(uid) if own else ("", ""), strict=True):
        root.write(path, text)
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            root.bind("/dev/" + name, MS_NOSUID)  # writable device nodes
    for name, target in (("fd", ""), ("stdin", "/0"), ("stdout", "/1"), ("stderr", "/2")):
        os.symlink("/proc/self/fd" + target, root.inner("/dev/" + name))
    proc = mount_proc(root)
    for path in SYSTEM_PATHS:
        root.show(path)
    hidden = [os.path.realpath(p) for p in hide]
    for path in hidden:
        root.cover(path)
    for path in interpreter_paths(hidden):
        root.show(path)
    root.seal()
    mount(None, top, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return proc


def session_mounts(mount: Mount, uid: int | None) -> None:
    """What is this session's own, mounted inside the shared root: /etc/passwd and /etc/group
    naming its uid (written on a scratch tmpfs at /tmp and bound read-only from there), then
    its private tmpfs mounts, the /tmp one over the scratch: no path reaches the scratch again,
    and unmounting it would cost an RCU grace period on the start's path."""
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16k,nr_inodes=8,mode=0700")
    for path, text in zip(IDENTITY_FILES, identity(uid), strict=True):
        scratch = "/tmp/" + os.path.basename(path)
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, text.encode())
        os.close(fd)
        mount(scratch, path, None, MS_BIND)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    private_tmpfs(mount, "", uid)


def shareable(hide: list[str]) -> bool:
    """Whether one root can serve every session: not when interpreter files lie where each
    session mounts its own tmpfs (a venv under /tmp would be covered by the session's /tmp)."""
    hidden = [os.path.realpath(p) for p in hide]
    return not any(within(os.path.realpath(p), list(SESSION_TMPFS)) for p in interpreter_paths(hidden))


def enter_root(libc: ctypes.CDLL, mount: Mount, top: str) -> str:
    """Make top the root: pivot_root and detach the host's tree (chroot where pivot_root is refused)."""
    os.chdir(top)
    try:
        nr = SYSCALLS.get(MACHINE, (0, {}))[1].get("pivot_root")
        if nr is None:
            raise OSError(f"no pivot_root number for {MACHINE}")
        libc_call(libc, "pivot_root", libc.syscall, ctypes.c_long(nr), b".", b".")
        libc_call(libc, "umount old root", libc.umount2, b".", MNT_DETACH)
        how = "pivot_root"
    except OSError as exc:
        os.chroot(".")  # the worker drops root and cannot chroot again, so this holds too
        how = f"chroot ({exc})"
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return how


def enter_namespaces(
    mount: Mount, report: dict[str, str], prepared: tuple[str, str] | None, hostdir: str, hide: list[str]
) -> None:
    """New mount, network and IPC namespaces, and the new root. The root is the template's ``prepared``
    one, which the new mount namespace holds as a copy (a spare enters it ahead of demand, with
    no session yet); without one the worker builds its own in ``hostdir``, session mounts included."""
    # IPC: SysV shared memory, semaphores and message queues (and POSIX mqueues) are per IPC
    # namespace and outlive their processes: in the host's, one session could leave a segment
    # that another attaches to, and its memory would stay after both are gone.
    libc_call(LIBC, "unshare(mount, net, ipc)", LIBC.unshare, CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)
    report["network"] = "network namespace (no interfaces up)"
    report["ipc"] = "IPC namespace of its own (SysV IPC, POSIX message queues)"
    built = None
    try:
        if prepared:
            top, report["proc"] = prepared
        else:
            mount("none", "/", None, MS_REC | MS_PRIVATE)
            built = top = os.path.join(hostdir, "root")
            os.mkdir(top, 0o755)
            report["proc"] = build_root(mount, top, hide, uid=CONFIG["uid"], own=True)
        report["root"] = enter_root(LIBC, mount, top)
    except BaseException:
        if built:  # drop the half-built root; the weak mode follows
            LIBC.umount2(built.encode(), MNT_DETACH)
        report.pop("proc", None)
        raise


def isolate_namespaces(uid: int | None, report: dict[str, str]) -> str:
    """Namespaces and a fresh root that shows only what Python needs, then the session's mounts."""
    mount = mounter(LIBC)
    prepared = CONFIG.get("prepared")
    if ENTERED is None:
        enter_namespaces(mount, report, prepared, CONFIG["hostdir"], CONFIG["hide"])
    else:
        report.update(ENTERED)  # a spare entered them before it was assigned
    try:
        if ENTERED is not None or prepared:  # a shared root: the session's parts go on it now
            session_mounts(mount, uid)
    except OSError as exc:  # inside the new root: no weak mode to fall back to
        raise RuntimeError(f"the session's mounts in the new root failed: {exc}") from None
    report["filesystem"] = (
        "mount namespace, new root: system and interpreter files only (read-only); "
        "private tmpfs /tmp, /var/tmp, /dev/shm"
    )
    return "/tmp"


def drop_capabilities(libc: ctypes.CDLL) -> None:
    """capset(2) with empty sets: no capabilities left, in any namespace."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, twice (64-bit sets)
    libc_call(libc, "capset", libc.capset, header, data)


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


def tasks_of_user(uid: int) -> int:
    """Processes and threads of uid: what RLIMIT_NPROC counts."""
    total = 0
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status", "rb") as fh:
                status = fh.read()
            if int(status.partition(b"\nUid:")[2].split()[0]) == uid:
                total += int(status.partition(b"\nThreads:")[2].split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def block_network(event: str, args: tuple[Any, ...]) -> None:
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
        raise PermissionError("network access is disabled in this sandbox")


def confine() -> dict[str, str]:
    report: dict[str, str] = {}
    uid = CONFIG["uid"]
    libc = LIBC
    os.umask(0o022)
    workdir = CONFIG["hostdir"]
    mounted = False
    report["filesystem"] = "private host directory (weak: no mount namespace)"
    if not CONFIG["namespaces"]:
        report["namespaces_error"] = "disabled by configuration"
    elif os.geteuid() != 0:
        report["namespaces_error"] = "not root"
    else:
        try:
            workdir = isolate_namespaces(uid, report)
            mounted = True
        except OSError as exc:
            report["namespaces_error"] = str(exc)
    if "network" not in report:
        try:
            if not CONFIG["namespaces"] or os.geteuid() == 0:
                raise OSError("skipped")
            libc_call(
                libc, "unshare(user, net, ipc)", libc.unshare, CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC
            )
            drop_capabilities(libc)  # a new user namespace grants all capabilities inside it
            report["network"] = "user + network namespace"
            report["ipc"] = "IPC namespace of its own (in the user namespace)"
        except OSError:
            sys.addaudithook(block_network)
            report["network"] = "audit hook (weak: blocks socket calls made through Python)" + (
                ", inside the template's empty network namespace"
                if TEMPLATE_NETWORK.startswith("own")
                else ""
            )
    os.chdir(workdir)

    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (CONFIG["worker_cpu_s"], CONFIG["worker_cpu_s"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (CONFIG["max_file_mb"] * mb, CONFIG["max_file_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (CONFIG["max_open_files"], CONFIG["max_open_files"]))
    nproc = CONFIG["max_processes"]
    if uid is None:  # shared uid: allow this many more than the user already runs
        nproc += tasks_of_user(os.getuid())
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if uid is not None:
        if not mounted:
            hit = next((h for h in (blocked(p, set()) for p in (sys.base_prefix, sys.prefix)) if h), None)
            if hit:
                raise OSError(
                    f"cannot drop privileges: the interpreter is under {hit[0]}, which other users cannot "
                    "enter, and no mount namespace is available to expose it (needs CAP_SYS_ADMIN); "
                    "install Python in a world-readable location"
                )
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        report["user"] = f"uid {uid} (dedicated, unprivileged)"
    else:
        report["user"] = f"uid {os.getuid()} (the server's own user)"
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans come back here, not to the host's init
    report["processes"] = f"RLIMIT_NPROC={nproc}" + (
        "" if uid is not None else " (shared with the server's user)"
    )
    os.environ.update(HOME=workdir, TMPDIR=workdir, PWD=workdir)
    sys.path.insert(0, workdir)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-long writes raise OSError instead
    for name in CONFIG["preload"]:
        __import__(name)
    memory = CONFIG["memory_mb"] * mb
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    report["seccomp"] = install_seccomp(libc)  # the last step: untrusted code runs next
    return report


def setup_stdio() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(CONFIG["stdout_fd"], 1)
    os.dup2(CONFIG["stderr_fd"], 2)
    for fd in (devnull, CONFIG["stdout_fd"], CONFIG["stderr_fd"]):
        os.close(fd)
    out = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    err = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    return out, err


def clean(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def capped(text: str, limit: int) -> tuple[str, bool]:
    return (text, False) if len(text) <= limit else (text[:limit], True)


def exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def format_error(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next  # drop the worker's own frames
    return "".join(traceback.format_exception(type(exc), exc, tb))


def reap_children() -> None:
    """Collect finished children: those the server killed after the last call, and orphans
    (this process is their subreaper), so they stop counting against RLIMIT_NPROC."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def execute(
    request: dict[str, Any],
    namespace: dict[str, Any],
    number: int,
    out: io.TextIOWrapper,
    err: io.TextIOWrapper,
) -> dict[str, Any]:
    reap_children()
    code = request["code"]
    limit = request["max_output"]
    name = f"<cell {number}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    sys.stdin = io.StringIO(request["stdin"])
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = err
    used = resource.getrusage(resource.RUSAGE_SELF)
    hard = CONFIG["worker_cpu_s"]
    soft = min(hard, int(used.ru_utime + used.ru_stime) + 1 + request["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    reply = {"value": None, "error": None, "exit_code": 0, "truncated": False}
    try:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), namespace)  # noqa: S102 - what the sandbox is for
        if last is not None:
            value = eval(compile(last, name, "eval"), namespace)  # noqa: S307 - likewise
            if value is not None:
                namespace["_"] = value
                reply["value"], reply["truncated"] = capped(clean(repr(value)), limit)
    except SystemExit as exc:
        reply["exit_code"] = exit_status(exc.code)
    except BaseException as exc:
        try:
            reply["error"], cut = capped(clean(format_error(exc)), limit)
        except BaseException:
            reply["error"], cut = clean(f"{type(exc).__name__} (traceback unavailable)"), False
        reply["truncated"] = reply["truncated"] or cut
        reply["exit_code"] = 1
    return reply


def main() -> None:
    try:
        out, err = setup_stdio()
        report = confine()
    except BaseException as exc:
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(70)
    send({"ready": True, "pid": MAIN_PID, "isolation": {**report, "start": START}})
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    number = 0
    while True:
        request = receive()
        if request is None:
            os._exit(0)
        number += 1
        try:
            reply = execute(request, namespace, number, out, err)
        finally:
            if os.getpid() != MAIN_PID:
                os._exit(0)  # a forked child never speaks on the control channel
        reply["seq"] = request["seq"]  # lets the server skip a stale reply after a forged one
        try:
            send(reply)
        except MemoryError:
            send(
                {
                    "value": None,
                    "error": "MemoryError while sending the reply",
                    "exit_code": 1,
                    "truncated": True,
                    "seq": request["seq"],
                }
            )


# -- the template (zygote) ------------------------------------------------------------------
# Imported once by the template, then shared copy-on-write by every worker it forks: the
# worker's own modules (above) and what model-written code imports most. Nothing here may
# start a thread, hold a secret or draw a random seed that is not re-drawn in the child
# (``random`` is; ``multiprocessing``, whose auth key is drawn at import, is left out).
COMMON_MODULES = (
    "abc", "array", "base64", "bisect", "calendar", "cmath", "collections", "contextlib", "copy",
    "csv", "dataclasses", "datetime", "decimal", "enum", "fractions", "functools", "hashlib",
    "heapq", "itertools", "math", "numbers", "operator", "pprint", "re", "statistics", "string",
    "struct", "textwrap", "time", "typing", "unicodedata",
)  # fmt: skip
# Made once, in the template, so that a worker's first steps allocate and touch less of its own.
LIBC = ctypes.CDLL(None, use_errno=True)
for _name in ("mount", "umount2", "unshare", "syscall", "prctl", "capset"):
    getattr(LIBC, _name)  # resolved and cached on LIBC now
SECCOMP_FILTER = seccomp_filter()
FORGOTTEN: set[int] = set()  # workers the server stopped waiting for: reaped once they exit
TEMPLATE_NETWORK = ""  # the template's own network: what a worker without namespaces stays in
STAGE = ""  # where the template mounts prepared roots, in its own mount namespace ("" if none)
PREPARED: dict[tuple[str, ...], tuple[str, str] | None] = {}  # hide list: (root, /proc report)
# Spare children per prepared root: forked ahead of demand, namespaces and root entered, waiting
# for one session each (pid, the template's end of their socket). Two cover a burst of starts;
# each costs a process (mostly shared pages) and its two namespaces.
SPARES_PER_ROOT = 2
SPARES: dict[tuple[str, ...], list[tuple[int, socket.socket]]] = {}
ENTERED: dict[str, str] | None = None  # in a spare: what entering its namespaces reported
START = ""  # how this worker was started, for its report
_WORKER_FDS = 4  # control in, control out, captured stdout, captured stderr


def confine_template() -> str:
    """What the template does to itself without taking anything from the workers it forks.

    It keeps root (each worker needs it to build its namespaces and drop to its own uid);
    it gets no seccomp filter (a worker would inherit it and could not mount); it leaves
    the network: as root, an empty network namespace of its own.
    """
    os.chdir("/")
    os.umask(0o022)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = LIBC
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if os.geteuid() != 0:
        return "the server's (not root)"
    try:
        libc_call(libc, "unshare(net)", libc.unshare, CLONE_NEWNET)
    except OSError as exc:
        return f"the server's ({exc})"
    return "own network namespace (no interfaces up)"


def open_stage(stage: str) -> str:
    """A mount namespace of the template's own with a tmpfs at ``stage`` (a directory the server
    made for it) to hold the prepared roots: none of it is seen outside the template and the
    workers it forks. Returns the stage, or "" when that is refused (workers build their own)."""
    if not stage or os.geteuid() != 0:
        return ""
    mount = mounter(LIBC)
    try:
        libc_call(LIBC, "unshare(mount)", LIBC.unshare, CLONE_NEWNS)
        mount("none", "/", None, MS_REC | MS_PRIVATE)  # so the copies a worker makes stay private too
        mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=256,mode=0700")
    except OSError:
        return ""
    return stage


def prepared_root(config: dict[str, Any]) -> tuple[str, str] | None:
    """(root, how /proc is confined) prepared for this config's ``hide`` list, built on first use;
    None where the worker builds its own (no stage, namespaces off, or building failed)."""
    if not STAGE or not config.get("namespaces"):
        return None
    key = tuple(map(str, config.get("hide") or ()))
    if key not in PREPARED:
        top = os.path.join(STAGE, str(len(PREPARED)))
        try:
            if not shareable(list(key)):
                raise OSError("interpreter files under a session's private tmpfs")
            os.mkdir(top, 0o755)
            PREPARED[key] = (top, build_root(mounter(LIBC), top, list(key)))
        except OSError:
            LIBC.umount2(top.encode(), MNT_DETACH)
            PREPARED[key] = None  # each worker of this list tries itself, and reports why it failed
    prepared = PREPARED[key]
    if prepared is not None and not os.path.ismount(prepared[0]):  # the stage was removed on the host
        PREPARED[key] = prepared = None
    return prepared


def threads() -> int:
    with open("/proc/self/status", "rb") as fh:
        return int(fh.read().partition(b"\nThreads:")[2].split()[0])


def cut_ties(template: socket.socket, keep: list[int]) -> None:
    """In a forked child, first: close the template's socket, the spares' sockets and every fd
    not in ``keep``, so that nothing it does can reach the template or another session again."""
    template.close()
    for spares in SPARES.values():
        for _, sock in spares:
            sock.detach()  # closed below; the object must not close that number again later
    SPARES.clear()
    keep = sorted({0, 1, 2, *keep})
    for low, high in zip(keep, [*keep[1:], 1 << 20], strict=True):
        os.closerange(low + 1, high)  # no fd of the template's, or of any other session's
    os.setsid()  # its own process group: the server kills the worker and its children as one


def start_worker(config: dict[str, Any], fds: list[int], how: str) -> None:
    """Take on one session: its config and its four fds, then confine and serve (main)."""
    global CONFIG, CTL_IN, CTL_OUT, MAIN_PID, START
    random.seed()  # os.fork's at-fork hook did too; a session must not predict another's draws
    CTL_IN, CTL_OUT, out_fd, err_fd = fds
    CONFIG = {**config, "stdout_fd": out_fd, "stderr_fd": err_fd}
    MAIN_PID = os.getpid()
    START = how
    main()


def become_worker(template: socket.socket, config: dict[str, Any], fds: list[int]) -> NoReturn:
    """In a child forked for a request: run as that session's worker (never returns)."""
    try:
        cut_ties(template, fds)
        start_worker(config, fds, "forked from the pre-warmed template process on demand")
    finally:
        os._exit(70)  # whatever happens, a child never returns into the template's loop


def become_spare(template: socket.socket, mine: socket.socket, prepared: tuple[str, str]) -> NoReturn:
    """In a spare child: enter new namespaces and the prepared root, then wait to be assigned one
    session (its config and fds arrive on ``mine``). It holds nothing of any session until then
    and runs no code of one before it is confined; it exits if the template goes away."""
    global ENTERED
    try:
        cut_ties(template, [mine.fileno()])
        report: dict[str, str] = {}
        enter_namespaces(mounter(LIBC), report, prepared, "", [])
        ENTERED = report
        data, fds, _, _ = socket.recv_fds(mine, 1 << 16, _WORKER_FDS)
        mine.close()
        if data and len(fds) == _WORKER_FDS:
            start_worker(json.loads(data), fds, "a spare forked from the template ahead of demand")
    finally:
        os._exit(70)


def fork_spare(template: socket.socket, key: tuple[str, ...]) -> None:
    """One more spare for the prepared root of ``key`` (the template keeps its end of the socket)."""
    prepared = PREPARED.get(key)
    if prepared is None or threads() != 1:
        return
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid == 0:
        ours.close()
        become_spare(template, theirs, prepared)
    theirs.close()
    if pid < 0:
        ours.close()
        return
    SPARES.setdefault(key, []).append((pid, ours))


def assign_spare(key: tuple[str, ...], config: dict[str, Any], fds: list[int]) -> int | None:
    """Hand a session to a spare of this root: its pid, or None when none is left alive."""
    spares = SPARES.get(key, [])
    while spares:
        pid, sock = spares.pop(0)
        try:
            socket.send_fds(sock, [json.dumps(config).encode()], fds)
            return pid
        except OSError:  # it died (killed from outside): reap it, try the next
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        finally:
            sock.close()
    return None


def refill_spares(template: socket.socket) -> None:
    """Fork spares up to SPARES_PER_ROOT for every prepared root, while no request waits."""
    waiting = select.poll()
    waiting.register(template, select.POLLIN)
    for key, prepared in list(PREPARED.items()):
        while prepared is not None and len(SPARES.get(key, ())) < SPARES_PER_ROOT and not waiting.poll(0):
            before = len(SPARES.get(key, ()))
            fork_spare(template, key)
            if len(SPARES.get(key, ())) == before:
                return  # could not fork now: try again after the next request


def reaped(pid: int) -> int | str | None:
    """A child's exit code once it has exited (reaping it), "running", or None if not a child."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return "running" if done == 0 else os.waitstatus_to_exitcode(status)


def answer(
    template: socket.socket, request: dict[str, Any], fds: list[int]
) -> tuple[dict[str, Any], int | None]:
    """One request of the server: fork a worker (the reply carries a pidfd) or reap one.

    ``reap`` with ``later`` (the server gave up waiting for it): reap it whenever it has exited.
    """
    for pid in list(FORGOTTEN):
        if reaped(pid) != "running":
            FORGOTTEN.discard(pid)
    op = request.get("op")
    if op == "reap":
        pid = int(request["pid"])
        status = reaped(pid)
        if status == "running" and request.get("later"):
            FORGOTTEN.add(pid)
        return ({"running": True} if status == "running" else {"status": status}), None
    if op != "fork" or len(fds) != _WORKER_FDS or not isinstance(request.get("config"), dict):
        return {"error": f"not a request the template serves: {op!r} with {len(fds)} fds"}, None
    if threads() != 1:  # fork copies only the calling thread: a lock held elsewhere would stay held
        return {"error": "the template has started a thread; it no longer forks"}, None
    config = {**request["config"], "prepared": prepared_root(request["config"])}  # never the server's
    pid = None
    if config["prepared"] is not None:
        pid = assign_spare(tuple(map(str, config.get("hide") or ())), config, fds)
    if pid is None:
        pid = os.fork()
        if pid == 0:
            become_worker(template, config, fds)
    return {"pid": pid}, os.pidfd_open(pid)  # the server's handle: never a recycled pid


def tell(template: socket.socket, reply: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    socket.send_fds(template, [json.dumps(reply).encode()], list(fds))


def template_main(stage: str) -> NoReturn:
    """Serve fork and reap requests on fd 0 (a SOCK_SEQPACKET socket) until the server hangs up."""
    global TEMPLATE_NETWORK, STAGE
    template = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    try:
        TEMPLATE_NETWORK = confine_template()
        STAGE = open_stage(stage)
        for name in COMMON_MODULES:
            __import__(name)
        gc.collect()
        gc.freeze()  # a worker's collections never touch these objects: their pages stay shared
    except BaseException as exc:
        tell(template, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(70)
    tell(template, {"ready": True, "network": TEMPLATE_NETWORK})
    os.dup2(devnull, 2)  # the server stops reading the template's stderr once it is ready
    os.close(devnull)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(template, 1 << 16, _WORKER_FDS + 1)
        except OSError:
            leave(stage)
        if not data:
            leave(stage)  # the server is gone
        pidfd = None
        try:
            reply, pidfd = answer(template, json.loads(data), fds)
        except Exception as exc:  # a malformed request never ends the template
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)  # the worker has its copies; the template keeps none
        try:
            tell(template, reply, () if pidfd is None else (pidfd,))
        except OSError:
            leave(stage)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        refill_spares(template)  # off the request's path: the server has its answer


def leave(stage: str) -> NoReturn:
    """Exit once the server is gone, removing the directory it made for the stage (it may have
    died without a chance to: a server killed by a signal runs no atexit)."""
    with contextlib.suppress(OSError):
        if STAGE:
            libc_call(LIBC, "umount stage", LIBC.umount2, STAGE.encode(), MNT_DETACH)
        os.rmdir(stage)
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--template":
        sys.exit("usage: python -I sandbox_worker.py --template STAGE_DIR  (started by tools.sandbox_zygote)")
    CONFIG: dict[str, Any] = {}
    CTL_IN = CTL_OUT = MAIN_PID = -1  # a forked worker sets its own
    template_main(sys.argv[2])
