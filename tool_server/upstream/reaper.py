"""Runs a stdio upstream's command and takes every process it starts down with it.

Usage (``stdio`` does this; stdlib only, run as a script): ``python -I -S reaper.py PARENT_PID
USER COMMAND [ARG...]``. The command inherits stdin, stdout, stderr, the environment and the
working directory; this process then lets go of stdin and stdout, so the server sees the
command's end as before. USER is a uid the command runs as (its gid the same number, no
supplementary groups: a ``per_session`` process's own), or ``-`` for the server's; this
process keeps the server's, so it can still end the command's whole tree.

Why a process of its own: a server may start background processes, and some leave its
process group (``setsid``, a daemon's double fork), so killing the group at shutdown misses
them; and when the tool server itself is SIGKILLed, nothing of it runs to kill anything.
Here:

* this process is a child subreaper (``PR_SET_CHILD_SUBREAPER``): whatever the command
  starts stays in its process tree, even past ``setsid`` and orphaning;
* the kernel sends it SIGTERM when the tool server dies (``PR_SET_PDEATHSIG``), SIGKILL
  included, and the command gets SIGKILL if this process dies;
* when the command exits, or SIGTERM comes (a release, a shutdown, the server's death),
  every process of the tree gets SIGTERM, then SIGKILL after a short grace, and this
  process exits last, with the command's status.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import NoReturn

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_GRACE_S = 1.0  # for the tree to exit on SIGTERM; within the server's own grace (stdio._KILL_GRACE_S)
_KILL_S = 5.0  # SIGKILL passes; past it, whatever is left cannot be killed by us (setuid, D state)
_POLL_S = 0.02

_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}): {os.strerror(errno)}")


def _die_with_parent() -> None:
    """In the command's process, before exec: SIGKILL when this process dies."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _become(uid: int) -> None:
    """In the command's process, before exec: its own uid and gid, no other group; then the
    parent-death signal, which the kernel clears on a change of credentials."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _die_with_parent()


def _descendants() -> list[int]:
    """The live processes of this process's tree (from /proc; zombies left out)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found, stack = [], [os.getpid()]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _reap() -> None:
    """Collect every child that has exited (orphans of the tree end up here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        # Gone, or not ours to signal (a setuid program): nothing more to do.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _end_tree() -> None:
    """SIGTERM the whole tree, wait ``_GRACE_S``, then SIGKILL until nothing is left."""
    alive = _descendants()
    if not alive:  # the usual end: the command left nothing behind
        return
    _signal_all(alive, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while time.monotonic() < deadline:
        _reap()
        if not _descendants():
            return
        time.sleep(_POLL_S)
    deadline = time.monotonic() + _KILL_S
    while (alive := _descendants()) and time.monotonic() < deadline:
        _signal_all(alive, signal.SIGKILL)  # one forking meanwhile is found on the next pass
        time.sleep(_POLL_S)
        _reap()


def _on_signal(signum: int, _frame: object) -> NoReturn:
    for each in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(each, signal.SIG_IGN)  # one ending at a time
    _end_tree()
    os._exit(128 + signum)


def main(argv: list[str]) -> NoReturn:
    if len(argv) < 4 or not argv[1].isdigit() or not (argv[2] == "-" or argv[2].isdigit()):
        sys.stderr.write("usage: reaper.py PARENT_PID USER COMMAND [ARG...]  (USER: a uid, or -)\n")
        sys.exit(2)
    parent, user, command = int(argv[1]), argv[2], argv[3:]
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    for each in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(each, _on_signal)
    if os.getppid() != parent:  # the server died before PDEATHSIG was set
        sys.exit(1)
    before_exec = _die_with_parent if user == "-" else (lambda: _become(int(user)))
    try:
        child = subprocess.Popen(command, preexec_fn=before_exec)  # noqa: S603 (the configured command)
    except OSError as exc:
        why = f"cannot start {command[0]!r}: {exc.strerror}"
        if user != "-" and isinstance(exc, PermissionError):
            why += (
                f" (it runs as uid {user}, a per_session process's own: the command, its files and its "
                "cwd must be readable by other users; or set session_uid: false on its mcpServers entry)"
            )
        sys.stderr.write(why + "\n")
        sys.exit(126 if isinstance(exc, PermissionError) else 127)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # the command's stdin and stdout are its own: their end is its end
    os.dup2(null, 1)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child.pid:
            break
    child.returncode = os.waitstatus_to_exitcode(status)
    _end_tree()
    code = child.returncode
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv)
