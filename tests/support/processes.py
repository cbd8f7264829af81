"""Start a process and wait until it is ready: a line of its output matches, or a probe passes.

One helper for every test that runs a real server (the tool server, nginx, the demo's
server): the output is collected by a thread as it comes (a chatty process never blocks on
a full pipe), a process that exits or stays silent past the deadline fails the test with
everything it printed, and the process is stopped (SIGTERM, then SIGKILL) on the way out.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = ["RunningProcess", "kill_group", "started", "with_default_sigint"]

# A test runner started in the background (a non-interactive shell's `&`, as CI and scripts
# do) ignores SIGINT, and its children inherit that: Ctrl-C would never reach them.
_DEFAULT_SIGINT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"


def with_default_sigint(cmd: Sequence[str]) -> list[str]:
    """``cmd`` exec'd with SIGINT back at its default, as a terminal's Ctrl-C finds it: for the
    tests that send SIGINT (``cmd[0]`` must be a path, e.g. ``sys.executable``)."""
    return [sys.executable, "-c", _DEFAULT_SIGINT, *cmd]


class RunningProcess:
    """A started process, its output so far, and the match of its ready line (if one was asked)."""

    def __init__(self, proc: subprocess.Popen[str], log: list[str]) -> None:
        self.proc = proc
        self.log = log
        self.match: re.Match[str] | None = None
        self.reader: threading.Thread | None = None

    def wait(self, timeout_s: float) -> int:
        """Wait for the process to exit and for its last output to be read; its exit code."""
        code = self.proc.wait(timeout_s)
        if self.reader is not None:
            self.reader.join(timeout_s)
        return code

    @property
    def output(self) -> str:
        return "".join(self.log)


def kill_group(child: subprocess.Popen[str]) -> None:
    """Kill ``child`` and every process of its session (``start_new_session=True``): what a
    run leaves behind (Ray's daemons, vLLM's engine) goes with it."""
    if child.poll() is None:
        child.kill()
        child.wait(30)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)


@contextlib.contextmanager
def started(
    cmd: Sequence[str],
    *,
    ready_line: str | None = None,
    probe: Callable[[], bool] | None = None,
    timeout_s: float = 120.0,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    stop_timeout_s: float = 15.0,
) -> Iterator[RunningProcess]:
    """Run ``cmd`` (stdout and stderr merged) until it is ready, yield it, then stop it.

    Ready means: a line matches the regex ``ready_line`` (its match is kept as ``.match``),
    then ``probe()`` returns true (polled); either may be left out. RuntimeError, with the
    output, when the process exits first or ``timeout_s`` passes.
    """
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    running = RunningProcess(proc, [])
    pattern = re.compile(ready_line) if ready_line is not None else None
    line_seen = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            running.log.append(line)
            if pattern is not None and running.match is None and (match := pattern.search(line)):
                running.match = match
                line_seen.set()
        line_seen.set()  # the output ended: the process is gone

    running.reader = threading.Thread(target=pump, daemon=True)
    running.reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        if pattern is not None:
            line_seen.wait(timeout_s)
            if running.match is None:
                raise RuntimeError(
                    f"{cmd[0]} did not print a line matching {ready_line!r}:\n{running.output}"
                )
        while probe is not None and not probe():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{cmd[0]} did not become ready (exit code {proc.poll()}):\n{running.output}"
                )
            time.sleep(0.05)
        yield running
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
