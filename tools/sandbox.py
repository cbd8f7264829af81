"""Run untrusted Python in confined subprocesses: one-shot runs and warm, stateful workers.

Why a subprocess per sandbox: the model's code may loop forever, exhaust memory, fork,
crash the interpreter or try to reach the network. A separate process that the tool
server can kill at any moment contains all of that; the server only ever sees a
``SandboxResult``.

A worker is ``fork``-ed from a pre-warmed *template* process (``tools.sandbox_zygote``:
one per interpreter, ``python -I tools/sandbox_worker.py --template``, holding the
interpreter, the worker's modules and a fixed list of standard modules; pages shared
copy-on-write). The template never receives code, only "fork a worker with this config and
these fds"; as root it also builds the read-only root below once, in its own mount
namespace, and keeps two spare children per root that have entered their namespaces and
that root ahead of demand (each handed one session). The forked child cuts every tie to it
(its socket and every other fd closed, ``random`` re-seeded, a process group of its own),
then the bootstrap (trusted code,
standard library only) confines its own process *before* it reads any untrusted code, and
serves requests over two control pipes: each request's code is ``exec``-ed in one
persistent namespace (exec happens only inside the confined child), the value of a
trailing expression is returned like a REPL does. What the template shares and why it
leaks nothing between sessions: docs/security.md, "How a worker starts".

What is guaranteed, in the order the bootstrap applies it (the strong mode: the server runs
as root, i.e. with CAP_SYS_ADMIN, CAP_SETUID/CAP_SETGID and CAP_KILL, on Linux >= 5.8 with
seccomp filters allowed; ``SandboxPool.isolation`` reports what each worker actually got):

* **network**: a new, empty network namespace (``unshare(CLONE_NEWNET)``; not even
  loopback is up, so every connect fails with "Network is unreachable"). AF_VSOCK, which
  no network namespace confines, is refused by the seccomp filter. As non-root it tries a
  user + network namespace instead. Where the kernel refuses both, an audit hook blocks
  ``socket.connect/bind/sendto/sendmsg`` in the interpreter (a weaker fallback: code that
  calls libc through ctypes is not stopped).
* **IPC**: an IPC namespace of its own (with the network one, in both modes). SysV shared
  memory, semaphores and message queues, and POSIX message queues, outlive the processes
  that made them: in the host's namespace one session could leave a segment (mode 0666)
  that another attaches to, holding memory after both are gone. Its own die with it.
* **filesystem, deny by default**: a private mount namespace whose root is a tmpfs
  (``pivot_root``; the host's tree is detached; the template builds it once per ``hide`` list
  and each worker gets a copy of it with its mount namespace) holding only: read-only binds of ``/usr``,
  ``/bin``, ``/sbin``, ``/lib*``, ``/etc/ld.so.cache``, ``/etc/ld.so.conf*``,
  ``/etc/localtime``, ``/etc/alternatives``, and of the interpreter's own tree (its
  prefixes, executable and the ``sys.path`` entries; an entry inside a ``hide`` directory
  is left out unless it lies in a prefix); a synthetic ``/etc/passwd`` and ``/etc/group``
  (root and the sandbox user); ``/dev/{null,zero,full,random,urandom}`` and ``/dev/fd``;
  a fresh ``/proc`` with ``hidepid=invisible`` (once the worker has dropped to its own
  uid it lists only that uid's processes, not the server's or other sandboxes'); and,
  mounted by each worker in its own namespace, private, size-capped tmpfs mounts (mode
  0700, owned by the worker's uid) on ``/tmp``
  (``tmpfs_mb``, the working directory), ``/var/tmp`` and ``/dev/shm`` (4 MB each).
  Nothing else exists inside: no ``/home``, ``/root``, ``/opt``, ``/srv``, ``/run``,
  ``/mnt``, ``/sys``, no config or tokens file, no project checkout (a venv inside the
  checkout is shown, its siblings are not), no other sandbox's files. The root and every
  bind are read-only, so the three tmpfs mounts are the only writable places; they die
  with the worker and cap what it can store. ``hide`` paths that a shown tree holds (say,
  under ``/usr/local``) are covered too. Where ``pivot_root`` is refused the bootstrap
  ``chroot``-s into the same tree (reported in ``isolation['root']``): the worker then
  has no capability to leave it, and the filter refuses ``chroot`` and mounts.
  *Weaker fallback* without a mount namespace (not root, or the kernel refuses): the
  working directory is a private host directory (mode 0700 inside a 0711 parent), and
  every world-readable host file, the host's ``/tmp`` and other world-writable host
  directories stay reachable.
* **identity**: as root, each worker drops to its own unprivileged uid/gid (picked
  from ``UID_RANGE``), with ``no_new_privs``. A per-worker uid is what makes
  ``RLIMIT_NPROC`` bind (it counts processes per real uid, and root ignores it), and
  it stops one sandbox from signalling or reading another. When the server is not root
  the worker keeps the server's uid; RLIMIT_NPROC then counts all of that user's
  processes, which in practice means the sandbox cannot fork. A root server that can
  neither mount nor let another uid reach the interpreter refuses to start workers
  (``SandboxError``) instead of running untrusted code as root.
* **nothing runs between calls**: when a call returns, the server stops the worker
  (SIGSTOP, so threads it left running stop too; SIGCONT before the next request) and
  SIGKILLs every other process of the sandbox: with a dedicated uid, every process of
  that uid; without one, the worker's descendants (the worker is their subreaper, so
  orphans stay in its tree, and the filter keeps it so). There is no PID namespace, but
  since every earlier process was killed the same way, the processes left at the end of
  a call were all created during it: only pids handed out since the call began (the last
  pid in ``/proc/loadavg``) are looked at, and all of ``/proc`` when they may have gone
  all the way round (forks counted by ``/proc/stat`` over half of ``pid_max``). Killing
  or evicting a worker kills every process of its uid, and so does a worker dying mid-call
  (timeout, crash), at once. A uid is handed out again only once none of its processes is
  left. A worker's process group is signalled only while its pid cannot have been reused
  (its template has not reaped it, or it still runs); the worker itself only through its
  pidfd.
* **resources**: RLIMIT_AS (memory, per process), RLIMIT_NPROC, RLIMIT_FSIZE (also caps
  captured output), RLIMIT_NOFILE, no core dumps; the wall-clock timeout is enforced by
  the server, which kills the worker. CPU is bounded three ways: per call (soft
  RLIMIT_CPU raised before each request, inherited by children), per process (hard
  RLIMIT_CPU = ``worker_cpu_s``), and over the worker's life: after each call the server
  adds up the worker's CPU, that of the children it has reaped (utime, stime, cutime,
  cstime from ``/proc/<pid>/stat``) and that of every process it killed, and kills the
  worker once the total passes ``worker_cpu_s``. A single call uses at most
  ``max_processes x timeout_s`` CPU whatever it does.
* **seccomp** (the last step before untrusted code runs, x86_64 and aarch64): a classic
  BPF filter, reported as ``isolation['seccomp']``. EPERM for: new namespaces
  (``unshare``, ``setns``, ``clone`` with any CLONE_NEW* flag) and every mount call
  (``mount``, ``umount2``, ``pivot_root``, ``chroot``, the fsopen/open_tree family) —
  an unprivileged user namespace would give the code "root" over mounts and namespaced
  kernel interfaces; reaching into other processes (``ptrace``, ``process_vm_*``,
  ``pidfd_getfd``, ``kcmp``, ``process_madvise``); large kernel attack surface no Python
  code needs (``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, keyrings);
  ``memfd_create`` and ``memfd_secret`` (a memfd's pages count neither to RLIMIT_AS nor to
  the tmpfs caps nor to the fleet's memory figure);
  host administration calls (modules, kexec, reboot, swap, clocks, ...: these need
  capabilities the worker lacks anyway); ``socket(AF_VSOCK)``; unsetting its subreaper
  flag. ``clone3`` fails with ENOSYS (its flags are in memory a filter cannot read; libc
  falls back to ``clone``); a foreign syscall ABI (x32, i386) is refused or kills.
* **control channel**: the code can write frames to its own worker's reply pipe. A
  reply is trusted only as that call's displayed output (see ``_parse_reply``): its
  shape and sizes are checked, stale frames are skipped by sequence number, a malformed
  one kills only its own worker, and every decision (alive, CPU, memory, processes) is
  taken from the kernel.
* **fleet** (``SandboxPool``): at most ``max_workers`` live interpreters and
  ``max_total_memory_mb`` of their memory (PSS of the worker plus what its tmpfs mounts
  hold). A new lease past either limit evicts idle leased workers, least recently used
  first, or fails with ``SandboxOverloaded`` when none is idle.

Known gaps: pids are the host's numbers (no PID namespace). Workers of one template share
what an ``exec`` draws once: the address-space layout (ASLR), the stack canary and the
``str``/``bytes`` hash secret. ``/usr`` is shown whole, so
anything installed under it (a non-editable install of the server's own package in
``/usr/local``, say) is readable. Memory is measured between calls (a call's children,
each under RLIMIT_AS, are not counted) and may be up to a second old at admission.
The lifetime CPU account misses children that exit on their own during a call while
SIGCHLD is ignored (the kernel then drops their times; still bounded per call as above),
and may count a process killed at the end of a call twice (once when killed, once when
the worker reaps it), which only stops such a session sooner. The filter is a deny
list, only for x86_64 and aarch64 (elsewhere ``isolation['seccomp']`` says
"unavailable"); executable anonymous memory stays allowed, because ctypes callbacks
(libffi closures) need it and native code reaches no syscall that ctypes does not
already reach. There are no ptys (``/dev/pts``). Kernel buffers a worker holds open
(pipes, unix sockets) count to no memory figure; RLIMIT_NOFILE and the kernel's per-user
pipe limit bound them to tens of MB. Without a dedicated uid a worker that
dies mid-call can leave orphans behind. ``run_python`` (one-shot) workers are outside
any pool's fleet budget, and so are the template and its spare children (two per prepared
root, ~0.8-1 MB private memory each, the rest shared with the template, plus their two
namespaces).

Captured output goes to two memfds created by the server and passed to the worker as
fds 1 and 2, so everything lands there (``print``, ``os.write(1, ...)``, C extensions,
child processes) and stays readable after the worker dies. Only the first
``max_output_bytes`` of each are read back, and both are emptied after each call (what they
hold counts to no memory figure).

Host side: per-worker directories live in one ``toolfactory-sandbox-*`` directory under
the server's temp dir, removed with the last worker (closing the pool), at exit, and on
SIGTERM where nothing else handles the signal.

Deployment: the strong mode needs root with CAP_SYS_ADMIN in the server's container
(docker: ``cap_add: [SYS_ADMIN]`` and a seccomp/AppArmor profile that allows ``unshare``,
``mount``, ``pivot_root`` and installing seccomp filters). Run the server under an init
(compose ``init: true``) so orphans of killed sandboxes are reaped.
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

from tools.sandbox_uids import DEFAULT_UIDS, UidClaim, claim_free_slice
from tools.sandbox_zygote import (
    WORKER_PATH,
    ForkedProcess,
    TemplateError,
    TemplateLost,
    stop_templates,
    template_for,
)

UID_RANGE = DEFAULT_UIDS  # unprivileged uids handed to workers as root (configure_uids: per replica)
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


# What runs on the sandbox's side: the template and, after each fork, the worker's bootstrap
# (trusted, standard library only; read by the template's interpreter before any worker exists).
_WORKER_PATH = WORKER_PATH


# ----------------------------------------------------------------------------------------
# Server side
# ----------------------------------------------------------------------------------------
class _UidAllocator:
    """Hands out distinct sandbox uids within this process, from this replica's range."""

    def __init__(self, uids: range) -> None:
        self._uids = uids
        self._used: set[int] = set()
        self._lock = threading.Lock()
        self._claim: UidClaim | None = None

    @property
    def uids(self) -> range:
        return self._uids

    def use(self, uids: range, claim: UidClaim | None) -> None:
        """Draw from ``uids`` from now on (held by ``claim``). Workers already running keep
        their uids, which stay taken until they are released."""
        with self._lock:
            old, self._claim, self._uids = self._claim, claim, uids
        if old is not None:
            old.release()

    def acquire(self) -> int:
        """A free uid: random (a uid freed a moment ago is rarely reused at once), else the first free."""
        with self._lock:
            uids = self._uids
            picks = (random.choice(uids) for _ in range(64))
            uid = next((u for u in picks if u not in self._used), None)
            if uid is None:
                uid = next((u for u in uids if u not in self._used), None)
            if uid is None:
                raise SandboxError(f"no free sandbox uid left in {uids[0]}-{uids[-1]}")
            self._used.add(uid)
            return uid

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


