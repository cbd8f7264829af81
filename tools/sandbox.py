"""Run untrusted Python in confined subprocesses: one-shot runs and warm, stateful workers.

Why a subprocess per sandbox: the model's code may loop forever, exhaust memory, fork,
crash the interpreter or try to reach the network. A separate process that the tool
server can kill at any moment contains all of that; the server only ever sees a
``SandboxResult``.

A worker is ``python -I -c <bootstrap>`` started by the server. The bootstrap (the
``_WORKER_SOURCE`` string below, trusted code) confines its own process *before* it
reads any untrusted code, then serves requests over its stdin/stdout pipes: each
request's code is ``exec``-ed in one persistent namespace (exec happens only inside
the confined child), the value of a trailing expression is returned like a REPL does.

Confinement, in the order the bootstrap applies it:

* **network**: a new, empty network namespace (``unshare(CLONE_NEWNET)``; not even
  loopback is up, so every connect fails with "Network is unreachable"). As non-root
  it tries a user + network namespace instead. Where the kernel refuses both, an
  audit hook blocks ``socket.connect/bind/sendto/sendmsg`` in the interpreter (a
  weaker fallback: code that calls libc through ctypes is not stopped).
* **filesystem** (needs root or CAP_SYS_ADMIN): a private mount namespace with fresh,
  size-capped tmpfs mounts on ``/tmp`` (the working directory), ``/var/tmp`` and
  ``/dev/shm``. Hidden directories (``hide``; default ``/root``, ``/home`` and the
  server's working directory) and directories other users cannot enter on the way to
  the interpreter (``/root`` when Python lives in ``/root/.pyenv``) are covered by an
  empty tmpfs that shows only the interpreter's own tree (its prefix, venv and
  ``sys.path``), even when that tree lies under ``/tmp``.
  *Allowed*: reading world-readable system files (the standard library needs them) and
  anything under its own ``/tmp``. *Denied*: root-only files (``/etc/shadow``), the
  host's ``/tmp`` (other sandboxes, the server's files), hidden directories, and writing
  anywhere but its own tmpfs. Without a mount namespace the working directory is a
  private host directory (mode 0700 inside a 0711 parent) and the host ``/tmp`` stays
  visible (weaker). ``/proc`` is a fresh mount with ``hidepid=invisible``: once the
  worker has dropped to its own uid it lists only that uid's processes, not the server's
  or other sandboxes' (there is no PID namespace: pids are still the host's numbers).
* **identity**: as root, each worker drops to its own unprivileged uid/gid (picked
  from ``UID_RANGE``), with ``no_new_privs``. A per-worker uid is what makes
  ``RLIMIT_NPROC`` bind (it counts processes per real uid, and root ignores it), and
  it stops one sandbox from signalling or reading another. Killing a worker kills
  every process of its uid, so children that escaped the process group die too. When
  the server is not root the worker keeps the server's uid; RLIMIT_NPROC then counts
  all of that user's processes, which in practice means the sandbox cannot fork. A root
  server that can neither mount nor let another uid reach the interpreter refuses to
  start workers (``SandboxError``) instead of running untrusted code as root.
* **resources**: RLIMIT_AS (memory), RLIMIT_CPU (per call, as a soft limit raised
  before each request; a lifetime hard limit), RLIMIT_NPROC, RLIMIT_FSIZE (also caps
  captured output), RLIMIT_NOFILE, no core dumps; the wall-clock timeout is enforced
  by the server, which kills the worker.

Captured output goes to two memfds created by the server and passed to the worker as
fds 1 and 2, so everything lands there (``print``, ``os.write(1, ...)``, C extensions,
child processes) and stays readable after the worker dies. Only the first
``max_output_bytes`` of each are read back.

Deployment: the strong mode needs root with CAP_SYS_ADMIN in the server's container
(docker: ``cap_add: [SYS_ADMIN]`` and a seccomp/AppArmor profile that allows ``unshare``
and ``mount``); ``SandboxPool.isolation`` reports what each worker actually got. Run the
server under an init (compose ``init: true``) so orphans of killed sandboxes are reaped.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

UID_RANGE = range(200_000, 300_000)  # unprivileged uids handed to workers when running as root
_FRAME_HEADER = 4
_MAX_REQUEST_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits of one sandboxed interpreter."""

    timeout_s: float = 10.0  # wall clock per call; the worker is killed past it
    cpu_s: int = 10  # CPU seconds per call (soft RLIMIT_CPU, raised before each call)
    worker_cpu_s: int = 600  # CPU seconds over the worker's life (hard RLIMIT_CPU)
    memory_mb: int = 512  # address space (RLIMIT_AS)
    max_processes: int = 16  # processes and threads of the sandbox uid (RLIMIT_NPROC)
    max_file_mb: int = 16  # largest file it may write, captured output included (RLIMIT_FSIZE)
    max_open_files: int = 256  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of its private /tmp
    max_output_bytes: int = 65536  # stdout and stderr each, as returned


