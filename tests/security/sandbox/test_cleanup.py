"""No ``toolfactory-sandbox-*`` directory (nor sandbox process) outlives a pool or its server, nor
the template's ``toolfactory-template-*`` its server.

Hole closed (security campaign, point 16, sandbox part): a SIGTERMed server left an empty
``/tmp/toolfactory-sandbox-*`` behind. Each case runs in a process of its own with
``TMPDIR`` pointing at a fresh directory, so other tests' sandboxes do not interfere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from protocol import decode_results
from tests.support.server import running_server, server_config
from tools.sandbox.processes import processes_of

REPO = Path(__file__).resolve().parents[3]

CLOSE_POOL = r"""
import anyio, os, tempfile
from tools.sandbox import SandboxPool
async def main():
    pool = SandboxPool(2)
    await pool.start()
    async with pool.worker() as worker:
        assert (await worker.run("6 * 7")).value == "42"
    print("open", sorted(os.listdir(tempfile.gettempdir())), flush=True)
    await pool.close()
    # before any atexit; the template (and the empty directory its mount namespace mounts on)
    # serves every pool of the process, so it lives until the process ends
    left = [name for name in os.listdir(tempfile.gettempdir()) if not name.startswith("toolfactory-template-")]
    print("closed", sorted(left), flush=True)
anyio.run(main)
"""

HOLD_POOL = r"""
import anyio, sys
from tools.sandbox import SandboxPool
async def main():
    pool = SandboxPool(1)
    await pool.start()
    worker = await pool.acquire()
    await worker.run("x = 1")
    print("uid", worker.uid, flush=True)
    await anyio.sleep(60)
anyio.run(main)
"""


HOLD_POOL_PIDS = r"""
import anyio
from tools.sandbox import SandboxPool
async def main():
    pool = SandboxPool(1)
    await pool.start()
    workers = [await pool.acquire() for _ in range(2)]
    for worker in workers:  # between calls a worker is stopped (SIGSTOP): it sees no hang-up
        await worker.run("x = 1")
        print("pid", worker.proc.pid, flush=True)  # the host's pid (inside, it is 1 of its own)
    await anyio.sleep(60)
anyio.run(main)
"""


def alive(pid: int) -> bool:
    """Running or stopped; a zombie (exited, not yet reaped by init) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it went between open and read
        return False


def python(code: str, tmp: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("toolfactory-*"))  # workers' directories, the template's


def test_closing_the_pool_removes_its_directory(tmp_path: Path) -> None:
    proc = python(CLOSE_POOL, tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    opened, closed = out.splitlines()
    assert opened.startswith("open ['toolfactory-sandbox-")
    assert closed == "closed []"
    assert leftovers(tmp_path) == []


def test_sigterm_of_a_process_holding_a_pool_leaves_nothing(tmp_path: Path) -> None:
    proc = python(HOLD_POOL, tmp_path)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("uid"), proc.communicate(timeout=5)
    assert leftovers(tmp_path) != []
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM  # it still dies of the signal
    assert leftovers(tmp_path) == []
    uid = line.split()[1]
    if uid != "None":
        # The worker was pid 1 of its namespace: the kernel kills what is left in it as the
        # worker dies, which a loaded machine may finish a moment after the holder has exited.
        deadline = time.monotonic() + 30
        while processes_of(int(uid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_of(int(uid)) == []


@pytest.mark.timeout(180)
def test_sigterm_of_a_server_with_the_python_tool_leaves_nothing(tmp_path: Path) -> None:
    config = server_config()
    config["tools"] = [
        *config["tools"],
        {"target": "tools.python_tool:PythonTool", "toolsets": ["default"], "args": {"pool_size": 1}},
    ]
    with running_server(config, env={"TMPDIR": str(tmp_path)}) as server:
        call = {"call_id": uuid.uuid4().hex, "name": "python", "arguments": {"code": "x = 6 * 7\nx"}}
        body = {"calls": [{**call, "session": f"s-{uuid.uuid4().hex}"}]}
        result = decode_results(httpx.post(server.url + "/v1/calls", json=body, timeout=60).content)[0]
        assert "42" in result.text
        assert leftovers(tmp_path) != []
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(30)
    for _ in range(500):  # the template removes its own directory once its server is gone
        if not leftovers(tmp_path):
            break
        time.sleep(0.01)
    assert leftovers(tmp_path) == [], server.output[-2000:]


def test_sigkill_of_a_process_holding_a_pool_leaves_no_worker_running(tmp_path: Path) -> None:
    """A replica killed outright (OOM killer, kill -9) runs no clean-up of its own: its template
    sees the hang-up and kills the workers it forked, which would otherwise sit stopped forever,
    holding their memory and uids, and their directories would stay in the temp dir."""
    proc = python(HOLD_POOL_PIDS, tmp_path)
    assert proc.stdout is not None
    pids = []
    for _ in range(2):
        line = proc.stdout.readline()
        assert line.startswith("pid"), proc.communicate(timeout=5)
        pids.append(int(line.split()[1]))
    assert all(alive(pid) for pid in pids)
    proc.kill()
    proc.communicate(timeout=30)
    for _ in range(1000):
        if not any(alive(pid) for pid in pids) and not leftovers(tmp_path):
            break
        time.sleep(0.01)
    assert [pid for pid in pids if alive(pid)] == [], "workers outlived their killed server"
    assert leftovers(tmp_path) == []  # nor their directories (what the sessions wrote)