_UIDS = _UidAllocator(UID_RANGE)


def configure_uids(uids: range, claims_dir: str | None = None, *, replicas: int | None = None) -> range:
    """This replica's worker uids, a slice no other replica on the node uses (``tools.sandbox_uids``).

    With ``claims_dir`` the range is claimed there for the life of the process (ValueError when
    a live server's claim overlaps it); with ``replicas`` too, the first free one of that many
    slices of ``uids`` is taken. Returns the range in use. A server that is not root hands out
    no uids (its workers keep its own), so it claims nothing.
    """
    if os.geteuid() != 0:
        claims_dir = replicas = None
    if replicas is not None:
        if claims_dir is None:
            raise ValueError("a sandbox uid slice picked automatically needs a claims directory")
        claim = claim_free_slice(uids, replicas, claims_dir)
        uids = claim.uids
    else:
        claim = UidClaim(uids, claims_dir) if claims_dir is not None else None
    _UIDS.use(uids, claim)
    return uids


_LIVE: weakref.WeakSet[SandboxWorker] = weakref.WeakSet()


class _HostDirs:
    """Per-worker host directories in one per-process root (mode 0711: enter, not list).

    The root is removed with the last worker directory (a closed pool leaves nothing in
    /tmp), at exit, and on SIGTERM where nobody else handles it.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entered by the SIGTERM handler in the main thread
        self._root: str | None = None
        self._count = 0

    def new(self) -> str:
        with self._lock:
            if self._root is None or not os.path.isdir(self._root):
                self._root = tempfile.mkdtemp(prefix="toolfactory-sandbox-")
                os.chmod(self._root, 0o711)
            path = tempfile.mkdtemp(prefix="w-", dir=self._root)
            self._count += 1
            return path

    def drop(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)
        with self._lock:
            self._count -= 1
            if self._count <= 0:
                self._remove_root()

    def _remove_root(self) -> None:
        root, self._root, self._count = self._root, None, 0
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    @property
    def root(self) -> str | None:
        return self._root

    def remove_all(self) -> None:
        with self._lock:
            self._remove_root()


_HOSTDIRS = _HostDirs()


@atexit.register
def _kill_all_workers() -> None:
    for worker in list(_LIVE):
        worker.kill()
        if worker.uid is not None:
            _kill_uid(worker.uid)
    stop_templates()
    _HOSTDIRS.remove_all()


def _on_sigterm(signum: int, frame: object) -> None:
    _kill_all_workers()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of SIGTERM as before, just without leftovers


def _clean_up_on_sigterm() -> None:
    """Where SIGTERM would kill the process outright (no handler), clean up first."""
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)


def default_hidden_paths() -> tuple[str, ...]:
    """Home directories and the server's working directory (its config, data and code)."""
    paths = ["/root", "/home"]
    cwd = os.path.realpath(os.getcwd())
    if cwd.count("/") >= 2 and not cwd.startswith(("/usr", "/lib", "/bin", "/sbin", "/etc", "/proc", "/sys")):
        paths.append(cwd)
    return tuple(paths)