@dataclass(slots=True)
class SandboxResult:
    """What one run produced. ``error`` is the traceback or why the sandbox stopped the code."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0  # 0 ok, 1 exception, n for sys.exit(n), -signal when the process died
    timed_out: bool = False
    truncated: bool = False  # stdout, stderr or value was cut to max_output_bytes
    error: str | None = None
    elapsed_ms: float = 0.0
    value: str | None = None  # repr of a trailing expression, as in a REPL
    worker_died: bool = False  # the interpreter did not survive the call; its state is gone


class SandboxError(RuntimeError):
    """A sandbox could not be started (the message says which confinement step failed)."""


class _WorkerGone(Exception):
    pass


# ----------------------------------------------------------------------------------------
# The bootstrap that runs inside the child. Trusted code: it confines the process first,
# then serves requests. It only uses the standard library.
# ----------------------------------------------------------------------------------------
_WORKER_SOURCE = r'''
import ast, builtins, ctypes, io, json, linecache, os, resource, signal, stat, sys, traceback

CONFIG = json.loads(sys.argv[1])
CTL_IN, CTL_OUT = os.dup(0), os.dup(1)
MAIN_PID = os.getpid()
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38


def send(obj):
    data = json.dumps(obj).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(CTL_OUT, data):]


def read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(CTL_IN, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def receive():
    head = read_exact(4)
    body = head and read_exact(int.from_bytes(head, "big"))
    return None if body is None else json.loads(body)


def libc_call(libc, what, fn, *args):
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def blocked(path, hidden):
    """(dir, child): the first directory on the way to path that is hidden or others cannot enter."""
    cur = "/"
    for comp in [c for c in path.split("/") if c]:
        if cur in hidden or not os.stat(cur).st_mode & stat.S_IXOTH:
            return cur, comp
        cur = os.path.join(cur, comp)
    return None


def cover(mount, top, options, keep):
    """Mount a fresh tmpfs on top; the entries named in keep are bind-mounted back from below."""
    fds = {name: os.open(os.path.join(top, name), os.O_PATH) for name in keep}
    mount(b"tmpfs", top.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)
    for name, fd in fds.items():
        target = os.path.join(top, name)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(target)
        else:
            open(target, "w").close()
        mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None)
        os.close(fd)


def children_within(top, paths):
    prefix = top.rstrip("/") + "/"
    return {p[len(prefix):].split("/")[0] for p in paths if p.startswith(prefix)}


def expose(mount, needed, hidden):
    """Cover hidden or closed directories with a tmpfs that shows only the needed entries."""
    hidden = {h for h in hidden if h not in needed}
    covered = set()
    for _ in range(16):
        groups = {}
        for p in needed:
            hit = blocked(p, hidden - covered)
            if hit:
                groups.setdefault(hit[0], set()).add(hit[1])
        if not groups:
            break
        for top, children in groups.items():
            cover(mount, top, b"size=64k,mode=0755", children)
            covered.add(top)
    else:
        raise OSError("could not expose the interpreter's directories")
    for path in sorted(hidden - covered):
        if os.path.isdir(path) and not os.path.islink(path):
            cover(mount, path, b"size=16k,mode=0755", ())
            covered.add(path)
    return sorted(covered)


def isolate_namespaces(libc, uid, report):
    """New mount + network namespaces (root): private tmpfs /tmp, interpreter kept visible."""
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

    def mount(src, target, fstype, flags, data):
        libc_call(libc, "mount " + target.decode(), libc.mount, src, target, fstype, flags, data)

    libc_call(libc, "unshare(mount, net)", libc.unshare, CLONE_NEWNS | CLONE_NEWNET)
    report["network"] = "network namespace (no interfaces up)"
    mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
    needed = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, sys.executable}
    needed |= {p for p in sys.path if p and os.path.exists(p)}
    needed = {os.path.realpath(p) for p in needed}
    report["hidden"] = ", ".join(expose(mount, needed, {os.path.realpath(p) for p in CONFIG["hide"]}))
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    for path, size in (("/tmp", CONFIG["tmpfs_mb"]), ("/var/tmp", 4), ("/dev/shm", 4)):
        if os.path.isdir(path) and not os.path.islink(path):
            opts = f"size={size}m,nr_inodes=4096,mode=0700{owner}".encode()
            cover(mount, path, opts, children_within(path, needed))  # a venv under /tmp stays visible
    report["filesystem"] = "mount namespace, private tmpfs /tmp"
    try:  # a /proc of its own that lists only processes of its uid (Linux >= 5.8)
        mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=invisible")
        report["proc"] = "own processes only (hidepid)"
    except OSError as exc:
        report["proc"] = f"host processes visible ({exc})"
    return "/tmp"


def drop_capabilities(libc):
    """capset(2) with empty sets: no capabilities left, in any namespace."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, twice (64-bit sets)
    libc_call(libc, "capset", libc.capset, header, data)


