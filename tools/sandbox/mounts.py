"""The worker's filesystem: the read-only root it is shown, the session's own mounts, entering it.

``build_root`` lays out a tmpfs like ``/`` holding only what Python needs (deny by default;
the template builds it once per ``hide`` list and every worker gets a copy with its mount
namespace), ``session_mounts`` adds what is one session's own, ``enter_namespaces`` and
``enter_root`` make it the worker's root. What each step guarantees is in ``tools.sandbox``'s
docstring. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

from .libc import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    LIBC,
    MACHINE,
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    Mount,
    libc_call,
)
from .seccomp import SYSCALLS

__all__ = ["SESSION_TMPFS", "blocked", "build_root", "enter_namespaces", "session_mounts", "shareable"]

# fmt: off
# What the new root shows of the host besides the interpreter (all read-only).
SYSTEM_PATHS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
)
DEVICES = ("null", "zero", "full", "random", "urandom")
SESSION_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")  # a worker's own, writable: mounted per session
IDENTITY_FILES = ("/etc/passwd", "/etc/group")  # naming the worker's uid: bound per session
# fmt: on


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


def mount_proc(mount: Mount) -> str:
    """A /proc of its own, mounted once in the new root: it lists the processes of the worker's
    PID namespace (its own, where the template gives it one), and of those only its uid's
    (hidepid needs Linux >= 5.8)."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    whose = "its own PID namespace's" if os.getpid() == 1 else "the host's PID namespace's (weak)"
    try:
        mount("proc", "/proc", "proc", flags, "hidepid=invisible")
        return f"own processes only (hidepid; {whose} pids)"
    except OSError as exc:
        mount("proc", "/proc", "proc", flags)
        return f"every process of {whose} pids visible ({exc})"


def identity(uid: int | None) -> tuple[str, str]:
    """/etc/passwd and /etc/group: root and, as root, the worker's own uid."""
    named = uid is not None
    return (
        "root:x:0:0::/root:/usr/sbin/nologin\n"
        + (f"sandbox:x:{uid}:{uid}::/tmp:/usr/sbin/nologin\n" if named else ""),
        "root:x:0:\n" + (f"sandbox:x:{uid}:\n" if named else ""),
    )


def private_tmpfs(mount: Mount, top: str, uid: int | None, tmpfs_mb: int) -> None:
    """The session's writable places: size-capped tmpfs mounts, mode 0700, owned by its uid."""
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    for path, size in zip(SESSION_TMPFS, (tmpfs_mb, 4, 4), strict=True):
        mount(
            "tmpfs",
            top + path,
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={size}m,nr_inodes=4096,mode=0700{owner}",
        )


def build_root(
    mount: Mount, top: str, hide: list[str], *, uid: int | None = None, own: bool = False, tmpfs_mb: int = 0
) -> None:
    """A tmpfs at top laid out like /, holding only what Python needs (deny by default), sealed
    read-only. Its ``/proc`` is an empty mount point: each worker mounts its own there once
    inside (``mount_proc``), for its own PID namespace.

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
        private_tmpfs(mount, top, uid, tmpfs_mb)
    for path, text in zip(IDENTITY_FILES, identity(uid) if own else ("", ""), strict=True):
        root.write(path, text)
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            root.bind("/dev/" + name, MS_NOSUID)  # writable device nodes
    for name, target in (("fd", ""), ("stdin", "/0"), ("stdout", "/1"), ("stderr", "/2")):
        os.symlink("/proc/self/fd" + target, root.inner("/dev/" + name))
    root.mkdirs("/proc")
    for path in SYSTEM_PATHS:
        root.show(path)
    hidden = [os.path.realpath(p) for p in hide]
    for path in hidden:
        root.cover(path)
    for path in interpreter_paths(hidden):
        root.show(path)
    root.seal()
    mount(None, top, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def session_mounts(mount: Mount, uid: int | None, tmpfs_mb: int) -> None:
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
    private_tmpfs(mount, "", uid, tmpfs_mb)


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
    mount: Mount,
    report: dict[str, str],
    prepared: str | None,
    *,
    hostdir: str = "",
    hide: list[str] | None = None,
    uid: int | None = None,
    tmpfs_mb: int = 0,
) -> None:
    """New mount, network and IPC namespaces, and the new root. The root is the template's ``prepared``
    one, which the new mount namespace holds as a copy (a spare enters it ahead of demand, with
    no session yet); without one the worker builds its own in ``hostdir``, session mounts included."""
    # IPC: SysV shared memory, semaphores and message queues (and POSIX mqueues) are per IPC
    # namespace and outlive their processes: in the host's, one session could leave a segment
    # that another attaches to, and its memory would stay after both are gone.
    try:
        libc_call(LIBC, "unshare(mount, net, ipc)", LIBC.unshare, CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)
        report["ipc"] = "IPC namespace of its own (SysV IPC, POSIX message queues)"
    except OSError as exc:  # a kernel without IPC namespaces: the rest still holds
        libc_call(LIBC, "unshare(mount, net)", LIBC.unshare, CLONE_NEWNS | CLONE_NEWNET)
        report["ipc"] = f"the host's (weak: {exc})"
    report["network"] = "network namespace (no interfaces up)"
    built = None
    try:
        if prepared:
            top = prepared
        else:
            mount("none", "/", None, MS_REC | MS_PRIVATE)
            built = top = os.path.join(hostdir, "root")
            os.mkdir(top, 0o755)
            build_root(mount, top, hide or [], uid=uid, own=True, tmpfs_mb=tmpfs_mb)
        report["root"] = enter_root(LIBC, mount, top)
    except BaseException:
        if built:  # drop the half-built root; the weak mode follows
            LIBC.umount2(built.encode(), MNT_DETACH)
        raise
    try:
        report["proc"] = mount_proc(mount)
    except OSError as exc:  # inside the new root: no weak mode to fall back to
        raise RuntimeError(f"mounting /proc in the new root failed: {exc}") from None
