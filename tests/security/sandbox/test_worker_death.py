"""What a worker leaves behind when it dies, and what killing it may reach.

Holes closed (sandbox review): (1) a worker that died mid-call (timeout, crash, ``os._exit``)
left the processes it had moved into sessions of their own running, as its uid, until the
session was released, and while one of them held the reply pipe open its exit was reported
as a timeout, after the whole timeout; (2) the captured stdout and stderr of a call stayed in the server's
memfds (up to ``max_file_mb`` each, counted by no memory figure) until the next call; (3)
once the template process that forked a worker was gone, an exited worker was reaped by
init and killing it still signalled its old pid's process group: a process that got that pid
(another session's worker, say) was SIGKILLed. Real workers and processes throughout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import anyio
import pytest

import tools.sandbox.zygote as zygote
from tools.sandbox import SandboxLimits, SandboxWorker
from tools.sandbox.processes import processes_of

LIMITS = SandboxLimits(timeout_s=3, memory_mb=256)


async def spawn() -> SandboxWorker:
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, LIMITS)
    if worker.uid is None:
        await worker.aclose()
        pytest.skip("needs root: each worker gets a uid of its own")
    return worker


DETACH = r"""
import os, time
if os.fork() == 0:
    os.setsid()  # out of the worker's process group
    while True:
        time.sleep(0.05)
time.sleep(0.2)
"""


@pytest.mark.parametrize("end", ["os._exit(3)", "while True: pass"], ids=["exit", "timeout"])
async def test_a_worker_that_dies_mid_call_leaves_nothing_running(end: str) -> None:
    worker = await spawn()
    try:
        result = await worker.run(DETACH + end)
        assert result.worker_died, result
        assert processes_of(worker.uid) == []  # at once, not when the session is released
    finally:
        await worker.aclose()


async def test_a_worker_that_exits_mid_call_is_reported_so_even_while_a_child_holds_its_pipe() -> None:
    """Its children inherit the reply pipe, so EOF never comes: the exit itself must be seen."""
    worker = await spawn()
    try:
        result = await worker.run(DETACH + "os._exit(3)")
        assert result.worker_died and not result.timed_out, result
        assert result.exit_code == 3 and "exited with status 3" in (result.error or ""), result
    finally:
        await worker.aclose()


async def test_a_calls_output_is_not_kept_after_the_call() -> None:
    worker = await spawn()
    try:
        result = await worker.run("import sys\nprint('x' * (4 << 20))\nsys.stderr.write('y' * (4 << 20))")
        assert result.truncated and result.stdout.startswith("xxx") and result.stderr.startswith("yyy")
        held = [os.fstat(fd).st_size for fd in (worker._out_fd, worker._err_fd)]
        assert held == [0, 0]
        again = await worker.run("print('next')")
        assert again.stdout == "next\n" and not again.truncated
    finally:
        await worker.aclose()


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _take_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A process leading a session (and process group) of its own, with pid ``pid`` if we get it."""
    for _ in range(50):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
                fh.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


async def test_killing_a_worker_whose_template_died_spares_a_process_that_reused_its_pid() -> None:
    worker = await spawn()
    pid = worker.proc.pid
    innocent = None
    try:
        template = zygote.template_for(sys.executable)
        template_pid = template.pid
        assert template_pid is not None
        os.kill(template_pid, signal.SIGKILL)  # the worker is re-parented to init
        while template.pid is not None:
            await anyio.sleep(0.01)
        os.kill(pid, signal.SIGKILL)  # it dies outside any call (an OOM kill, say)
        if not _gone(pid, 5):
            pytest.skip("no init reaps orphans here, so a worker's pid is never reused")
        innocent = _take_pid(pid)
        if innocent is None:
            pytest.skip("could not get that pid again (ns_last_pid refused, or a busy host)")
        worker.kill()
        await worker.aclose()
        await anyio.sleep(0.05)
        assert innocent.poll() is None, "the process that reused the worker's pid was killed"
    finally:
        await worker.aclose()
        if innocent is not None:
            with contextlib.suppress(ProcessLookupError):
                innocent.kill()
            innocent.wait()
