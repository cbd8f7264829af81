"""The server's side of every sandbox at once: host directories, and nothing left at exit.

Per-worker host directories live in one ``toolfactory-sandbox-*`` directory under the
server's temp dir. At exit, and on SIGTERM where nothing else handles the signal, every live
worker and every process of its uid is killed, the template processes are stopped and that
directory is removed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from typing import Protocol

from tools.sandbox.processes import kill_uid
from tools.sandbox.zygote import stop_templates

__all__ = ["HOSTDIRS", "LIVE", "HostDirs", "clean_up_on_sigterm", "default_hidden_paths"]


class Killable(Protocol):
    """What the exit hook asks of a live worker (``interpreter.SandboxWorker``)."""

    uid: int | None

    def kill(self) -> None: ...


LIVE: weakref.WeakSet[Killable] = weakref.WeakSet()


class HostDirs:
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
            _remove_tree(root)

    @property
    def root(self) -> str | None:
        return self._root

    def remove_all(self) -> None:
        with self._lock:
            self._remove_root()


HOSTDIRS = HostDirs()


def _remove_tree(path: str, tries: int = 100) -> None:
    """``rmtree``, retried for up to ~5 s: the last processes of a worker just killed (the
    kernel ends what is left in its PID namespace after the worker itself) may still be
    writing there, and one pass then leaves a directory behind."""
    for _ in range(tries):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.05)


@atexit.register
def _kill_all_workers() -> None:
    for worker in list(LIVE):
        worker.kill()
        if worker.uid is not None:
            kill_uid(worker.uid)
    stop_templates()
    HOSTDIRS.remove_all()


def _on_sigterm(signum: int, frame: object) -> None:
    _kill_all_workers()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of SIGTERM as before, just without leftovers


def clean_up_on_sigterm() -> None:
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
