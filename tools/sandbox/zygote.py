"""The sandbox template process (a zygote), from the server's side: start it, fork workers from it.

Starting a worker used to mean a fresh interpreter per session (exec, imports, then
confinement: ~18 ms and ~7 MB of private memory each). Now one *template* per interpreter
path (``python -I worker.py --template STAGE``) imports the worker's modules and a fixed
list of standard modules once, and every worker is ``fork``-ed from it: the interpreter and
those modules are shared copy-on-write, and the child only does its own confinement. As
root the template also prepares the read-only root once (in its own mount namespace, on a
tmpfs mounted on an empty directory made here, ``$TMPDIR/toolfactory-template-*``) and keeps
spare children that have entered their namespaces and that root before any session exists;
a fork request is handed to one of them when it is ready (``docs/security.md``).

The server talks to a template over a ``SOCK_SEQPACKET`` socket (its fd 0), one request at a
time: ``fork`` (a config and the worker's four fds, passed with SCM_RIGHTS; the answer carries
a pidfd of the new worker) and ``reap`` (the exit status of a worker that has exited). The
template reaps a worker only when asked, so the worker's pid, and its process group, stay
taken until the server is done with it, and signals go through the pidfd. A template that
died or stopped answering (``_REPLY_TIMEOUT_S``) is killed and started afresh by the next
fork; workers forked before keep running (their pipes lead to the server, not the template),
only their exit status is then unknown. When its socket hangs up (the server is gone, even
killed outright) the template kills every worker it forked and exits; the workers of a
replaced template are then left to the server's own exit handlers.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
from typing import Any

__all__ = ["ForkedProcess", "Template", "TemplateError", "TemplateLost", "stop_templates", "template_for"]

WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
# The template's environment, which every worker inherits: nothing of the server's.
TEMPLATE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_START_TIMEOUT_S = 20.0  # interpreter start and imports
_REPLY_TIMEOUT_S = 10.0  # a fork or reap takes about a millisecond; past this the template is replaced
_MAX_REPLY = 1 << 16
_RUNNING, _LOST = "running", "lost"  # what reap says besides an exit code


class TemplateError(RuntimeError):
    """The template could not be started or refused a request (the message says why)."""


class TemplateLost(TemplateError):
    """The template died or stopped answering mid-request; the next request starts a new one."""


class ForkedProcess:
    """A worker forked by a template, as the server sees it (the part of ``Popen`` it uses).

    ``exited`` asks the kernel only (the pidfd); ``poll`` and ``wait`` also fetch the exit
    status from the template, which reaps the worker then.
    """

    def __init__(self, pid: int, pidfd: int, template: Template, generation: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.status_lost = False  # the template that forked it is gone, and its exit status with it
        self._pidfd = pidfd
        self._template = template
        self._generation = generation

    @property
    def pidfd(self) -> int:
        """The pidfd (readable once the worker has exited), or -1 once closed."""
        return self._pidfd

    def exited(self) -> bool:
        if self.returncode is not None:
            return True
        return self._pidfd < 0 or _readable(self._pidfd, 0)

    def poll(self) -> int | None:
        """The exit code (``-signal`` when killed), None while it runs. Blocks at most briefly."""
        if self.returncode is None and self.exited():
            status = self._template.reap(self.pid, self._generation)
            if isinstance(status, int):
                self.returncode = status
            elif status == _LOST:
                self.returncode, self.status_lost = -signal.SIGKILL, True
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for it to exit; its exit code, or None if it still runs."""
        if self._pidfd >= 0 and self.returncode is None:
            _readable(self._pidfd, timeout)
        return self.poll()

    def send_signal(self, sig: int) -> None:
        """Signal the worker itself (through the pidfd: never another process that got its pid)."""
        if self._pidfd >= 0 and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def kill_group(self) -> None:
        """SIGKILL its process group (the worker calls ``setsid``: the group's id is its pid).

        Only while that id cannot belong to anyone else: the template that forked it still
        runs and has not reaped it, or it still runs itself. Once its template is gone, an
        exited worker is reaped by init and its pid, a process group id, can be handed out
        again, to another session's worker for one.
        """
        if self.returncode is None and (self._template.holds(self._generation) or not self.exited()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Reap it if it has exited, and drop the pidfd (after this only ``returncode`` is known)."""
        if self.poll() is None and self._pidfd >= 0:  # it still runs: the template reaps it when it exits
            self._template.reap(self.pid, self._generation, later=True)
            self.returncode, self.status_lost = -signal.SIGKILL, True
        fd, self._pidfd = self._pidfd, -1
        if fd >= 0:
            os.close(fd)


def _readable(fd: int, timeout_s: float) -> bool:
    """A pidfd turns readable when its process exits (poll, not select: fds may be past 1024)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


class Template:
    """One template process for one interpreter; forks workers on request, restarted when lost."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.network = ""  # where the template itself is, as it reported
        self.generation = 0  # counts starts: a worker knows which template is its parent
        self._lock = threading.Lock()  # one request at a time on the socket
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._stage: str | None = None  # an empty directory on the host; the template mounts on it

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def holds(self, generation: int) -> bool:
        """The template of that start still runs (its workers' exit statuses can still be had)."""
        return generation == self.generation and self.pid is not None

    def fork(self, config: dict[str, Any], fds: list[int]) -> ForkedProcess:
        """A new worker with ``config`` and ``fds`` (control in, control out, stdout, stderr).

        Raises :class:`TemplateLost` when the template died or hung on the way (it is replaced
        on the next call; the caller retries with fresh fds), :class:`TemplateError` otherwise.
        """
        with self._lock:
            if self.pid is None:
                self._start()
            reply, got = self._ask({"op": "fork", "config": config}, fds)
            if "pid" not in reply or len(got) != 1:
                for fd in got:
                    os.close(fd)
                raise TemplateError(f"the sandbox template refused to fork: {reply.get('error', reply)}")
            return ForkedProcess(int(reply["pid"]), got[0], self, self.generation)

    def reap(self, pid: int, generation: int, *, later: bool = False) -> int | str:
        """Exit code of an exited worker of template ``generation``, ``"running"``, or ``"lost"``
        (the template that forked it is gone, or has reaped it already).

        ``later``: the server stops waiting for a worker that still runs; the template reaps it
        once it has exited.
        """
        with self._lock:
            if not self.holds(generation):
                return _LOST
            try:
                reply, got = self._ask({"op": "reap", "pid": pid, "later": later})
            except TemplateLost:
                return _LOST
            for fd in got:
                os.close(fd)
            if reply.get("running"):
                return _RUNNING
            status = reply.get("status")
            return status if isinstance(status, int) else _LOST

    def stop(self) -> None:
        """Kill the template (its workers run on: they belong to their sessions).

        Killed before its socket closes: a template that reads the hang-up takes its server for
        dead and kills every worker it forked."""
        proc, sock, self._proc, self._sock = self._proc, self._sock, None, None
        stage, self._stage = self._stage, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        if sock is not None:
            sock.close()
        if stage is not None:
            with contextlib.suppress(OSError):
                os.rmdir(stage)  # mounted on only inside the template's namespace, gone with it

    # -- callers hold self._lock -------------------------------------------------------------
    def _start(self) -> None:
        self.stop()
        self._stage = tempfile.mkdtemp(prefix="toolfactory-template-")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [self.python, "-I", WORKER_PATH, "--template", self._stage],
                stdin=theirs,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd="/",
                env=TEMPLATE_ENV,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise TemplateError(f"cannot start the sandbox template with {self.python}: {exc}") from None
        finally:
            theirs.close()
        assert proc.stderr is not None
        self._proc, self._sock = proc, ours
        self.generation += 1
        ours.settimeout(_START_TIMEOUT_S)
        try:
            ready = json.loads(ours.recv(_MAX_REPLY) or b"null")
        except (OSError, ValueError):
            ready = None
        if not isinstance(ready, dict) or not ready.get("ready"):
            reason = ready.get("error") if isinstance(ready, dict) else None
            self.stop()
            if reason is None:
                reason = proc.stderr.read().decode(errors="replace").strip()[-2000:] or "no reply"
            proc.stderr.close()
            raise TemplateError(f"the sandbox template did not start: {reason}")
        proc.stderr.close()
        ours.settimeout(_REPLY_TIMEOUT_S)
        self.network = str(ready.get("network", ""))

    def _ask(self, request: dict[str, Any], fds: list[int] | None = None) -> tuple[dict[str, Any], list[int]]:
        sock = self._sock
        if sock is None:
            raise TemplateLost("the sandbox template is not running")
        try:
            socket.send_fds(sock, [json.dumps(request).encode()], fds or [])
            data, got, flags, _ = socket.recv_fds(sock, _MAX_REPLY, 1)
        except OSError as exc:  # EPIPE, ECONNRESET, or no answer within _REPLY_TIMEOUT_S
            self.stop()
            raise TemplateLost(
                f"the sandbox template stopped answering ({exc or type(exc).__name__})"
            ) from None
        if not data:
            self.stop()
            raise TemplateLost("the sandbox template exited")
        try:
            reply = json.loads(data)
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or flags & socket.MSG_CTRUNC:
            for fd in got:
                os.close(fd)
            self.stop()
            raise TemplateLost("the sandbox template sent a malformed answer")
        return reply, got


_TEMPLATES: dict[str, Template] = {}
_TEMPLATES_LOCK = threading.Lock()


def template_for(python: str) -> Template:
    """The one template of this process for interpreter ``python`` (started on its first fork)."""
    with _TEMPLATES_LOCK:
        template = _TEMPLATES.get(python)
        if template is None:
            template = _TEMPLATES[python] = Template(python)
        return template


def stop_templates() -> None:
    """Kill every template (at exit; a later fork would start a new one)."""
    with _TEMPLATES_LOCK:
        templates = list(_TEMPLATES.values())
    for template in templates:
        template.stop()
