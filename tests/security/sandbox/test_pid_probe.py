"""From inside the sandbox, no host process can be probed by its pid.

Hole closed (issue 30, point 3): workers shared the host's PID namespace, so
``pidfd_open`` succeeded and ``kill(pid, 0)`` answered EPERM (not ESRCH) for the tool
server, the template, other sessions' workers and init: code could map which processes
run, and when. Now each worker is pid 1 of a PID namespace of its own: no host pid exists
inside. Real confined workers throughout.
"""

from __future__ import annotations

import ast
import os
import sys

import anyio
import pytest

from tools.sandbox import SandboxLimits, SandboxWorker
from tools.sandbox.processes import processes_of
from tools.sandbox.zygote import template_for

LIMITS = SandboxLimits(timeout_s=30)

PROBE = r"""
import errno, os
def probe(pid):
    found = []
    try:
        os.kill(pid, 0)
        found.append("signal")
    except OSError as exc:
        found.append(errno.errorcode[exc.errno])
    try:
        os.close(os.pidfd_open(pid))
        found.append("pidfd")
    except OSError as exc:
        found.append(errno.errorcode[exc.errno])
    return found
{pid: probe(pid) for pid in PIDS}, os.getpid(), os.getppid()
"""


async def spawn() -> SandboxWorker:
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, LIMITS)
    if "root" not in worker.isolation:
        await worker.aclose()
        pytest.skip("needs the strong mode (root, namespaces)")
    return worker


async def test_host_pids_do_not_exist_inside_a_worker() -> None:
    bystander, prober = await spawn(), await spawn()
    try:
        template = template_for(sys.executable).pid
        assert template is not None
        host = {"server": os.getpid(), "template": template, "other session": bystander.proc.pid}
        result = await prober.run(PROBE.replace("PIDS", repr(sorted(host.values()))))
        assert result.error is None, result
        found, pid, ppid = ast.literal_eval(result.value or "")
        for name, number in host.items():
            assert found[number] == ["ESRCH", "ESRCH"], (name, found)
        assert (pid, ppid) == (1, 0)  # pid 1 is the worker itself: the host's init is not there
        assert prober.isolation["pids"].startswith("own PID namespace"), prober.isolation
        assert (await bystander.run("6 * 7")).value == "42"  # probed, untouched
    finally:
        await bystander.aclose()
        await prober.aclose()


async def test_a_worker_as_pid_1_still_dies_of_its_cpu_limit_and_takes_its_children() -> None:
    """Pid 1 ignores signals it has no handler for, SIGXCPU included: the worker's own handler
    (libc's _exit) keeps the per-call CPU limit; and when it dies, so does its namespace."""
    worker = await spawn()
    try:
        result = await worker.run(
            "import os, time\nif os.fork() == 0:\n    time.sleep(600)\nwhile True:\n    pass", cpu_s=1
        )
        assert (
            result.worker_died
            and result.error == "CPU time limit of 1 s exceeded; the interpreter was killed"
        )
        assert worker.uid is not None
        with anyio.fail_after(30):
            while processes_of(worker.uid):  # the sleeping child died with its namespace's pid 1
                await anyio.sleep(0.05)
    finally:
        await worker.aclose()