# -- processes, from /proc -----------------------------------------------------------------
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_read(path: str) -> bytes:
    """A /proc file's content, read without a Python file object (several of these run per call)."""
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


def _status(pid: int) -> tuple[int, int] | None:
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


def _processes_of(uid: int) -> list[int]:
    """Processes of real uid ``uid`` that can still run, from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            status = _status(int(entry))
            if status is not None and status[0] == uid:
                pids.append(int(entry))
    return pids


def _kill_uid(uid: int) -> bool:
    """SIGKILL every process of a sandbox uid, repeatedly, until a fork bomb runs dry.
    False if some were still there after the last round (the uid must not be handed out)."""
    for _ in range(50):
        pids = _processes_of(uid)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)
    return not _processes_of(uid)


def _cpu_seconds(pid: int) -> float:
    """CPU time of a process and of the children it has reaped (utime, stime, cutime, cstime)."""
    try:
        fields = _proc_read(f"/proc/{pid}/stat").rpartition(b")")[2].split()
        return sum(int(f) for f in fields[11:15]) / _CLK_TCK
    except (OSError, ValueError, IndexError):
        return 0.0


_Clock = tuple[int, int]


def _last_pid() -> int:
    """The last pid handed out in this PID namespace."""
    return int(_proc_read("/proc/loadavg").rsplit(None, 1)[1])


def _forks() -> int:
    """Processes (and threads) forked host-wide since boot."""
    return int(_proc_read("/proc/stat").partition(b"\nprocesses ")[2].split(None, 1)[0])


def _pid_clock() -> _Clock:
    return _last_pid(), _forks()


def _new_pids(start: _Clock, end: _Clock) -> list[range] | None:
    """The pids handed out between two clocks, or None when they may have gone all the way round.

    There is no PID namespace: this window is where a sandbox's new processes must be.
    """
    (first, forks0), (last, forks1) = start, end
    if forks1 - forks0 >= _PID_MAX // 2:  # pids in use are skipped: a lap may take fewer forks
        return None
    if last >= first:
        return [range(first + 1, last + 1)]
    return [range(first + 1, _PID_MAX), range(1, last + 1)]


def _pids_in(window: list[range] | None) -> list[int]:
    if window is not None and sum(map(len, window)) <= 256:
        return [pid for r in window for pid in r]  # a few probes beat listing /proc
    pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    return pids if window is None else [p for p in pids if any(p in r for r in window)]


def _pss_bytes(pid: int) -> int:
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


def _describe_exit(returncode: int, cpu_s: int, *, lost: bool = False) -> str:
    if lost:
        return "the interpreter stopped (its exit status was lost with the template process that forked it)"
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


def _parse_reply(body: bytes, cap: int) -> dict[str, Any] | None:
    """A reply frame checked for shape, or None when it is not one the bootstrap could send.

    Nothing in a reply is trusted beyond display: the code that ran can write frames to its
    own control pipe, so a reply only ever becomes that call's shown output (value, error,
    exit status, truncation flag; strings cut to ``cap``). Whether the worker is alive, what
    it costs and which processes it has come from the kernel (waitpid, /proc, signals), and
    ``seq`` only tells a stale frame from the current one.
    """
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(reply, dict):
        return None
    seq, code = reply.get("seq"), reply.get("exit_code", 0)
    value, error = reply.get("value"), reply.get("error")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (seq, code)):
        return None
    if not all(x is None or isinstance(x, str) for x in (value, error)):
        return None
    truncated = reply.get("truncated") is True or len(value or "") > cap or len(error or "") > cap
    return {
        "seq": seq,
        "exit_code": max(-(1 << 31), min(code, (1 << 31) - 1)),
        "value": None if value is None else value[:cap],
        "error": None if error is None else error[:cap],
        "truncated": truncated,
    }


class SandboxWorker:
    """One confined interpreter process with a persistent namespace. One call at a time.

    Between calls the worker is stopped (SIGSTOP) and is its sandbox's only process: every
    other one is killed when a call returns, and its CPU is added to the worker's account.
    """

    def __init__(
        self,
        proc: ForkedProcess,
        limits: SandboxLimits,
        uid: int | None,
        hostdir: str,
        fds: tuple[int, int, int, int],
        isolation: dict[str, str],
    ) -> None:
        self.proc = proc
        self.limits = limits
        self.uid = uid
        self.isolation = isolation
        self._hostdir = hostdir
        self._wfd, self._rfd, self._out_fd, self._err_fd = fds  # control out and in, stdout, stderr
        os.set_blocking(self._wfd, False)
        os.set_blocking(self._rfd, False)
        self._lock = anyio.Lock()
        self._state_lock = threading.Lock()  # busy / evicted, shared with the pool's thread
        self._busy = False
        self._killed = False
        self._closed = False
        self._seq = 0
        self._killed_cpu_s = 0.0  # CPU of processes it left running, killed after their call
        self._forks_seen = _forks()  # host-wide fork count when it was last checked (see _settle)
        self.calls = 0
        self.last_used = time.monotonic()
        self.evicted: str | None = None  # why the pool evicted it, if it did
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

        ``hide``: directories the sandbox must not see even where a shown system tree holds
        them, and whose ``sys.path`` entries it must not get (default
        :func:`default_hidden_paths`); the interpreter's own prefixes stay visible.
        """
        for attempt in range(2):
            try:
                return cls._fork(limits, python, preload, namespaces, hide, startup_timeout_s)
            except TemplateLost as exc:  # the next fork starts a new template; fresh fds and uid
                if attempt:
                    raise SandboxError(f"the sandbox worker failed to start: {exc}") from None
        raise AssertionError("unreachable")

    @classmethod
    def _fork(
        cls,
        limits: SandboxLimits,
        python: str,
        preload: tuple[str, ...],
        namespaces: bool,
        hide: tuple[str, ...] | None,
        startup_timeout_s: float,
    ) -> SandboxWorker:
        uid = _UIDS.acquire() if os.geteuid() == 0 else None
        hostdir = _HOSTDIRS.new()
        ctl_in, to_worker = os.pipe()
        from_worker, ctl_out = os.pipe()
        out_fd = os.memfd_create("sandbox-stdout")
        err_fd = os.memfd_create("sandbox-stderr")
        ours = (to_worker, from_worker, out_fd, err_fd)
        theirs = [ctl_in, ctl_out, out_fd, err_fd]  # in the order the worker expects them
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
                "preload": list(preload),
                "memory_mb": limits.memory_mb,
                "worker_cpu_s": limits.worker_cpu_s,
                "max_processes": limits.max_processes,
                "max_file_mb": limits.max_file_mb,
                "max_open_files": limits.max_open_files,
                "tmpfs_mb": limits.tmpfs_mb,
            }
            try:
                proc = template_for(python).fork(config, theirs)
            except TemplateLost:
                raise
            except TemplateError as exc:
                raise SandboxError(f"the sandbox worker failed to start: {exc}") from None
            for fd in (ctl_in, ctl_out):
                os.close(fd)  # the worker has them; EOF on from_worker now means it is gone
            theirs = []
            ready = _read_frame_blocking(from_worker, startup_timeout_s)
            if not ready or not ready.get("ready"):
                reason = ready.get("error") if ready else None
                if reason is None:
                    proc.kill()
                    code = proc.wait(5)
                    reason = "no reply" + ("" if code is None else f" (exit status {code})")
                raise SandboxError(f"the sandbox worker failed to start: {reason}")
            isolation = {"start": "forked from the pre-warmed template process", **ready["isolation"]}
            return cls(proc, limits, uid, hostdir, ours, isolation)
        except BaseException:
            if proc is not None:
                _terminate(proc, None)
                proc.wait(5)
                proc.close()
            # The uid is swept even without a process: a template lost mid-request may have
            # forked the worker before it died.
            if uid is not None and _kill_uid(uid):
                _UIDS.release(uid)
            for fd in {*ours, *theirs}:  # out_fd and err_fd are in both: closed once, not twice
                with contextlib.suppress(OSError):
                    os.close(fd)
            _HOSTDIRS.drop(hostdir)
            raise

    @property
    def alive(self) -> bool:
        return not self._killed and not self.proc.exited()

    @property
    def busy(self) -> bool:
        """A call is running in it (the pool never evicts a busy worker)."""
        return self._busy

    def kill(self) -> None:
        """SIGKILL the worker and its process group now. Cheap, idempotent, safe from any thread.

        Children that left the process group are swept by uid in :meth:`close_sync`.
        """
        if self._killed:
            return
        self._killed = True
        _terminate(self.proc, None)

    def evict(self, reason: str) -> bool:
        """Kill the worker unless a call is running in it; its next call reports ``reason``."""
        with self._state_lock:
            if self._busy or not self.alive:
                return False
            self.evicted = reason
            self.kill()
            return True

    def close_sync(self) -> None:
        """Kill every process of the sandbox, reap and free everything (blocking: run it in a thread)."""
        self.kill()
        if self._closed:
            return
        self._closed = True
        uid_free = self.uid is None or _kill_uid(self.uid)
        self.proc.wait(5)
        self.proc.close()
        for fd in (self._wfd, self._rfd, self._out_fd, self._err_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        _HOSTDIRS.drop(self._hostdir)
        if self.uid is not None and uid_free:  # else it stays taken: never two sandboxes on one uid
            _UIDS.release(self.uid)
        _LIVE.discard(self)

    async def aclose(self) -> None:
        """Kill the worker now; wait for any call in flight to notice, then free its resources."""
        self.kill()
        async with self._lock:
            await anyio.to_thread.run_sync(self.close_sync)

    # -- accounting ----------------------------------------------------------------------
    @property
    def cpu_used_s(self) -> float:
        """CPU used by the worker and every process it started, as far as the kernel shows it."""
        return _cpu_seconds(self.proc.pid) + self._killed_cpu_s

    def memory_bytes(self) -> int:
        """What it holds now: the worker's PSS plus the data in its private tmpfs mounts.

        Between calls the worker is the sandbox's only process; during a call its children
        (each under the same RLIMIT_AS) are not counted.
        """
        pid = self.proc.pid
        total = _pss_bytes(pid)
        if "root" in self.isolation:  # its tmpfs mounts (without a new root, /tmp is the host's)
            for path in ("tmp", "var/tmp", "dev/shm"):
                with contextlib.suppress(OSError):
                    st = os.statvfs(f"/proc/{pid}/root/{path}")
                    total += (st.f_blocks - st.f_bfree) * st.f_frsize
        return total

    def _members(self, pids: list[int], known: set[int]) -> set[int]:
        """Which of pids are other processes of this sandbox: its uid, or (no uid) its descendants."""
        root = self.proc.pid
        info = {pid: st for pid in pids if pid != root and (st := _status(pid)) is not None}
        if self.uid is not None:
            return {pid for pid, (uid, _) in info.items() if uid == self.uid}
        members: set[int] = set()
        grew = True
        while grew:  # orphans are re-parented to the worker (its subreaper), so the tree holds
            grew = False
            for pid, (_, ppid) in info.items():
                if pid not in members and (ppid == root or ppid in members or ppid in known):
                    members.add(pid)
                    grew = True
        return members

    def _quiet(self, start: _Clock, now: _Clock) -> bool:
        """Cheap check after a call: no process of the sandbox was started during it."""
        window = _new_pids(start, now)
        return (
            window is not None and sum(map(len, window)) <= 64 and not self._members(_pids_in(window), set())
        )

    def _kill_strays(self, start: _Clock) -> bool:
        """Kill every process the call left running (all were started during it: the ones of
        earlier calls were killed the same way), adding their CPU to the worker's account.
        False if they never ran dry (then the worker and its uid are killed too)."""
        known: set[int] = set()
        clock = start
        for _ in range(500):
            now = _pid_clock()
            found = self._members(_pids_in(_new_pids(clock, now)), known)
            found |= {pid for pid in known if _status(pid) is not None}
            if not found:
                return True
            for pid in found - known:
                self._killed_cpu_s += _cpu_seconds(pid)
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            known |= found
            clock = now
            time.sleep(0.001)
        self.kill()
        if self.uid is not None:
            _kill_uid(self.uid)
        return False

    async def _settle(self, start: _Clock) -> str | None:
        """After a call: freeze the worker, kill what it left running, check its CPU budget."""
        self.proc.send_signal(signal.SIGSTOP)  # threads it left running stop too
        now = _pid_clock()
        self._forks_seen = now[1]
        if not self._quiet(start, now) and not await anyio.to_thread.run_sync(self._kill_strays, start):
            return "the processes it started could not all be stopped; the interpreter was killed"
        budget = self.limits.worker_cpu_s
        if self.cpu_used_s > budget:
            self.kill()
            return (
                f"the interpreter and the processes it started used up their CPU budget of {budget} s "
                "(over the interpreter's life); it was killed"
            )
        return None

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
            "seq": self._seq + 1,
        }
        body = json.dumps(request).encode()
        if len(body) > _MAX_REQUEST_BYTES:
            return SandboxResult(error=f"code and stdin exceed {_MAX_REQUEST_BYTES >> 20} MB", exit_code=1)
        async with self._lock:
            with self._state_lock:
                if not self.alive:
                    why = f"the interpreter was evicted: {self.evicted}" if self.evicted else None
                    return SandboxResult(
                        error=why or "the interpreter is no longer running", exit_code=-1, worker_died=True
                    )
                self._busy = True
            try:
                return await self._call(request, body, timeout_s, cap)
            finally:
                with self._state_lock:
                    self._busy = False
                    self.last_used = time.monotonic()

    async def _call(self, request: dict[str, Any], body: bytes, timeout_s: float, cap: int) -> SandboxResult:
        self._clear_output()  # what a preloaded module printed while the worker started
        self.calls += 1
        self._seq = request["seq"]
        # The fork count of the last check, not of now: one /proc/stat read per call, and the
        # wrap-around test only gets more cautious (more forks seem to fall in the call).
        start_clock = (_last_pid(), self._forks_seen)
        self.proc.send_signal(signal.SIGCONT)  # through the pidfd: never a recycled pid
        start = time.perf_counter()
        reply: dict[str, Any] | None = None
        problem: str | None = None
        try:
            with anyio.move_on_after(timeout_s) as scope:
                await self._write(len(body).to_bytes(_FRAME_HEADER, "big") + body)
                reply = await self._read_reply(self._seq, cap)
            timed_out = scope.cancelled_caught
        except _WorkerGone as exc:
            timed_out, problem = False, str(exc) or None
        except BaseException:
            self.kill()  # cancelled from outside mid-call: the worker's state is unknown
            raise
        elapsed_ms = (time.perf_counter() - start) * 1000
        if reply is not None:
            problem = await self._settle(start_clock)
        if reply is None or problem:
            self.kill()
            if self.uid is not None:  # what it left running (its own sessions too) dies with it, now
                await anyio.to_thread.run_sync(_kill_uid, self.uid)
            returncode = await self._wait_exit()
        stdout, stderr, truncated = self._read_output(cap)
        self._clear_output()  # up to max_file_mb each, which no memory figure counts
        if timed_out:
            return SandboxResult(
                stdout, stderr, -signal.SIGKILL, True, truncated,
                f"timed out after {timeout_s:g} s; the interpreter was killed", elapsed_ms, worker_died=True,
            )  # fmt: skip
        if reply is None or problem:
            why = problem or _describe_exit(returncode, request["cpu_s"], lost=self.proc.status_lost)
            return SandboxResult(
                stdout, stderr, returncode, False, truncated, why, elapsed_ms, worker_died=True
            )
        return SandboxResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=reply["exit_code"],
            truncated=truncated or reply["truncated"],
            error=reply["error"],
            elapsed_ms=elapsed_ms,
            value=reply["value"],
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

    async def _read_reply(self, seq: int, cap: int) -> dict[str, Any]:
        """The reply to call ``seq``. Frames of earlier calls are skipped: after a forged frame
        ended a call early, the genuine reply of that call arrives during the next one."""
        while True:
            size = int.from_bytes(await self._read_exact(_FRAME_HEADER), "big")
            if size > 32 * cap + (1 << 20):  # value and error, each up to cap chars JSON-escaped
                raise _WorkerGone(
                    "the interpreter sent an oversized reply (its control channel was tampered with)"
                )
            reply = _parse_reply(await self._read_exact(size), cap)
            if reply is None or reply["seq"] > seq:
                raise _WorkerGone(
                    "the interpreter sent a malformed reply (its control channel was tampered with)"
                )
            if reply["seq"] == seq:
                return reply

    async def _wait_exit(self) -> int:
        code = await anyio.to_thread.run_sync(self.proc.wait, 5.0)  # the status comes from the template
        return -signal.SIGKILL if code is None else code

    def _clear_output(self) -> None:
        for fd in (self._out_fd, self._err_fd):
            os.ftruncate(fd, 0)

    def _read_output(self, cap: int) -> tuple[str, str, bool]:
        texts = []
        truncated = False
        for fd in (self._out_fd, self._err_fd):
            size = os.fstat(fd).st_size
            texts.append(os.pread(fd, cap, 0).decode("utf-8", errors="replace"))
            truncated = truncated or size > cap
        return texts[0], texts[1], truncated


