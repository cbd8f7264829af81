"""A sandbox's processes, from the kernel's /proc (never from a worker's word): find, count, kill.

Read by the server after every call: which processes of a sandbox are left (by uid, or by
ancestry without one), the pids handed out since a call began (host pids: the worker's own
PID namespace is not the server's), CPU, and the memory its process tree holds (``held``); and
the processes a call left running, or every one of a uid, killed.
Raw ``os.open``/``os.read``: several of these run per call.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import struct
import time

__all__ = [
    "Clock",
    "cpu_seconds",
    "forks",
    "held",
    "kill_strays",
    "kill_uid",
    "last_pid",
    "new_pids",
    "pid_clock",
    "pids_in",
    "process_status",
    "processes_of",
    "pss_bytes",
    "started_none",
    "tree",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_read(path: str) -> bytes:
    """A /proc file's content, read without a Python file object."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_int(path: str, default: int) -> int:
    try:
        return int(_proc_read(path))
    except (OSError, ValueError):
        return default


_PID_MAX = _read_int("/proc/sys/kernel/pid_max", 1 << 22)


def _status(pid: int) -> tuple[int, int, bool] | None:
    """(real uid, parent pid, ended) of a process, None if gone; ``ended``: a zombie (it exited
    and was not reaped yet). A zombie thread-group leader whose other threads still run counts
    as running; a thread id (``/proc/<tid>`` exists, unlisted) is not a process.
    """
    try:
        status = _proc_read(f"/proc/{pid}/status")
        if int(status.partition(b"\nTgid:")[2].split(None, 1)[0]) != pid:
            return None
        state = status.partition(b"\nState:")[2].split(None, 1)[0]
        ended = state in (b"Z", b"X") and int(status.partition(b"\nThreads:")[2].split(None, 1)[0]) <= 1
        uid = int(status.partition(b"\nUid:")[2].split(None, 1)[0])
        return uid, int(status.partition(b"\nPPid:")[2].split(None, 1)[0]), ended
    except (OSError, ValueError, IndexError):
        return None


def process_status(pid: int) -> tuple[int, int] | None:
    """(real uid, parent pid) of a process that can still run, None if gone or a mere zombie."""
    status = _status(pid)
    return None if status is None or status[2] else status[:2]


def processes_of(uid: int) -> list[int]:
    """Processes of real uid ``uid`` that can still run, from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            status = process_status(int(entry))
            if status is not None and status[0] == uid:
                pids.append(int(entry))
    return pids


def kill_uid(uid: int) -> bool:
    """SIGKILL every process of a sandbox uid, repeatedly, until a fork bomb runs dry.
    False if some were still there after the last round (the uid must not be handed out)."""
    for _ in range(50):
        try:
            pids = processes_of(uid)
        except OSError:  # /proc unreadable (out of fds): not known to be gone
            return False
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)
    with contextlib.suppress(OSError):
        return not processes_of(uid)
    return False


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and of the children it has reaped (utime, stime, cutime, cstime)."""
    try:
        fields = _proc_read(f"/proc/{pid}/stat").rpartition(b")")[2].split()
        return sum(int(f) for f in fields[11:15]) / _CLK_TCK
    except (OSError, ValueError, IndexError):
        return 0.0


Clock = tuple[int, int]


def last_pid() -> int:
    """The last pid handed out in this PID namespace."""
    return int(_proc_read("/proc/loadavg").rsplit(None, 1)[1])


def forks() -> int:
    """Processes (and threads) forked host-wide since boot."""
    return int(_proc_read("/proc/stat").partition(b"\nprocesses ")[2].split(None, 1)[0])


def pid_clock() -> Clock:
    return last_pid(), forks()


def new_pids(start: Clock, end: Clock) -> list[range] | None:
    """The pids handed out between two clocks, or None when they may have gone all the way round.

    There is no PID namespace: this window is where a sandbox's new processes must be.
    """
    (first, forks0), (last, forks1) = start, end
    if forks1 - forks0 >= _PID_MAX // 2:  # pids in use are skipped: a lap may take fewer forks
        return None
    if last >= first:
        return [range(first + 1, last + 1)]
    return [range(first + 1, _PID_MAX), range(1, last + 1)]


