"""Run untrusted Python in confined subprocesses: one-shot runs and warm, stateful workers.

Why a subprocess per sandbox: the model's code may loop forever, exhaust memory, fork,
crash the interpreter or try to reach the network. A separate process that the tool
server can kill at any moment contains all of that; the server only ever sees a
``SandboxResult``.

A worker is ``fork``-ed from a pre-warmed *template* process (``tools.sandbox.zygote``:
one per interpreter, ``python -I tools/sandbox/worker.py --template``, holding the
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
  that another attaches to, holding memory after both are gone. Its own die with it. As
  root the worker also sets its namespace's limits (``worker.IPC_LIMITS``) before it drops
  privileges: ``shm_rmid_forced`` (a SysV segment dies as soon as no process has it attached,
  so every segment is mapped by one of its processes and counted, below), at most
  ``memory_mb`` of segments, 64 of them, 16 message queues, 16 semaphore sets. Reported in
  ``isolation['ipc']`` (a kernel without IPC namespaces leaves the host's).
* **PID namespace** (as root): the template forks every worker as pid 1 of a PID namespace
  of its own (``unshare(CLONE_NEWPID)`` before the fork, its own namespace set back after),
  and the worker mounts a ``/proc`` for it. No host pid exists inside: ``kill(pid, 0)`` and
  ``pidfd_open`` on the server, the template, another session's worker or the host's init
  fail with ESRCH; its parent is pid 0. When the worker dies the kernel kills every process
  left in its namespace. As pid 1 it ignores signals it has no handler for, so its handler
  for SIGXCPU (the per-call CPU limit) is libc's ``_exit`` (exit status 24, read as the CPU
  limit). Reported in ``isolation['pids']``; without root, the host's (weak).
* **filesystem, deny by default**: a private mount namespace whose root is a tmpfs
  (``pivot_root``; the host's tree is detached; the template builds it once per ``hide`` list
  and each worker gets a copy of it with its mount namespace) holding only: read-only binds of ``/usr``,
  ``/bin``, ``/sbin``, ``/lib*``, ``/etc/ld.so.cache``, ``/etc/ld.so.conf*``,
  ``/etc/localtime``, ``/etc/alternatives``, and of the interpreter's own tree (its
  prefixes, executable and the ``sys.path`` entries; an entry inside a ``hide`` directory
  is left out unless it lies in a prefix); a synthetic ``/etc/passwd`` and ``/etc/group``
  (root and the sandbox user); ``/dev/{null,zero,full,random,urandom}`` and ``/dev/fd``;
  a fresh ``/proc`` for its own PID namespace, with ``hidepid=invisible`` (it lists only
  that namespace's processes of its uid, not the server's or other sandboxes'); and,
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
  orphans stay in its tree, and the filter keeps it so). They are found by host pid: since
  every earlier process was killed the same way, the processes left at the end of
  a call were all created during it: only pids handed out since the call began (the last
  pid in the host's ``/proc/loadavg``) are looked at, and all of ``/proc`` when they may have gone
  all the way round (forks counted by ``/proc/stat`` over half of ``pid_max``). Killing
  or evicting a worker kills every process of its uid, and so does a worker dying mid-call
  (timeout, crash), at once. A uid is handed out again only once none of its processes is
  left. A worker's process group is signalled only while its pid cannot have been reused
  (its template has not reaped it, or it still runs); the worker itself only through its
  pidfd.
* **resources**: RLIMIT_AS (memory, per process), RLIMIT_NPROC, RLIMIT_FSIZE (also caps
  captured output), RLIMIT_NOFILE, no core dumps; the wall-clock timeout is enforced by
  the server, which kills the worker. **Memory, per session**: what its whole process tree
  holds stays under ``memory_mb``, as measured from the host (``processes.held``): the
  PSS of the worker and of every process descended from it (less shmem pages), plus, once
  each, every shared memory object one of them maps that no file system shows (SysV
  segments, shared anonymous mappings), at the pages it holds whoever touched them
  (``st_blocks`` through ``/proc/<pid>/map_files``: a page a child filled is in no PSS of
  the worker, and a mapping cut to one page keeps the whole object). The files of its tmpfs
  mounts have their own caps and count to the fleet. Checked every ``MEMORY_CHECK_S``
  (50 ms) while a call runs and once when it returns (an RSS bound, ~40 us; PSS only when
  the bound is over a limit); over it, the worker and its processes are killed and the call
  says so. CPU is bounded three ways: per call (soft
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
  reply is trusted only as that call's displayed output (see
  ``sandbox_frames.parse_reply``): its shape and sizes are checked, stale frames are
  skipped by sequence number (drawn per call under the worker's lock), a malformed one
  kills only its own worker, and every decision (alive, CPU, memory, processes) is taken
  from the kernel: a worker's exit is seen from its pidfd, even while a child of it holds
  the pipe open.
* **fleet** (``SandboxPool``): at most ``max_workers`` live interpreters and
  ``max_total_memory_mb`` of their memory (each session's figure above plus what its tmpfs
  mounts hold), and at most ``max_workers_per_tenant`` interpreters per tenant (3/4 of
  ``max_workers`` by default). A new lease past a limit evicts idle leased workers of its
  own tenant, least recently used first, or fails with ``SandboxOverloaded`` when that
  tenant has none idle: one tenant's sessions never evict another tenant's. Memory over
  the budget (at admission, at a worker's checks during and after its calls, and every 2 s
  in the background) evicts the idle workers of the tenant holding the most memory, then,
  during a call, stops that tenant's busy worker holding the most (its call says so).
  A worker is leased to one session and killed when it is released: never reused.

Known gaps: workers of one template share
what an ``exec`` draws once: the address-space layout (ASLR), the stack canary and the
``str``/``bytes`` hash secret. ``/usr`` is shown whole, so
anything installed under it (a non-editable install of the server's own package in
``/usr/local``, say) is readable. Memory is measured, not enforced by the kernel (that
would take a memory cgroup per worker, which containers rarely delegate): between two
checks (50 ms apart during a call) a call can allocate past its cap, each process only
bound by RLIMIT_AS; the fleet's figure of an idle worker may be up to a second old at
admission. Without root a worker's shared objects count at their mapped length
(``map_files`` needs CAP_SYS_ADMIN) and its IPC limits are not set, so a detached SysV
segment there counts nowhere; and pids stay the host's.
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

This module is the API (and this docstring the reference); the code is split by job into
the modules of ``tools/sandbox/``, listed in docs/security.md, "Where the code is".

Deployment: the strong mode needs root with CAP_SYS_ADMIN in the server's container
(docker: ``cap_add: [SYS_ADMIN]`` and a seccomp/AppArmor profile that allows ``unshare``,
``mount``, ``pivot_root`` and installing seccomp filters). Run the server under an init
(compose ``init: true``) so orphans of killed sandboxes are reaped.
"""

from __future__ import annotations

from dataclasses import replace

import anyio

from tools.sandbox.host import clean_up_on_sigterm, default_hidden_paths
from tools.sandbox.interpreter import SandboxWorker
from tools.sandbox.pool import SandboxPool
from tools.sandbox.processes import processes_of
from tools.sandbox.records import SandboxError, SandboxLimits, SandboxOverloaded, SandboxResult
from tools.sandbox.uids import DEFAULT_UIDS, configure_uids
from tools.sandbox.zygote import WORKER_PATH

__all__ = [
    "UID_RANGE",
    "SandboxError",
    "SandboxLimits",
    "SandboxOverloaded",
    "SandboxPool",
    "SandboxResult",
    "SandboxWorker",
    "configure_uids",
    "default_hidden_paths",
    "run_python",
]

UID_RANGE = DEFAULT_UIDS  # unprivileged uids handed to workers as root (configure_uids: per replica)
# Kept for tests/tools/sandbox/test_sandbox.py, which reads these two from here.
_processes_of = processes_of
_WORKER_PATH = WORKER_PATH


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
    clean_up_on_sigterm()
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, limits)
    try:
        return await worker.run(code, stdin=stdin)
    finally:
        await worker.aclose()