def _terminate(proc: ForkedProcess, uid: int | None) -> None:
    proc.kill_group()
    proc.kill()
    if uid is not None:
        _kill_uid(uid)


# ----------------------------------------------------------------------------------------
# Pool of warm workers, within a fleet budget
# ----------------------------------------------------------------------------------------
class SandboxOverloaded(SandboxError):
    """No new sandbox now: the fleet is at its worker or memory limit and no idle session is left."""


# A worker's memory is re-measured after each of its calls, every second while a call runs,
# and every 10 s otherwise (a stopped worker's PSS moves only as page sharing changes).
_MEMORY_BUSY_AGE_S = 1.0
_MEMORY_IDLE_AGE_S = 10.0
_MAINTAIN_EVERY_S = 2.0  # the background thread re-measures memory this often
_SPAWN_RETRY_S = 5.0  # after a failed spawn, the background thread waits this long


@dataclass
class _PoolState:
    idle: deque[SandboxWorker] = field(default_factory=deque)
    leased: set[SandboxWorker] = field(default_factory=set)
    retired: deque[SandboxWorker] = field(default_factory=deque)
    spawning: int = 0
    last_error: str | None = None
    error_at: float = 0.0
    closing: bool = False
    memory: dict[SandboxWorker, tuple[int, float]] = field(default_factory=dict)  # (bytes, measured at)
    evictions: int = 0
    refused: int = 0