def pids_in(window: list[range] | None) -> list[int]:
    if window is not None and sum(map(len, window)) <= 256:
        return [pid for r in window for pid in r]  # a few probes beat listing /proc
    pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    return pids if window is None else [p for p in pids if any(p in r for r in window)]


def pss_bytes(pid: int) -> int:
    """Proportional set size (shared pages split among their users); RSS where PSS is unavailable."""
    for path, key in ((f"/proc/{pid}/smaps_rollup", b"Pss:"), (f"/proc/{pid}/status", b"VmRSS:")):
        try:
            data = _proc_read(path)
        except OSError:
            continue
        value = data.partition(key)[2].split(None, 1)[:1]
        if value:
            return int(value[0]) * 1024
    return 0


def tree(root: int) -> list[int]:
    """``root`` and every process descended from it (the children of each of its threads, from
    ``/proc/<pid>/task/<tid>/children``). Orphans come back to the worker (its PID namespace's
    init, or its subreaper), so this is every process of its sandbox."""
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone meanwhile
            continue
        for tid in tids:
            with contextlib.suppress(OSError, ValueError):
                todo.extend(map(int, _proc_read(f"/proc/{pid}/task/{tid}/children").split()))
    return found


_PAGE = os.sysconf("SC_PAGE_SIZE")
# PROCMAP_QUERY (Linux 6.11): ask the kernel for a process's shared mappings only, instead of
# formatting its whole /proc/<pid>/maps (~10x the cost for a Python process).
_QUERY = struct.Struct("<9Q4I2Q")  # struct procmap_query
_PROCMAP_QUERY = (3 << 30) | (_QUERY.size << 16) | (ord("f") << 8) | 17  # _IOWR('f', 17, ...)
_SHARED_OR_NEXT = 0x08 | 0x10  # PROCMAP_QUERY_VMA_SHARED | PROCMAP_QUERY_COVERING_OR_NEXT_VMA


def _shared_mappings(pid: int) -> list[tuple[int, int, int, int]]:
    """(start, end, dev, inode) of each shared mapping of ``pid``: ``PROCMAP_QUERY`` where the
    kernel has it, else its /proc/<pid>/maps."""
    fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY)
    try:
        found = []
        addr = 0
        while True:
            query = bytearray(_QUERY.pack(_QUERY.size, _SHARED_OR_NEXT, addr, *[0] * 12))
            try:
                fcntl.ioctl(fd, _PROCMAP_QUERY, query)
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # no further shared mapping
                    return found
                if exc.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
                    break  # an older kernel
                raise
            start, end, inode, major, minor = _QUERY.unpack(query)[3:5] + _QUERY.unpack(query)[8:11]
            found.append((start, end, os.makedev(major, minor), inode))
            addr = end
        data = _proc_read(f"/proc/{pid}/maps")
    finally:
        os.close(fd)
    for line in data.splitlines():
        fields = line.split(None, 5)
        if len(fields) >= 5 and fields[1].endswith(b"s"):
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
            major, minor = (int(x, 16) for x in fields[3].split(b":"))
            found.append((start, end, os.makedev(major, minor), int(fields[4])))
    return found


def _shared_objects(pid: int, counted: set[int], objects: dict[tuple[int, int], int]) -> None:
    """Add to ``objects`` the shared memory ``pid`` maps that no file system shows: SysV
    segments, shared anonymous mappings (and memfds), keyed by (device, inode), at what they
    hold whoever touched it (st_blocks: a page a child filled is not in this process's PSS, and
    a mapping cut down to one page keeps the whole object). ``counted``: devices counted
    already (the session's tmpfs mounts). Files with a name are page cache, not counted."""
    for start, end, dev, inode in _shared_mappings(pid):
        if os.major(dev) != 0 or dev in counted:  # a disk file, or one on a session tmpfs
            continue
        try:
            info = os.stat(f"/proc/{pid}/map_files/{start:x}-{end:x}")
        except PermissionError:  # not root (CAP_SYS_ADMIN): the mapping's length, at least
            objects[(dev, inode)] = max(objects.get((dev, inode), 0), end - start)
            continue
        except OSError:  # unmapped meanwhile
            continue
        if info.st_nlink == 0 and info.st_dev not in counted:
            objects[(info.st_dev, info.st_ino)] = info.st_blocks * 512


