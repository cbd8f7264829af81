"""A sandbox's processes, from the kernel's /proc (never from a worker's word): find, count, kill.

Read by the server after every call: which processes of a sandbox are left (by uid, or by
ancestry without one), the pids handed out since a call began (there is no PID namespace),
CPU and memory; and the processes a call left running, or every one of a uid, killed.
Raw ``os.open``/``os.read``: several of these run per call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

__all__ = [
    "Clock",
    "cpu_seconds",
    "forks",
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


def process_status(pid: int) -> tuple[int, int] | None:
    """(real uid, parent pid) of a process that can still run, None if gone or a mere zombie.

    A zombie thread-group leader whose other threads still run counts as running; a thread
    id (``/proc/<tid>`` exists, unlisted) is not a process.
    """
    try:
        status = _proc_read(f"/proc/{pid}/status")
        if int(status.partition(b"\nTgid:")[2].split(None, 1)[0]) != pid:
            return None
        state = status.partition(b"\nState:")[2].split(None, 1)[0]
        if state in (b"Z", b"X") and int(status.partition(b"\nThreads:")[2].split(None, 1)[0]) <= 1:
            return None
        uid = int(status.partition(b"\nUid:")[2].split(None, 1)[0])
        return uid, int(status.partition(b"\nPPid:")[2].split(None, 1)[0])
    except (OSError, ValueError, IndexError):
        return None


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


def _members(pids: list[int], known: set[int], root: int, uid: int | None) -> set[int]:
    """Which of pids are other processes of the sandbox whose worker is ``root``: those of its
    uid, or (no uid) its descendants."""
    info = {pid: st for pid in pids if pid != root and (st := process_status(pid)) is not None}
    if uid is not None:
        return {pid for pid, (owner, _) in info.items() if owner == uid}
    members: set[int] = set()
    grew = True
    while grew:  # orphans are re-parented to the worker (its subreaper), so the tree holds
        grew = False
        for pid, (_, ppid) in info.items():
            if pid not in members and (ppid == root or ppid in members or ppid in known):
                members.add(pid)
                grew = True
    return members


def started_none(start: Clock, now: Clock, root: int, uid: int | None) -> bool:
    """Cheap check after a call: no process of the sandbox was started during it."""
    window = new_pids(start, now)
    return (
        window is not None and sum(map(len, window)) <= 64 and not _members(pids_in(window), set(), root, uid)
    )


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
            return True, cpu_s
        for pid in found - known:
            cpu_s += cpu_seconds(pid)
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        known |= found
        clock = now
        time.sleep(0.001)
    return False, cpu_s
