"""The template (zygote) process: forks workers on request, keeps spares, never runs code.

``tools.sandbox.zygote`` starts ``python -I worker.py --template STAGE``; the script
hands over to ``template_main`` here. The template imports the worker's modules and a fixed
list of standard modules (``COMMON_MODULES``), freezes them for the garbage collector, and
then only ever answers two requests from the server on its socket: "fork a worker with this
config and these four fds" and "reap this worker". It never receives code. As root it also
builds, once per ``hide`` list and in a mount namespace of its own, the read-only root every
worker gets (``sandbox_mounts.build_root``), and keeps ``SPARES_PER_ROOT`` spare children that
have entered their namespaces and that root ahead of demand; a fork request is handed to a
spare when one is ready. As root every child (spare or forked on demand) is pid 1 of a PID
namespace of its own (``fork_child``). A child (spare or forked on demand) cuts every tie to the template
first (``cut_ties``), then runs the worker (``worker.start_worker``, handed in as
``serve``). Why nothing leaks between sessions: docs/security.md, "How a worker starts".
Standard library only.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import select
import shutil
import signal
import socket
from collections.abc import Callable
from typing import Any, NoReturn

from .libc import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    LIBC,
    MNT_DETACH,
    MS_NODEV,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_NO_NEW_PRIVS,
    libc_call,
    mounter,
)
from .mounts import build_root, enter_namespaces, shareable

__all__ = ["COMMON_MODULES", "SPARES_PER_ROOT", "WORKER_FDS", "Serve", "template_main"]

# Imported once by the template, then shared copy-on-write by every worker it forks: the
# worker's own modules and what model-written code imports most. Nothing here may
# start a thread, hold a secret or draw a random seed that is not re-drawn in the child
# (``random`` is; ``multiprocessing``, whose auth key is drawn at import, is left out).
COMMON_MODULES = (
    "abc", "array", "base64", "bisect", "calendar", "cmath", "collections", "contextlib", "copy",
    "csv", "dataclasses", "datetime", "decimal", "enum", "fractions", "functools", "hashlib",
    "heapq", "itertools", "math", "numbers", "operator", "pprint", "re", "statistics", "string",
    "struct", "textwrap", "time", "typing", "unicodedata",
)  # fmt: skip
FORGOTTEN: set[int] = set()  # workers the server stopped waiting for: reaped once they exit
# Workers handed a session and not reaped yet, with their host directories: killed and removed
# when the server is gone (a server killed outright cleans up nothing, and a worker stopped
# between calls never sees the hang-up).
WORKERS: dict[int, str] = {}
TEMPLATE_NETWORK = ""  # the template's own network: what a worker without namespaces stays in
# The template's own PID namespace (an fd), to come back to after forking a child into a new one;
# -1 where it cannot make PID namespaces (not root, or refused): children then get the host's.
OWN_PID_NS = -1
PID_NAMESPACES = ""  # what children get, for their report
STAGE = ""  # where the template mounts prepared roots, in its own mount namespace ("" if none)
PREPARED: dict[tuple[str, ...], str | None] = {}  # hide list: its prepared root
# Spare children per prepared root: forked ahead of demand, namespaces and root entered, waiting
# for one session each (pid, the template's end of their socket). Two cover a burst of starts;
# each costs a process (mostly shared pages) and its namespaces.
SPARES_PER_ROOT = 2
SPARES: dict[tuple[str, ...], list[tuple[int, socket.socket]]] = {}
WORKER_FDS = 4  # control in, control out, captured stdout, captured stderr
# What a child runs once it has its session: config, its four fds, how it was started, and what
# entering its namespaces reported (a spare's, else None). Never returns.
Serve = Callable[[dict[str, Any], list[int], str, dict[str, str] | None], None]
_serve: Serve | None = None


def _started(config: dict[str, Any], fds: list[int], how: str, entered: dict[str, str] | None) -> None:
    assert _serve is not None  # set by template_main before any child is forked
    _serve(config, fds, how, entered)


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


def open_pid_namespaces() -> str:
    """As root: every child the template forks is pid 1 of a PID namespace of its own, so no host
    pid can be signalled, probed or opened from inside (they do not exist there), and when the
    worker dies the kernel kills every process left in its namespace. Returns the report."""
    global OWN_PID_NS
    if os.geteuid() != 0:
        return "the host's (weak: not root)"
    try:
        fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"the host's (weak: {exc})"
    try:  # a trial: the next fork would be the first child of this namespace
        libc_call(LIBC, "unshare(pid)", LIBC.unshare, CLONE_NEWPID)
        libc_call(LIBC, "setns(pid)", LIBC.setns, fd, CLONE_NEWPID)
    except OSError as exc:
        os.close(fd)
        return f"the host's (weak: {exc})"
    OWN_PID_NS = fd
    return "own PID namespace (pid 1 in it; no host pid exists inside)"


def fork_child() -> int:
    """``os.fork``, with the child as pid 1 of a new PID namespace where the template makes them.

    ``unshare(CLONE_NEWPID)`` moves only the template's next child; setting its own namespace
    back right after the fork keeps one namespace per child (a second child would join the
    first one's, and fail once that one's pid 1 has died)."""
    if OWN_PID_NS < 0:
        return os.fork()
    libc_call(LIBC, "unshare(pid)", LIBC.unshare, CLONE_NEWPID)
    try:
        pid = os.fork()
    except OSError:
        libc_call(LIBC, "setns(pid)", LIBC.setns, OWN_PID_NS, CLONE_NEWPID)
        raise
    if pid:
        libc_call(LIBC, "setns(pid)", LIBC.setns, OWN_PID_NS, CLONE_NEWPID)
    return pid


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


def prepared_root(config: dict[str, Any]) -> str | None:
    """The root prepared for this config's ``hide`` list, built on first use;
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
            build_root(mounter(LIBC), top, list(key))
            PREPARED[key] = top
        except OSError:
            LIBC.umount2(top.encode(), MNT_DETACH)
            PREPARED[key] = None  # each worker of this list tries itself, and reports why it failed
    prepared = PREPARED[key]
    if prepared is not None and not os.path.ismount(prepared):  # the stage was removed on the host
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