def _rollup(pid: int) -> int:
    """PSS less the shmem pages in it (those are counted once, as whole objects or tmpfs files);
    RSS where smaps_rollup is unavailable."""
    try:
        data = _proc_read(f"/proc/{pid}/smaps_rollup")
    except OSError:
        return _rss(pid)
    pss = data.partition(b"\nPss:")[2].split(None, 1)[:1]
    shmem = data.partition(b"\nPss_Shmem:")[2].split(None, 1)[:1]
    if not pss:
        return _rss(pid)
    return (int(pss[0]) - (int(shmem[0]) if shmem else 0)) * 1024


def _rss(pid: int) -> int:
    try:
        return int(_proc_read(f"/proc/{pid}/statm").split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def held(root: int, counted: set[int], *, precise: bool, alone: bool = False) -> int:
    """Memory held by the process tree of ``root``: each process's own pages plus, once, every
    shared memory object one of them maps (``_shared_objects``). ``precise``: PSS less shmem
    (pages shared with the template split among their users); else an upper bound from RSS
    (tens of microseconds instead of hundreds for an idle worker). ``alone``: ``root`` is
    known to be the only process left (after a call's strays were killed). The files of its
    tmpfs mounts are not in it."""
    total = 0
    objects: dict[tuple[int, int], int] = {}
    for pid in [root] if alone else tree(root):
        total += _rollup(pid) if precise else _rss(pid)
        with contextlib.suppress(OSError):
            _shared_objects(pid, counted, objects)
    return total + sum(objects.values())


def _members(
    pids: list[int], known: set[int], root: int, uid: int | None, *, ended: bool = False
) -> set[int]:
    """Which of pids are other processes of the sandbox whose worker is ``root``: those of its
    uid, or (no uid) its descendants; the running ones, or with ``ended`` the zombies."""
    info = {pid: st for pid in pids if pid != root and (st := _status(pid)) is not None}
    if uid is not None:
        return {pid for pid, (owner, _, over) in info.items() if owner == uid and over == ended}
    members: set[int] = set()
    grew = True
    while grew:  # orphans are re-parented to the worker (its subreaper), so the tree holds
        grew = False
        for pid, (_, ppid, _) in info.items():
            if pid not in members and (ppid == root or ppid in members or ppid in known):
                members.add(pid)
                grew = True
    return {pid for pid in members if info[pid][2] == ended}


def started_none(start: Clock, now: Clock, root: int, uid: int | None) -> bool:
    """Cheap check after a call: no process of the sandbox was started during it (running or ended)."""
    window = new_pids(start, now)
    if window is None or sum(map(len, window)) > 64:
        return False
    pids = pids_in(window)
    return not _members(pids, set(), root, uid) and not _members(pids, set(), root, uid, ended=True)


def kill_strays(start: Clock, root: int, uid: int | None) -> tuple[bool, float]:
    """Kill every process of the sandbox a call left running (all were started during it: the
    ones of earlier calls were killed the same way). Whether they ran dry, and the CPU seconds
    of those killed (for the worker's lifetime account)."""
    known: set[int] = set()
    clock = start
    cpu_s = 0.0
    for _ in range(500):
        now = pid_clock()
        found = _members(pids_in(new_pids(clock, now)), known, root, uid)
        found |= {pid for pid in known if process_status(pid) is not None}
        if not found:
            # Those that ended during the call and wait to be reaped: their CPU reaches the
            # worker's own account only once it reaps them, after this check. (Counted again
            # then, as the ones killed here are: the budget errs on the strict side.)
            ended = _members(pids_in(new_pids(start, now)), known, root, uid, ended=True) - known
            return True, cpu_s + sum(map(cpu_seconds, ended))
        for pid in found - known:
            cpu_s += cpu_seconds(pid)
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        known |= found
        clock = now
        time.sleep(0.001)
    return False, cpu_s
