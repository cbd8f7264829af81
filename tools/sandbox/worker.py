"""The sandbox's side, run as a script: the template process, and each worker forked from it.

``tools.sandbox.zygote`` starts ``python -I worker.py --template STAGE``: the template
(``template``) forks a worker per session, and each worker, forked on demand or a
spare handed its session, runs ``start_worker`` here: it confines its own process
(namespaces and the new root from ``mounts``, its IPC namespace's limits, its uid, limits,
the filter from ``seccomp`` last: what each step guarantees is in ``tools.sandbox``'s
docstring) and
then serves requests framed on its control pipes (``frames``): each request's code is
run in one persistent namespace (``repl``).

Standard library only, nothing from the project: it runs under whichever interpreter the
server names, with the project's files hidden. Run by path with ``-I``, no ``sys.path`` entry
leads to this directory and ``tools`` is the server's package (its ``__init__`` is not for
this process), so the sibling modules load as a package of their own. The template imports
all of them before any worker exists, so none of these files need be visible from inside the
new root.
"""

from __future__ import annotations

import builtins
import ctypes
import io
import os
import random
import resource
import signal
import sys
import types
from typing import Any

if not __package__:  # run by path (the template): its siblings, as a package of their own
    _package = types.ModuleType("_toolfactory_sandbox")
    _package.__path__ = [os.path.dirname(os.path.abspath(__file__))]
    sys.modules[_package.__name__] = _package
    __package__ = _package.__name__

from .frames import read_frame, write_frame  # noqa: E402
from .libc import (  # noqa: E402
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWUSER,
    LIBC,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_NO_NEW_PRIVS,
    drop_capabilities,
    libc_call,
    mounter,
)
from .mounts import blocked, enter_namespaces, session_mounts  # noqa: E402
from .repl import execute  # noqa: E402
from .seccomp import install_seccomp  # noqa: E402
from .template import template_main  # noqa: E402

__all__ = ["start_worker"]

CONFIG: dict[str, Any] = {}  # this worker's session: uid, limits, hidden paths, its root
CTL_IN = CTL_OUT = MAIN_PID = -1  # its control pipes and its own pid, set by start_worker
ENTERED: dict[str, str] | None = None  # a spare's: what entering its namespaces reported
START = ""  # how this worker was started, for its report


def send(obj: dict[str, Any]) -> None:
    write_frame(CTL_OUT, obj)


def isolate_namespaces(uid: int | None, report: dict[str, str]) -> str:
    """Namespaces and a fresh root that shows only what Python needs, then the session's mounts."""
    mount = mounter(LIBC)
    prepared = CONFIG.get("prepared")
    if ENTERED is None:
        enter_namespaces(
            mount,
            report,
            prepared,
            hostdir=CONFIG["hostdir"],
            hide=CONFIG["hide"],
            uid=uid,
            tmpfs_mb=CONFIG["tmpfs_mb"],
        )
    else:
        report.update(ENTERED)  # a spare entered them before it was assigned
    try:
        if ENTERED is not None or prepared:  # a shared root: the session's parts go on it now
            session_mounts(mount, uid, CONFIG["tmpfs_mb"])
    except OSError as exc:  # inside the new root: no weak mode to fall back to
        raise RuntimeError(f"the session's mounts in the new root failed: {exc}") from None
    if "own" in report.get("ipc", ""):
        report["ipc"] += limit_ipc(CONFIG["memory_mb"])
    report["filesystem"] = (
        "mount namespace, new root: system and interpreter files only (read-only); "
        "private tmpfs /tmp, /var/tmp, /dev/shm"
    )
    return "/tmp"


# Per IPC namespace, so set by each worker (as root, in its own): SysV segments are destroyed
# once no process has them attached (an attached segment counts to an address space and shows
# in the host's memory figure; a detached one counted nowhere), at most the session's memory in
# all; a few message queues and semaphores (kernel memory no figure counts: by default 32,000
# queues of 16 KB could hold 512 MB).
IPC_LIMITS = {
    "kernel/shm_rmid_forced": "1",
    "kernel/shmmni": "64",
    "kernel/msgmni": "16",
    "kernel/sem": "250 4096 32 16",  # per set, in all, per semop call, sets
}


def limit_ipc(memory_mb: int) -> str:
    """Set this worker's IPC namespace's limits (from its own /proc); what it reports."""
    shm_bytes = memory_mb << 20
    wanted = {
        **IPC_LIMITS,
        "kernel/shmmax": str(shm_bytes),
        "kernel/shmall": str(shm_bytes // os.sysconf("SC_PAGE_SIZE")),
    }
    try:
        for key, value in wanted.items():
            with open("/proc/sys/" + key, "w") as fh:
                fh.write(value)
    except OSError as exc:
        return f"; its limits could not be set (weak: {exc})"
    return (
        f"; SysV segments die when detached, {memory_mb} MB of them at most; "
        f"{IPC_LIMITS['kernel/msgmni']} message queues, 16 semaphore sets"
    )


def cpu_limit_for_init(libc: Any) -> None:
    """As pid 1 of its PID namespace the worker ignores every signal it has no handler for,
    SIGXCPU (the per-call CPU limit) included; the handler is libc's ``_exit``, so the
    signal still ends it at once (exit status 24, SIGXCPU's number), even inside C code."""
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGXCPU, ctypes.cast(libc._exit, ctypes.c_void_p))


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
            try:
                libc_call(
                    libc, "unshare(user, net, ipc)", libc.unshare, CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC
                )
                report["ipc"] = "IPC namespace of its own (in the user namespace)"
            except OSError as exc:  # a kernel without IPC namespaces
                libc_call(libc, "unshare(user, net)", libc.unshare, CLONE_NEWUSER | CLONE_NEWNET)
                report["ipc"] = f"the host's (weak: {exc})"
            drop_capabilities(libc)  # a new user namespace grants all capabilities inside it
            report["network"] = "user + network namespace"
        except OSError:
            sys.addaudithook(block_network)
            report["network"] = "audit hook (weak: blocks socket calls made through Python)" + (
                ", inside the template's empty network namespace"
                if CONFIG.get("template_network", "").startswith("own")
                else ""
            )
    os.chdir(workdir)

    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    pids = str(CONFIG.get("pid_namespace") or "")
    if os.getpid() == 1:
        cpu_limit_for_init(libc)
        report["pids"] = "own PID namespace (pid 1 in it; no host pid exists inside)"
    else:
        report["pids"] = pids if pids.startswith("the host's") else "the host's (weak)"
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
        request = read_frame(CTL_IN)
        if request is None:
            os._exit(0)
        number += 1
        try:
            reply = execute(request, namespace, number, out, err, CONFIG["worker_cpu_s"])
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


def start_worker(config: dict[str, Any], fds: list[int], how: str, entered: dict[str, str] | None) -> None:
    """Take on one session: its config and its four fds, then confine and serve (main).
    ``entered``: what entering its namespaces reported, when a spare did that before."""
    global CONFIG, CTL_IN, CTL_OUT, MAIN_PID, START, ENTERED
    ENTERED = entered
    random.seed()  # os.fork's at-fork hook did too; a session must not predict another's draws
    CTL_IN, CTL_OUT, out_fd, err_fd = fds
    CONFIG = {**config, "stdout_fd": out_fd, "stderr_fd": err_fd}
    MAIN_PID = os.getpid()
    START = how
    main()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--template":
        sys.exit("usage: python -I worker.py --template STAGE_DIR  (started by tools.sandbox.zygote)")
    template_main(sys.argv[2], start_worker)