def become_worker(template: socket.socket, config: dict[str, Any], fds: list[int]) -> NoReturn:
    """In a child forked for a request: run as that session's worker (never returns)."""
    try:
        cut_ties(template, fds)
        _started(config, fds, "forked from the pre-warmed template process on demand", None)
    finally:
        os._exit(70)  # whatever happens, a child never returns into the template's loop


def become_spare(template: socket.socket, mine: socket.socket, prepared: str) -> NoReturn:
    """In a spare child: enter new namespaces and the prepared root, then wait to be assigned one
    session (its config and fds arrive on ``mine``). It holds nothing of any session until then
    and runs no code of one before it is confined; it exits if the template goes away."""
    try:
        cut_ties(template, [mine.fileno()])
        report: dict[str, str] = {}
        enter_namespaces(mounter(LIBC), report, prepared)
        data, fds, _, _ = socket.recv_fds(mine, 1 << 16, WORKER_FDS)
        mine.close()
        if data and len(fds) == WORKER_FDS:
            _started(json.loads(data), fds, "a spare forked from the template ahead of demand", report)
    finally:
        os._exit(70)


def fork_spare(template: socket.socket, key: tuple[str, ...]) -> None:
    """One more spare for the prepared root of ``key`` (the template keeps its end of the socket)."""
    prepared = PREPARED.get(key)
    if prepared is None or threads() != 1:
        return
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = fork_child()
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
        WORKERS.pop(pid, None)
        return None
    if done == 0:
        return "running"
    WORKERS.pop(pid, None)
    return os.waitstatus_to_exitcode(status)


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
    if op != "fork" or len(fds) != WORKER_FDS or not isinstance(request.get("config"), dict):
        return {"error": f"not a request the template serves: {op!r} with {len(fds)} fds"}, None
    if threads() != 1:  # fork copies only the calling thread: a lock held elsewhere would stay held
        return {"error": "the template has started a thread; it no longer forks"}, None
    config = {  # these three are never the server's
        **request["config"],
        "prepared": prepared_root(request["config"]),
        "template_network": TEMPLATE_NETWORK,
        "pid_namespace": PID_NAMESPACES,
    }
    pid = None
    if config["prepared"] is not None:
        pid = assign_spare(tuple(map(str, config.get("hide") or ())), config, fds)
    if pid is None:
        pid = fork_child()
        if pid == 0:
            become_worker(template, config, fds)
    WORKERS[pid] = str(config.get("hostdir") or "")
    return {"pid": pid}, os.pidfd_open(pid)  # the server's handle: never a recycled pid


def tell(template: socket.socket, reply: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    socket.send_fds(template, [json.dumps(reply).encode()], list(fds))


def template_main(stage: str, serve: Serve) -> NoReturn:
    """Serve fork and reap requests on fd 0 (a SOCK_SEQPACKET socket) until the server hangs up."""
    global TEMPLATE_NETWORK, STAGE, PID_NAMESPACES, _serve
    _serve = serve
    template = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    try:
        TEMPLATE_NETWORK = confine_template()
        PID_NAMESPACES = open_pid_namespaces()
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
            data, fds, _, _ = socket.recv_fds(template, 1 << 16, WORKER_FDS + 1)
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
    """Exit once the server is gone, killing the workers it left and removing the directory it
    made for the stage (it may have died without a chance to: a server killed by a signal runs
    no atexit). Spares exit by themselves when their socket to the template closes."""
    for pid, hostdir in WORKERS.items():  # unreaped: neither pid nor group can have been reused
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # its own group (cut_ties): the session's children too
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        if hostdir:  # what the session wrote; shutil.rmtree follows no link a session planted
            shutil.rmtree(hostdir, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(hostdir))  # the server's root for them, once empty
    with contextlib.suppress(OSError):
        if STAGE:
            libc_call(LIBC, "umount stage", LIBC.umount2, STAGE.encode(), MNT_DETACH)
        os.rmdir(stage)
    os._exit(0)