def tasks_of_user(uid):
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


def block_network(event, args):
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
        raise PermissionError("network access is disabled in this sandbox")


def confine():
    report = {}
    uid = CONFIG["uid"]
    libc = ctypes.CDLL(None, use_errno=True)
    workdir = CONFIG["hostdir"]
    mounted = False
    report["filesystem"] = "private host directory (weak: no mount namespace)"
    if not CONFIG["namespaces"]:
        report["namespaces_error"] = "disabled by configuration"
    elif os.geteuid() != 0:
        report["namespaces_error"] = "not root"
    else:
        try:
            workdir = isolate_namespaces(libc, uid, report)
            mounted = True
        except OSError as exc:
            report["namespaces_error"] = str(exc)
    if "network" not in report:
        try:
            if not CONFIG["namespaces"] or os.geteuid() == 0:
                raise OSError("skipped")
            libc_call(libc, "unshare(user, net)", libc.unshare, CLONE_NEWUSER | CLONE_NEWNET)
            drop_capabilities(libc)  # a new user namespace grants all capabilities inside it
            report["network"] = "user + network namespace"
        except OSError:
            sys.addaudithook(block_network)
            report["network"] = "audit hook (weak: blocks socket calls made through Python)"
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
    report["processes"] = f"RLIMIT_NPROC={nproc}" + ("" if uid is not None else " (shared with the server's user)")
    os.environ.update(HOME=workdir, TMPDIR=workdir, PWD=workdir)
    sys.path.insert(0, workdir)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-long writes raise OSError instead
    for name in CONFIG["preload"]:
        __import__(name)
    memory = CONFIG["memory_mb"] * mb
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    return report


def setup_stdio():
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(CONFIG["stdout_fd"], 1)
    os.dup2(CONFIG["stderr_fd"], 2)
    for fd in (devnull, CONFIG["stdout_fd"], CONFIG["stderr_fd"]):
        os.close(fd)
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    err = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    return out, err


def clean(text):
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def capped(text, limit):
    return (text, False) if len(text) <= limit else (text[:limit], True)


def exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def format_error(exc):
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    tb = exc.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next  # drop the worker's own frames
    return "".join(traceback.format_exception(type(exc), exc, tb))


def execute(request, namespace, number, out, err):
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
        exec(compile(tree, name, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, name, "eval"), namespace)
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


def main():
    try:
        out, err = setup_stdio()
        report = confine()
    except BaseException as exc:
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(70)
    send({"ready": True, "pid": MAIN_PID, "isolation": report})
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
        try:
            send(reply)
        except MemoryError:
            send({"value": None, "error": "MemoryError while sending the reply", "exit_code": 1, "truncated": True})