class SandboxPool:
    """Pre-spawned, confined interpreters. A leased worker is never reused by anyone else.

    ``acquire`` hands out a warm worker (or starts one when none is idle); ``release``
    kills it. A background thread keeps ``size`` idle workers ready and reaps killed
    ones, so it works with any event loop and costs the loop nothing.

    Fleet budget: at most ``max_workers`` live interpreters (idle ones included) and
    ``max_total_memory_mb`` of measured memory (:meth:`SandboxWorker.memory_bytes`, summed).
    A new lease over either limit first evicts idle leased workers, least recently used
    first (their next call reports the eviction); when none is idle it raises
    :class:`SandboxOverloaded`. The background thread evicts the same way whenever the
    measured memory is over budget.
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
        max_workers: int = 64,
        max_total_memory_mb: int = 8192,
    ) -> None:
        if size < 0:
            raise ValueError("pool size must be >= 0")
        if max_workers < 1 or max_total_memory_mb < 1:
            raise ValueError("max_workers and max_total_memory_mb must be >= 1")
        self.size = size
        self.limits = limits or SandboxLimits()
        self.max_workers = max_workers
        self.max_memory_bytes = max_total_memory_mb << 20
        self._spawn_kwargs: dict[str, Any] = {
            "python": python,
            "preload": preload,
            "namespaces": namespaces,
            "hide": hide,
        }
        self._state = _PoolState()
        self._cond = threading.Condition()
        self._measuring = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started = False
        self.isolation: dict[str, str] = {}

    async def start(self) -> None:
        """Start one worker now (so a broken setup fails here, loudly), the rest in the background."""
        if self._started:
            return
        self._started = True  # before the first await: concurrent callers return at once
        _clean_up_on_sigterm()
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
            self._state.memory.clear()
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
        """A warm, confined worker for one user (session). Release it when done.

        Raises :class:`SandboxOverloaded` when the fleet budget leaves no room.
        """
        if self._memory_stale():
            await anyio.to_thread.run_sync(self._measure_memory)  # /proc reads: off the event loop
        with self._cond:
            if self._state.closing:
                raise SandboxError("the sandbox pool is closed")
            self._make_room(need_worker=not any(w.alive for w in self._state.idle))
            worker = self._pop_idle()
            if worker is None:
                self._state.spawning += 1  # holds its place in max_workers
            self._cond.notify_all()  # refill
        spawned = worker is None
        if worker is None:
            try:
                worker = await anyio.to_thread.run_sync(self._spawn)
            except BaseException:
                with self._cond:
                    self._state.spawning -= 1
                raise
        with self._cond:
            self._state.spawning -= spawned
            closing = self._state.closing
            if not closing:
                worker.last_used = time.monotonic()  # the newest lease is the last to be evicted
                self._state.leased.add(worker)
        if closing:
            await worker.aclose()
            raise SandboxError("the sandbox pool is closed")
        return worker

    async def release(self, worker: SandboxWorker) -> None:
        """Kill a leased worker (its namespace and files die with it); reaped in the background."""
        worker.kill()
        with self._cond:
            self._state.leased.discard(worker)
            self._state.memory.pop(worker, None)
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

    def gauges(self) -> dict[str, float]:
        """Fleet figures for /metrics (re-measures only workers whose figure is stale)."""
        if self._memory_stale():
            self._measure_memory()
        with self._cond:
            state = self._state
            return {
                "sandbox_workers_live": float(len(state.idle) + len(state.leased) + state.spawning),
                "sandbox_workers_idle_pool": float(len(state.idle)),
                "sandbox_workers_busy": float(sum(w.busy for w in state.leased)),
                "sandbox_workers_max": float(self.max_workers),
                "sandbox_memory_bytes": float(self._memory_total()),
                "sandbox_memory_budget_bytes": float(self.max_memory_bytes),
                "sandbox_evictions_total": float(state.evictions),
                "sandbox_admissions_refused_total": float(state.refused),
            }

    def _memory_stale(self) -> bool:
        with self._cond:
            return any(self._stale(w) for w in (*self._state.idle, *self._state.leased))

    def _stale(self, worker: SandboxWorker) -> bool:
        figure = self._state.memory.get(worker)
        if figure is None or worker.last_used >= figure[1]:
            return True
        age = time.monotonic() - figure[1]
        return age > (_MEMORY_BUSY_AGE_S if worker.busy else _MEMORY_IDLE_AGE_S)

    # -- budget (callers hold self._cond unless said otherwise) -----------------------------
    def _live(self) -> int:
        return len(self._state.idle) + len(self._state.leased) + self._state.spawning

    def _memory_total(self) -> int:
        return sum(size for size, _ in self._state.memory.values())

    def _pop_idle(self) -> SandboxWorker | None:
        while self._state.idle:
            candidate = self._state.idle.popleft()
            if candidate.alive:
                return candidate
            self._state.retired.append(candidate)
        return None

    def _make_room(self, *, need_worker: bool) -> None:
        """Evict idle sessions, least recently used first, until a new lease fits; else refuse."""
        while True:
            full = need_worker and self._live() >= self.max_workers
            used = self._memory_total()
            if not full and used < self.max_memory_bytes:
                return
            if full:
                why = f"the sandbox fleet is at its limit of {self.max_workers} interpreters"
            else:
                why = f"sandbox memory is at its limit ({used >> 20} of {self.max_memory_bytes >> 20} MB)"
            if not self._evict_one(f"{why}, and this session was the least recently used idle one"):
                self._state.refused += 1
                raise SandboxOverloaded(
                    f"no python sandbox available: {why} and every session's interpreter is busy. "
                    "Retry in a few seconds, or end sessions that are no longer needed."
                )

    def _evict_one(self, reason: str) -> bool:
        """Kill the least recently used idle leased worker; False if there is none."""
        for victim in sorted(self._state.leased, key=lambda w: w.last_used):
            if victim.evict(reason):
                self._state.leased.discard(victim)
                self._state.memory.pop(victim, None)
                self._state.retired.append(victim)
                self._state.evictions += 1
                self._cond.notify_all()
                return True
        return False

    def _wants_spare(self) -> bool:
        state = self._state
        if state.last_error is not None and time.monotonic() - state.error_at < _SPAWN_RETRY_S:
            return False
        return (
            len(state.idle) + state.spawning < self.size
            and self._live() < self.max_workers
            and self._memory_total() < self.max_memory_bytes
        )

    # -- background --------------------------------------------------------------------------
    def _spawn(self) -> SandboxWorker:
        worker = SandboxWorker.spawn(self.limits, **self._spawn_kwargs)
        self.isolation = worker.isolation
        return worker

    def _measure_memory(self) -> None:
        """Re-measure the workers whose figure is stale (no lock held while reading /proc)."""
        if not self._measuring.acquire(blocking=False):
            return  # another thread is at it
        try:
            with self._cond:
                live = [*self._state.idle, *self._state.leased]
                stale = [w for w in live if self._stale(w)]
            figures = {}
            for worker in stale:
                taken_at = time.monotonic()  # a call that ends while measuring makes it stale again
                figures[worker] = (worker.memory_bytes(), taken_at)
            with self._cond:
                live = {*self._state.idle, *self._state.leased}
                old = self._state.memory
                self._state.memory = {w: figures.get(w) or old[w] for w in live if w in figures or w in old}
        finally:
            self._measuring.release()

    def _hold_memory_budget(self) -> None:
        self._measure_memory()
        with self._cond:
            while self._memory_total() > self.max_memory_bytes:
                used = self._memory_total() >> 20
                why = f"sandbox memory was over its limit ({used} of {self.max_memory_bytes >> 20} MB)"
                if not self._evict_one(f"{why}, and this session was the least recently used idle one"):
                    break

    def _maintain(self) -> None:
        """Background thread: reap retired workers, keep ``size`` idle ones warm, hold the budget."""
        check_at = time.monotonic() + _MAINTAIN_EVERY_S
        while True:
            with self._cond:
                while not (self._state.closing or self._state.retired or self._wants_spare()):
                    wait = check_at - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(timeout=min(wait, _SPAWN_RETRY_S))
                if self._state.closing:
                    return
                retired = list(self._state.retired)
                self._state.retired.clear()
                spare = self._wants_spare()
                if spare:
                    self._state.spawning += 1
            for worker in retired:
                worker.close_sync()
            if time.monotonic() >= check_at:
                check_at = time.monotonic() + _MAINTAIN_EVERY_S
                if self._state.leased:
                    self._hold_memory_budget()
            if spare:
                self._add_spare()

    def _add_spare(self) -> None:
        try:
            fresh = self._spawn()
        except Exception as exc:  # reported again by acquire() when it has to spawn itself
            with self._cond:
                self._state.spawning -= 1
                self._state.last_error, self._state.error_at = str(exc), time.monotonic()
            return
        with self._cond:
            self._state.spawning -= 1
            if not self._state.closing:
                self._state.idle.append(fresh)
                self._state.last_error = None
                return
        fresh.close_sync()


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
    _clean_up_on_sigterm()
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, limits)
    try:
        return await worker.run(code, stdin=stdin)
    finally:
        await worker.aclose()
