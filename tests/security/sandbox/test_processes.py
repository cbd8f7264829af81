"""Nothing of a sandbox runs between its calls, and its CPU over its life is bounded.

Hole closed (security campaign, point 7): 14 background CPU burners forked in one call kept
running between calls until the session was deleted, and RLIMIT_CPU (per process) did not
bound what a session's children used together. Real confined workers throughout.
"""

from __future__ import annotations

import ast
import os
import time
from collections.abc import AsyncIterator

import anyio
import pytest

from tools.sandbox import SandboxLimits, SandboxWorker
from tools.sandbox.processes import processes_of

LIMITS = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=256)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (read on the host)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def spawn(limits: SandboxLimits = LIMITS) -> SandboxWorker:
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, limits)
    if worker.uid is None:
        await worker.aclose()
        pytest.skip("needs root: each worker gets a uid of its own")
    return worker


@pytest.fixture
async def worker() -> AsyncIterator[SandboxWorker]:
    worker = await spawn()
    yield worker
    await worker.aclose()


BACKGROUND = r"""
import os, subprocess, sys, threading
pids = []
for _ in range(6):  # forked busy loops
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    pids.append(pid)
for _ in range(3):  # interpreters in sessions of their own
    pids.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True).pid)
if os.fork() == 0:  # a daemon: double fork, its parent exits at once
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
    os._exit(0)
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()  # a busy thread in the worker itself
pids
"""


async def test_background_processes_and_threads_do_not_run_after_the_call(worker: SandboxWorker) -> None:
    first = await worker.run(BACKGROUND)
    assert first.error is None and first.value is not None, first
    assert worker.uid is not None
    assert processes_of(worker.uid) == [worker.proc.pid]  # every child, detached or not, is gone
    before = cpu_seconds(worker.proc.pid)
    await anyio.sleep(1.0)
    assert cpu_seconds(worker.proc.pid) - before < 0.05  # the busy thread does not run either
    pids = ast.literal_eval(first.value)
    after = await worker.run(f"import os\n[os.path.exists(f'/proc/{{p}}') for p in {pids!r}], 6 * 7")
    assert after.value == f"({[False] * len(pids)!r}, 42)", after
    assert processes_of(worker.uid) == [worker.proc.pid]


async def test_a_fork_chain_started_in_a_call_is_killed_when_it_returns(worker: SandboxWorker) -> None:
    """Each process forks its successor and exits: the chain keeps moving to new pids."""
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    while True:\n"
        "        if os.fork():\n"
        "            os._exit(0)\n"
        "        time.sleep(0.02)\n"
        "time.sleep(0.2)\n'returned'"
    )
    assert (await worker.run(code)).value == "'returned'"
    assert worker.uid is not None
    for _ in range(5):
        assert processes_of(worker.uid) == [worker.proc.pid]
        time.sleep(0.05)
    assert (await worker.run("1 + 1")).value == "2"


async def test_cpu_of_the_processes_it_starts_counts_against_its_lifetime_budget() -> None:
    """Two children burn 2 s of CPU each and are left running; the worker's budget is 3 s."""
    worker = await spawn(SandboxLimits(timeout_s=30, cpu_s=10, worker_cpu_s=3, memory_mb=256))
    code = (
        "import os, time\n"
        "r, w = os.pipe()\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        while time.process_time() < 2.0:\n"
        "            pass\n"
        "        os.write(w, b'x')\n"
        "        while True:\n"
        "            pass\n"
        "os.read(r, 1), os.read(r, 1)\n"
        "'children busy'"
    )
    try:
        result = await worker.run(code)
        assert result.worker_died, result
        assert "CPU budget of 3 s" in (result.error or ""), result
        assert not worker.alive
    finally:
        await worker.aclose()
    assert worker.uid is not None and processes_of(worker.uid) == []


async def test_cpu_of_processes_that_ended_but_were_not_reaped_counts_too() -> None:
    """Two children burn CPU until their CPU limit ends them, and the call returns with both
    ended but not reaped (zombies): their CPU is in no running process's account, and the
    worker's own would get it only once it reaps them, after the check. (A busy machine got
    the test above here: its children ran into the limit before the call was settled.)"""
    worker = await spawn(SandboxLimits(timeout_s=60, cpu_s=10, worker_cpu_s=3, memory_mb=256))
    code = (
        "import os\n"
        "pids = []\n"
        "for _ in range(2):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        while True:\n"
        "            pass\n"
        "    pids.append(pid)\n"
        "for pid in pids:\n"
        "    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, left unreaped\n"
        "'children ended'"
    )
    try:
        result = await worker.run(code)
        assert result.worker_died, result
        assert "CPU budget of 3 s" in (result.error or ""), result
    finally:
        await worker.aclose()
    assert worker.uid is not None and processes_of(worker.uid) == []


async def test_cpu_of_children_it_waited_for_counts_too() -> None:
    worker = await spawn(SandboxLimits(timeout_s=30, cpu_s=10, worker_cpu_s=3, memory_mb=256))
    code = (
        "import subprocess, sys\n"
        "burn = 'import time\\nwhile time.process_time() < 2.0:\\n    pass'\n"
        "subprocess.run([sys.executable, '-c', burn])\n"
        "'first'"
    )
    try:
        assert (await worker.run(code)).value == "'first'"  # 2 s of 3
        second = await worker.run(code)  # 4 s of 3
        assert second.worker_died and "CPU budget of 3 s" in (second.error or ""), second
    finally:
        await worker.aclose()