main()
'''


# ----------------------------------------------------------------------------------------
# Server side
# ----------------------------------------------------------------------------------------
class _UidAllocator:
    """Hands out distinct sandbox uids within this process (random, to avoid other servers' picks)."""

    def __init__(self, uids: range) -> None:
        self._uids = uids
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            for _ in range(1000):
                uid = random.choice(self._uids)
                if uid not in self._used:
                    self._used.add(uid)
                    return uid
        raise SandboxError("no free sandbox uid left")

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


_UIDS = _UidAllocator(UID_RANGE)
_ROOT_LOCK = threading.Lock()
_ROOT: str | None = None
_LIVE: weakref.WeakSet[SandboxWorker] = weakref.WeakSet()


def _sandbox_root() -> str:
    """A per-process directory for fallback working directories (mode 0711: enter, not list)."""
    global _ROOT
    with _ROOT_LOCK:
        if _ROOT is None or not os.path.isdir(_ROOT):
            _ROOT = tempfile.mkdtemp(prefix="toolfactory-sandbox-")
            os.chmod(_ROOT, 0o711)
            atexit.register(shutil.rmtree, _ROOT, True)
        return _ROOT


@atexit.register
def _kill_all_workers() -> None:
    for worker in list(_LIVE):
        worker.kill()
        if worker.uid is not None:
            _kill_uid(worker.uid)


def default_hidden_paths() -> tuple[str, ...]:
    """Home directories and the server's working directory (its config, data and code)."""
    paths = ["/root", "/home"]
    cwd = os.path.realpath(os.getcwd())
    if cwd.count("/") >= 2 and not cwd.startswith(("/usr", "/lib", "/bin", "/sbin", "/etc", "/proc", "/sys")):
        paths.append(cwd)
    return tuple(paths)


def _processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid``, from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as fh:
                status = fh.read()
        except OSError:
            continue
        state = status.partition(b"\nState:")[2].split(None, 1)[:1]
        uids = status.partition(b"\nUid:")[2].split(None, 1)[:1]
        if uids and int(uids[0]) == uid and state and state[0] not in (b"Z", b"X"):
            pids.append(int(entry))
    return pids


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of a sandbox uid, repeatedly, until a fork bomb runs dry."""
    for _ in range(50):
        pids = _processes_of(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)


def _describe_exit(returncode: int, cpu_s: int) -> str:
    if returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU:
            return f"CPU time limit of {cpu_s} s exceeded; the interpreter was killed"
        if sig == signal.SIGSEGV:
            return "the interpreter crashed (segmentation fault, e.g. unbounded recursion in C code)"
        if sig == signal.SIGKILL:
            return "the interpreter was killed (SIGKILL: memory exhaustion or an external kill)"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"the interpreter was killed by signal {name}"
    return f"the interpreter exited with status {returncode} (os._exit or a fatal error)"


def _read_frame_blocking(fd: int, timeout_s: float) -> dict[str, Any] | None:
    """One frame from a blocking pipe, or None on EOF / timeout (used only at startup)."""
    deadline = time.monotonic() + timeout_s
    buf = bytearray()
    need = _FRAME_HEADER
    header_done = False
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while len(buf) < need:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                return None
            chunk = os.read(fd, need - len(buf))
            if not chunk:
                return None
            buf += chunk
            if not header_done and len(buf) == _FRAME_HEADER:
                need = _FRAME_HEADER + int.from_bytes(buf, "big")
                header_done = True
    return json.loads(bytes(buf[_FRAME_HEADER:]))


class SandboxWorker:
    """One confined interpreter process with a persistent namespace. One call at a time."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        limits: SandboxLimits,
        uid: int | None,
        hostdir: str,
        out_fd: int,
        err_fd: int,
        isolation: dict[str, str],
    ) -> None:
        self.proc = proc
        self.limits = limits
        self.uid = uid
        self.isolation = isolation
        self._hostdir = hostdir
        self._out_fd = out_fd
        self._err_fd = err_fd
        assert proc.stdin is not None and proc.stdout is not None
        self._wfd = proc.stdin.fileno()
        self._rfd = proc.stdout.fileno()
        os.set_blocking(self._wfd, False)
        os.set_blocking(self._rfd, False)
        self._lock = anyio.Lock()
        self._killed = False
        self._closed = False
        self.calls = 0
        _LIVE.add(self)

    # -- lifecycle ---------------------------------------------------------------------
    @classmethod
    def spawn(
        cls,
        limits: SandboxLimits = SandboxLimits(),
        *,
        python: str = sys.executable,
        preload: tuple[str, ...] = (),
        namespaces: bool = True,
        hide: tuple[str, ...] | None = None,
        startup_timeout_s: float = 20.0,
    ) -> SandboxWorker:
        """Start and confine a worker; blocks until it is ready (run it in a thread).

        ``hide``: directories the sandbox must not see (default :func:`default_hidden_paths`);
        the interpreter's own files inside them stay visible.
        """
        uid = _UIDS.acquire() if os.geteuid() == 0 else None
        hostdir = tempfile.mkdtemp(prefix="w-", dir=_sandbox_root())
        out_fd = os.memfd_create("sandbox-stdout")
        err_fd = os.memfd_create("sandbox-stderr")
        proc = None
        try:
            if uid is not None:
                os.chown(hostdir, uid, uid)
            os.chmod(hostdir, 0o700)
            for fd in (out_fd, err_fd):  # appends land at the end even after the server truncates
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
            config = {
                "uid": uid,
                "hostdir": hostdir,
                "namespaces": namespaces,
                "hide": list(default_hidden_paths() if hide is None else hide),
                "stdout_fd": out_fd,
                "stderr_fd": err_fd,
                "preload": list(preload),
                "memory_mb": limits.memory_mb,
                "worker_cpu_s": limits.worker_cpu_s,
                "max_processes": limits.max_processes,
                "max_file_mb": limits.max_file_mb,
                "max_open_files": limits.max_open_files,
                "tmpfs_mb": limits.tmpfs_mb,
            }
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "OPENBLAS_NUM_THREADS": "1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            }
            proc = subprocess.Popen(
                [python, "-I", "-c", _WORKER_SOURCE, json.dumps(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(out_fd, err_fd),
                cwd=hostdir,
                env=env,
                start_new_session=True,
            )
            assert proc.stdout is not None and proc.stderr is not None
            ready = _read_frame_blocking(proc.stdout.fileno(), startup_timeout_s)
            if not ready or not ready.get("ready"):
                reason = ready.get("error") if ready else None
                if reason is None:
                    proc.kill()
                    reason = proc.stderr.read().decode(errors="replace").strip()[-2000:] or "no reply"
                raise SandboxError(f"the sandbox worker failed to start: {reason}")
            proc.stderr.close()
            return cls(proc, limits, uid, hostdir, out_fd, err_fd, ready["isolation"])
        except BaseException:
            if proc is not None:
                _terminate(proc, uid)
            for fd in (out_fd, err_fd):
                os.close(fd)
            shutil.rmtree(hostdir, ignore_errors=True)
            if uid is not None:
                _UIDS.release(uid)
            raise

    @property
    def alive(self) -> bool:
        return not self._killed and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker and its process group now. Cheap, idempotent, safe from any thread.

        Children that left the process group are swept by uid in :meth:`close_sync`.
        """
        if self._killed:
            return
        self._killed = True
        _terminate(self.proc, None)

    def close_sync(self) -> None:
        """Kill every process of the sandbox, reap and free everything (blocking: ~10 ms)."""
        self.kill()
        if self._closed:
            return
        self._closed = True
        if self.uid is not None:
            _kill_uid(self.uid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        for fd in (self._out_fd, self._err_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._hostdir, ignore_errors=True)
        if self.uid is not None:
            _UIDS.release(self.uid)
        _LIVE.discard(self)

    async def aclose(self) -> None:
        """Kill the worker now; wait for any call in flight to notice, then free its resources."""
        self.kill()
        async with self._lock:
            await anyio.to_thread.run_sync(self.close_sync)

    # -- calls -------------------------------------------------------------------------
    async def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        cpu_s: int | None = None,
        max_output_bytes: int | None = None,
    ) -> SandboxResult:
        """Execute ``code`` in the persistent namespace. Never raises for anything the code does."""
        limits = self.limits
        timeout_s = limits.timeout_s if timeout_s is None else timeout_s
        cap = limits.max_output_bytes if max_output_bytes is None else max_output_bytes
        request = {
            "code": code,
            "stdin": stdin,
            "cpu_s": limits.cpu_s if cpu_s is None else cpu_s,
            "max_output": cap,
        }
        body = json.dumps(request).encode()
        if len(body) > _MAX_REQUEST_BYTES:
            return SandboxResult(error=f"code and stdin exceed {_MAX_REQUEST_BYTES >> 20} MB", exit_code=1)
        async with self._lock:
            if not self.alive:
                return SandboxResult(
                    error="the interpreter is no longer running", exit_code=-1, worker_died=True
                )
            for fd in (self._out_fd, self._err_fd):
                os.ftruncate(fd, 0)
            self.calls += 1
            start = time.perf_counter()
            reply: dict[str, Any] | None = None
            problem: str | None = None
            try:
                with anyio.move_on_after(timeout_s) as scope:
                    await self._write(len(body).to_bytes(_FRAME_HEADER, "big") + body)
                    reply = await self._read_reply(cap)
                timed_out = scope.cancelled_caught
            except _WorkerGone as exc:
                timed_out, problem = False, str(exc) or None
            except BaseException:
                self.kill()  # cancelled from outside mid-call: the worker's state is unknown
                raise
            elapsed_ms = (time.perf_counter() - start) * 1000
            if reply is None:
                self.kill()
                returncode = await self._wait_exit()
            stdout, stderr, truncated = self._read_output(cap)
        if timed_out:
            return SandboxResult(
                stdout, stderr, -signal.SIGKILL, True, truncated,
                f"timed out after {timeout_s:g} s; the interpreter was killed", elapsed_ms, worker_died=True,
            )  # fmt: skip
        if reply is None:
            why = problem or _describe_exit(returncode, request["cpu_s"])
            return SandboxResult(
                stdout, stderr, returncode, False, truncated, why, elapsed_ms, worker_died=True
            )
        return SandboxResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=int(reply.get("exit_code") or 0),
            truncated=truncated or bool(reply.get("truncated")),
            error=reply.get("error"),
            elapsed_ms=elapsed_ms,
            value=reply.get("value"),
        )

    async def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._wfd, view) :]
            except BlockingIOError:
                await anyio.wait_writable(self._wfd)
            except (BrokenPipeError, ConnectionResetError):
                raise _WorkerGone from None

    async def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = os.read(self._rfd, n - len(buf))
            except BlockingIOError:
                await anyio.wait_readable(self._rfd)
                continue
            if not chunk:
                raise _WorkerGone
            buf += chunk
        return bytes(buf)

    async def _read_reply(self, cap: int) -> dict[str, Any]:
        size = int.from_bytes(await self._read_exact(_FRAME_HEADER), "big")
        if size > 8 * cap + (1 << 20):
            raise _WorkerGone(
                "the interpreter sent an oversized reply (its control channel was tampered with)"
            )
        try:
            reply = json.loads(await self._read_exact(size))
        except ValueError:
            reply = None

        if not isinstance(reply, dict):
            raise _WorkerGone(
                "the interpreter sent a malformed reply (its control channel was tampered with)"
            )
        return reply

    async def _wait_exit(self) -> int:
        for _ in range(1000):
            code = self.proc.poll()
            if code is not None:
                return code
            await anyio.sleep(0.005)
        return -signal.SIGKILL

    def _read_output(self, cap: int) -> tuple[str, str, bool]:
        texts = []
        truncated = False
        for fd in (self._out_fd, self._err_fd):
            size = os.fstat(fd).st_size
            texts.append(os.pread(fd, cap, 0).decode("utf-8", errors="replace"))
            truncated = truncated or size > cap
        return texts[0], texts[1], truncated


def _terminate(proc: subprocess.Popen[bytes], uid: int | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    if uid is not None:
        _kill_uid(uid)


# ----------------------------------------------------------------------------------------
# Pool of warm workers
# ----------------------------------------------------------------------------------------
@dataclass
class _PoolState:
    idle: deque[SandboxWorker] = field(default_factory=deque)
    leased: set[SandboxWorker] = field(default_factory=set)
    retired: deque[SandboxWorker] = field(default_factory=deque)
    last_error: str | None = None
    closing: bool = False


class SandboxPool:
    """Pre-spawned, confined interpreters. A leased worker is never reused by anyone else.

    ``acquire`` hands out a warm worker (or starts one when none is idle); ``release``
    kills it. A background thread keeps ``size`` idle workers ready and reaps killed
    ones, so it works with any event loop and costs the loop nothing.
    """

    def __init__(
        self,
        size: int = 4,
        limits: SandboxLimits | None = None,
        *,
        python: str = sys.executable,
        preload: tuple[str, ...] = (),
        namespaces: bool = True,
        hide: tuple[str, ...] | None = None,
    ) -> None:
        if size < 0:
            raise ValueError("pool size must be >= 0")
        self.size = size
        self.limits = limits or SandboxLimits()
        self._spawn_kwargs: dict[str, Any] = {
            "python": python,
            "preload": preload,
            "namespaces": namespaces,
            "hide": hide,
        }
        self._state = _PoolState()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._started = False
        self.isolation: dict[str, str] = {}

    async def start(self) -> None:
        """Start one worker now (so a broken setup fails here, loudly), the rest in the background."""
        if self._started:
            return
        self._started = True  # before the first await: concurrent callers return at once
        try:
            first = await anyio.to_thread.run_sync(self._spawn)
        except BaseException:
            self._started = False
            raise
        with self._cond:
            self._state.idle.append(first)
        self._thread = threading.Thread(target=self._maintain, name="sandbox-pool", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Kill every worker, idle and leased, and stop the background thread."""
        with self._cond:
            self._state.closing = True
            workers = [*self._state.idle, *self._state.leased, *self._state.retired]
            self._state.idle.clear()
            self._state.leased.clear()
            self._state.retired.clear()
            self._cond.notify_all()
        for worker in workers:
            worker.kill()
        thread, self._thread = self._thread, None
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join)
        for worker in workers:
            await worker.aclose()

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def acquire(self) -> SandboxWorker:
        """A warm, confined worker for one user (session). Release it when done."""
        worker = None
        with self._cond:
            if self._state.closing:
                raise SandboxError("the sandbox pool is closed")
            while self._state.idle:
                candidate = self._state.idle.popleft()
                if candidate.alive:
                    worker = candidate
                    break
                self._state.retired.append(candidate)
            self._cond.notify_all()  # refill
        if worker is None:
            worker = await anyio.to_thread.run_sync(self._spawn)
        with self._cond:
            self._state.leased.add(worker)
        return worker

    async def release(self, worker: SandboxWorker) -> None:
        """Kill a leased worker (its namespace and files die with it); reaped in the background."""
        worker.kill()
        with self._cond:
            self._state.leased.discard(worker)
            if self._thread is not None and not self._state.closing:
                self._state.retired.append(worker)
                self._cond.notify_all()
                return
        await worker.aclose()

    @contextlib.asynccontextmanager
    async def worker(self) -> AsyncIterator[SandboxWorker]:
        """``async with pool.worker() as w: await w.run(...)`` — a worker for one block."""
        worker = await self.acquire()
        try:
            yield worker
        finally:
            await self.release(worker)

    @property
    def idle_count(self) -> int:
        return len(self._state.idle)

    def _spawn(self) -> SandboxWorker:
        worker = SandboxWorker.spawn(self.limits, **self._spawn_kwargs)
        self.isolation = worker.isolation
        return worker

    def _maintain(self) -> None:
        """Background thread: reap retired workers, keep ``size`` idle ones warm."""
        while True:
            with self._cond:
                while not (
                    self._state.closing
                    or self._state.retired
                    or (len(self._state.idle) < self.size and self._state.last_error is None)
                ):
                    if not self._cond.wait(timeout=5.0):
                        self._state.last_error = None  # retry spawning after a quiet spell
                if self._state.closing:
                    return
                retired = list(self._state.retired)
                self._state.retired.clear()
                need = len(self._state.idle) < self.size and self._state.last_error is None
            for worker in retired:
                worker.close_sync()
            if not need:
                continue
            try:
                fresh = self._spawn()
            except Exception as exc:  # reported again by acquire() when it has to spawn itself
                with self._cond:
                    self._state.last_error = str(exc)
                continue
            with self._cond:
                if self._state.closing:
                    fresh.close_sync()
                    return
                self._state.idle.append(fresh)
                self._state.last_error = None


async def run_python(
    code: str,
    *,
    stdin: str = "",
    timeout_s: float = 10,
    memory_mb: int = 512,
    max_output_bytes: int = 65536,
    limits: SandboxLimits | None = None,
) -> SandboxResult:
    """Run ``code`` once in a fresh confined interpreter and discard it.

    ``limits`` sets the rest (CPU, processes, file size); the keyword arguments win.
    """
    limits = replace(
        limits or SandboxLimits(),
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
    )
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, limits)
    try:
        return await worker.run(code, stdin=stdin)
    finally:
        await worker.aclose()
