"""``SandboxWorker``: one confined interpreter, as the server starts, calls, accounts and kills it.

The reference for what a worker guarantees is ``tools.sandbox``'s docstring; the worker's
own side (confinement, requests) is ``tools/sandbox/worker.py``, forked from the template
(``tools.sandbox.zygote``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import sys
import threading
import time
from typing import Any, Protocol

import anyio

from tools.sandbox.frames import HEADER, encode, parse_reply, read_frame
from tools.sandbox.host import HOSTDIRS, LIVE, default_hidden_paths
from tools.sandbox.processes import (
    Clock,
    cpu_seconds,
    forks,
    held,
    kill_strays,
    kill_uid,
    last_pid,
    pid_clock,
    started_none,
)
from tools.sandbox.records import SandboxError, SandboxLimits, SandboxResult
from tools.sandbox.uids import UIDS
from tools.sandbox.zygote import ForkedProcess, TemplateError, TemplateLost, template_for

__all__ = ["MAX_REQUEST_BYTES", "MEMORY_CHECK_S", "Fleet", "SandboxWorker"]

MAX_REQUEST_BYTES = 8 << 20  # code and stdin of one call, JSON-encoded
# While a call runs, what its process tree holds is checked this often (an RSS bound, ~40 us
# for a worker alone; PSS only when the bound is over a limit), and once more when it returns.
MEMORY_CHECK_S = 0.05
_SESSION_TMPFS = ("tmp", "var/tmp", "dev/shm")  # under /proc/<pid>/root: counted as files


class Fleet(Protocol):
    """What a worker asks of the pool that leased it (``pool.SandboxPool``) about its memory."""

    def might_exceed(self, worker: SandboxWorker, bound: int) -> bool:
        """Whether the fleet could be over its budget if the worker held ``bound`` bytes."""
        ...

    def update(self, worker: SandboxWorker, figure: int, *, running: bool) -> None:
        """Take the worker's measured figure; while over budget evict idle workers and, if its
        call is ``running``, stop busy ones (``stop_for``)."""
        ...


class _WorkerGone(Exception):
    pass


class _StartLost(SandboxError):
    """The forked worker died before it reported ready: no session code had run in it."""


def _describe_exit(returncode: int, cpu_s: int, *, lost: bool = False) -> str:
    if lost:
        return "the interpreter stopped (its exit status was lost with the template process that forked it)"
    # Killed by SIGXCPU, or exited with its number: as pid 1 of its PID namespace the worker's
    # handler for it is _exit (worker.cpu_limit_for_init; so os._exit(24) reads the same).
    if abs(returncode) == signal.SIGXCPU:
        return f"CPU time limit of {cpu_s} s exceeded; the interpreter was killed"
    if returncode < 0:
        sig = -returncode
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
        self._forks_seen = forks()  # host-wide fork count when it was last checked (see _settle)
        self.calls = 0
        self.last_used = time.monotonic()
        self.evicted: str | None = None  # why the pool evicted it, if it did
        self.stopped_for: str | None = None  # why the server killed it mid-call (memory)
        self.fleet: Fleet | None = None  # the pool's memory budget, once leased from one
        self._tmpfs: set[int] | None = None  # its tmpfs mounts' devices (their files count apart)
        self._files = 0  # what its tmpfs mounts held when last measured
        LIVE.add(self)

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
            except _StartLost as exc:  # e.g. a spare killed as it was handed out: fork afresh
                if attempt:
                    raise SandboxError(
                        f"{exc}; tried twice, and no session code had run in either interpreter"
                    ) from None
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
        uid = UIDS.acquire() if os.geteuid() == 0 else None
        hostdir = None
        made: list[int] = []  # every fd made here: the ones the worker keeps are closed on failure
        proc = None
        try:
            hostdir = HOSTDIRS.new()
            made += os.pipe()
            made += os.pipe()
            made += (os.memfd_create("sandbox-stdout"),)
            made += (os.memfd_create("sandbox-stderr"),)
            ctl_in, to_worker, from_worker, ctl_out, out_fd, err_fd = made
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
            try:  # the worker's fds, in the order it expects them
                proc = template_for(python).fork(config, [ctl_in, ctl_out, out_fd, err_fd])
            except TemplateLost:
                raise
            except TemplateError as exc:
                raise SandboxError(f"the sandbox worker failed to start: {exc}") from None
            for fd in (ctl_in, ctl_out):
                made.remove(fd)
                os.close(fd)  # the worker has them; EOF on from_worker now means it is gone
            ready = read_frame(from_worker, startup_timeout_s)
            if not ready or not ready.get("ready"):
                reason = ready.get("error") if ready else None
                if reason is None:  # it died (or hung) before its first line of confinement reported
                    proc.kill()
                    code = proc.wait(5)
                    reason = "no reply" + ("" if code is None else f" (exit status {code})")
                    raise _StartLost(f"the sandbox worker failed to start: {reason}")
                raise SandboxError(f"the sandbox worker failed to start: {reason}")
            isolation = {"start": "forked from the pre-warmed template process", **ready["isolation"]}
            return cls(proc, limits, uid, hostdir, (to_worker, from_worker, out_fd, err_fd), isolation)
        except BaseException as exc:
            for fd in made:  # first: out of fds, the steps below need some back
                with contextlib.suppress(OSError):
                    os.close(fd)
            if proc is not None:
                _terminate(proc, None)
                proc.wait(5)
                proc.close()
            # The uid is swept even without a process: a template lost mid-request may have
            # forked the worker before it died.
            if uid is not None and kill_uid(uid):
                UIDS.release(uid)
            if hostdir is not None:
                HOSTDIRS.drop(hostdir)
            if isinstance(exc, OSError):  # out of fds, memory or disk: the caller sees a SandboxError
                raise SandboxError(f"the sandbox worker failed to start: {exc}") from exc
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

    def stop_for(self, reason: str) -> None:
        """Kill it now, busy or not; a call in flight reports ``reason``."""
        with self._state_lock:
            if self.stopped_for is None and self.evicted is None:
                self.stopped_for = reason
        self.kill()

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
        uid_free = self.uid is None or kill_uid(self.uid)
        self.proc.wait(5)
        self.proc.close()
        for fd in (self._wfd, self._rfd, self._out_fd, self._err_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        HOSTDIRS.drop(self._hostdir)
        if self.uid is not None and uid_free:  # else it stays taken: never two sandboxes on one uid
            UIDS.release(self.uid)
        LIVE.discard(self)

    async def aclose(self) -> None:
        """Kill the worker now; wait for any call in flight to notice, then free its resources.

        Shielded: it is called from ``finally`` blocks of cancelled calls, where an unshielded
        wait would give up at once and leave its fds, uid and directory behind for good.
        """
        self.kill()
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await anyio.to_thread.run_sync(self.close_sync)

    # -- accounting ----------------------------------------------------------------------
    @property
    def cpu_used_s(self) -> float:
        """CPU used by the worker and every process it started, as far as the kernel shows it."""
        return cpu_seconds(self.proc.pid) + self._killed_cpu_s

    def memory_bytes(self) -> int:
        """What it holds now, as measured from the host (blocking: run it in a thread): the PSS
        of its whole process tree and, once each, the shared memory objects those processes map
        (SysV segments, shared anonymous memory: their pages, whoever touched them; ``held``),
        plus the files in its private tmpfs mounts."""
        files = self._tmpfs_bytes()
        self._files = files
        return self._held(True) + files

    def _tmpfs_devs(self) -> set[int]:
        """The devices of its tmpfs mounts, whose files count as files (found once)."""
        if self._tmpfs is None:
            devs = set()
            if "root" in self.isolation:  # without a new root, /tmp is the host's
                for path in _SESSION_TMPFS:
                    with contextlib.suppress(OSError):
                        devs.add(os.stat(f"/proc/{self.proc.pid}/root/{path}").st_dev)
            self._tmpfs = devs
        return self._tmpfs

    def _tmpfs_bytes(self) -> int:
        total = 0
        if "root" in self.isolation:
            for path in _SESSION_TMPFS:
                with contextlib.suppress(OSError):
                    st = os.statvfs(f"/proc/{self.proc.pid}/root/{path}")
                    total += (st.f_blocks - st.f_bfree) * st.f_frsize
        return total

    def _held(self, precise: bool, alone: bool = False) -> int:
        """Its process tree's memory and shared memory objects, without its tmpfs files."""
        return held(self.proc.pid, self._tmpfs_devs(), precise=precise, alone=alone)

    async def _check_memory(self, *, running: bool) -> str | None:
        """Hold the session's cap (``memory_mb`` for its processes and shared memory together)
        and report to the fleet: why it must stop, or None. The RSS bound is read right here
        (tens of microseconds: a thread hop would cost more); PSS, when that bound is over a
        limit, in a thread. ``running``: its call still runs (else it has returned, and an
        idle worker over the fleet's budget is evicted, not stopped, as any idle one)."""
        cap = self.limits.memory_mb << 20
        fleet = self.fleet
        alone = not running  # after a call: its strays were killed
        try:
            bound = self._held(False, alone)
        except OSError:
            return None  # it is gone: the caller sees that
        # Its files as last measured (the pool re-measures them within seconds): statvfs x3
        # would add a third to this check, and the tmpfs mounts have caps of their own.
        if bound <= cap and (fleet is None or not fleet.might_exceed(self, bound + self._files)):
            return None
        figure = await anyio.to_thread.run_sync(self._held, True, alone)
        if figure > cap:
            return (
                f"the interpreter and the processes it started held {figure >> 20} MB, over its memory "
                f"limit of {self.limits.memory_mb} MB (shared memory included); it was killed"
            )
        if fleet is not None:
            self._files = await anyio.to_thread.run_sync(self._tmpfs_bytes)
            fleet.update(self, figure + self._files, running=running)  # may stop this worker, or another
        return self.stopped_for

    def _kill_strays(self, start: Clock) -> bool:
        """Kill what the call left running, adding its CPU to the worker's account; False if
        it never ran dry (then the worker and its uid are killed too)."""
        dry, cpu_s = kill_strays(start, self.proc.pid, self.uid)
        self._killed_cpu_s += cpu_s
        if not dry:
            self.kill()
            if self.uid is not None:
                kill_uid(self.uid)
        return dry

    async def _settle(self, start: Clock) -> str | None:
        """After a call: freeze the worker, kill what it left running, check its CPU budget."""
        self.proc.send_signal(signal.SIGSTOP)  # threads it left running stop too
        now = pid_clock()
        self._forks_seen = now[1]
        quiet = started_none(start, now, self.proc.pid, self.uid)
        if not quiet and not await anyio.to_thread.run_sync(self._kill_strays, start):
            return "the processes it started could not all be stopped; the interpreter was killed"
        over = await self._check_memory(running=False)  # the worker alone now, and what it maps
        if over:
            self.kill()
            return over
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
        }
        if len(encode(request)) > HEADER + MAX_REQUEST_BYTES:
            return SandboxResult(error=f"code and stdin exceed {MAX_REQUEST_BYTES >> 20} MB", exit_code=1)
        async with self._lock:
            with self._state_lock:
                if not self.alive:
                    why = f"the interpreter was evicted: {self.evicted}" if self.evicted else self.stopped_for
                    return SandboxResult(
                        error=why or "the interpreter is no longer running", exit_code=-1, worker_died=True
                    )
                self._busy = True
            try:
                return await self._call(request, timeout_s, cap)
            finally:
                with self._state_lock:
                    self._busy = False
                    self.last_used = time.monotonic()

    async def _call(self, request: dict[str, Any], timeout_s: float, cap: int) -> SandboxResult:
        self._clear_output()  # what a preloaded module printed while the worker started
        self.calls += 1
        self._seq += 1  # drawn under the lock: calls queued together get numbers of their own
        frame = encode({**request, "seq": self._seq})
        # The fork count of the last check, not of now: one /proc/stat read per call, and the
        # wrap-around test only gets more cautious (more forks seem to fall in the call).
        start_clock = (last_pid(), self._forks_seen)
        self.proc.send_signal(signal.SIGCONT)  # through the pidfd: never a recycled pid
        start = time.perf_counter()
        reply: dict[str, Any] | None = None
        problem: str | None = None
        try:
            with anyio.move_on_after(timeout_s) as scope:
                await self._write(frame)
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
                await anyio.to_thread.run_sync(kill_uid, self.uid)
            returncode = await self._wait_exit()
        stdout, stderr, truncated = self._read_output(cap)
        self._clear_output()  # up to max_file_mb each, which no memory figure counts
        if timed_out:
            return SandboxResult(
                stdout, stderr, -signal.SIGKILL, True, truncated,
                f"timed out after {timeout_s:g} s; the interpreter was killed", elapsed_ms, worker_died=True,
            )  # fmt: skip
        if reply is None or problem:
            why = (
                problem
                or self.stopped_for
                or _describe_exit(returncode, request["cpu_s"], lost=self.proc.status_lost)
            )
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
                if self.proc.exited():  # a child of it may hold the pipe open: EOF may never come
                    raise _WorkerGone from None
                await self._readable_or_exited()
                continue
            if not chunk:
                raise _WorkerGone
            buf += chunk
        return bytes(buf)

    async def _readable_or_exited(self) -> None:
        """Until the reply pipe has data or the worker has exited (one epoll of both, one wait);
        every ``MEMORY_CHECK_S`` meanwhile, what its process tree holds is checked."""
        pidfd = self.proc.pidfd
        if pidfd < 0:
            await anyio.wait_readable(self._rfd)
            return
        with select.epoll(2) as either:
            either.register(self._rfd, select.EPOLLIN)
            either.register(pidfd, select.EPOLLIN)
            while True:
                with anyio.move_on_after(MEMORY_CHECK_S):
                    await anyio.wait_readable(either.fileno())
                    return
                over = await self._check_memory(running=True)
                if over:
                    self.stop_for(over)
                    return

    async def _read_reply(self, seq: int, cap: int) -> dict[str, Any]:
        """The reply to call ``seq``. Frames of earlier calls are skipped: after a forged frame
        ended a call early, the genuine reply of that call arrives during the next one."""
        while True:
            size = int.from_bytes(await self._read_exact(HEADER), "big")
            if size > 32 * cap + (1 << 20):  # value and error, each up to cap chars JSON-escaped
                raise _WorkerGone(
                    "the interpreter sent an oversized reply (its control channel was tampered with)"
                )
            reply = parse_reply(await self._read_exact(size), cap)
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
        kill_uid(uid)
