"""Workers forked from the pre-warmed template process (zygote) share pages, never state.

Scale (issue 14, point 1): every python session is now ``fork``-ed from one template that
has the interpreter and common modules loaded. What one session does (globals, files,
environment, patched modules, random draws, fds) must stay invisible to the next session
forked from the same template, nothing a worker does may reach the template, and a template
that dies or hangs is replaced without a call hanging. The confinement of each worker is
checked by the other tests/security/sandbox/test_*.py, which all run on forked workers.
Real templates and confined workers throughout.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import anyio
import pytest

import tools.sandbox.zygote as zygote
from protocol import SessionState, ToolError
from tests.support.tool_context import Ctx
from tools.python_tool import PythonTool
from tools.sandbox import SandboxError, SandboxLimits, SandboxWorker, default_hidden_paths
from tools.sandbox.mounts import shareable
from tools.sandbox.template import SPARES_PER_ROOT

LIMITS = SandboxLimits(timeout_s=20, cpu_s=10, memory_mb=256)
IS_ROOT = os.geteuid() == 0


# Where this checkout or its venv lies under /tmp (a clone in /tmp/x), a session's /tmp shows
# that one top-level entry on top of its own tmpfs, so that the interpreter stays usable; each
# worker then builds its own root, and the template keeps no spares.
def _shown_in_tmp() -> list[str]:
    """The top-level /tmp entries holding the interpreter's files, as a fresh interpreter (the
    template's) sees its prefixes and sys.path."""
    probe = "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.executable, *sys.path]))"
    paths = json.loads(
        subprocess.run([sys.executable, "-I", "-c", probe], cwd="/", capture_output=True, check=True).stdout
    )
    reals = [
        os.path.realpath(p) for p in paths if os.path.isabs(p)
    ]  # not the path hooks of editable installs
    return sorted({os.path.relpath(r, "/tmp").split(os.sep)[0] for r in reals if r.startswith("/tmp/")})


SHOWN_IN_TMP = _shown_in_tmp()
SHARED_ROOT = shareable(list(default_hidden_paths()))


async def spawn(**kwargs: object) -> SandboxWorker:
    return await anyio.to_thread.run_sync(lambda: SandboxWorker.spawn(LIMITS, **kwargs))  # type: ignore[arg-type]


@pytest.fixture
async def pair() -> AsyncIterator[tuple[SandboxWorker, SandboxWorker]]:
    first, second = await spawn(), await spawn()
    yield first, second
    for worker in (first, second):
        await worker.aclose()


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("PPid:")).split()[1])


def rollup(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        rows = [line.split() for line in fh]
    return {row[0].rstrip(":"): int(row[1]) for row in rows if len(row) == 3 and row[2] == "kB"}


def zygote_spares() -> int:
    """How many spare children the template keeps per prepared root (its constant)."""
    return SPARES_PER_ROOT


def template_pid() -> int:
    pid = zygote.template_for(sys.executable).pid
    assert pid is not None
    return pid


LEAVE_TRACES = r"""
import os, random, statistics, sys, types
secret = "session-one"
open("/tmp/secret.txt", "w").write(secret)
os.environ["SESSION_SECRET"] = secret
statistics.mean = lambda *a, **k: secret  # patch a module the template pre-imported
sys.modules["planted"] = types.ModuleType("planted")
random.seed(1234)
random.random()
"""

LOOK_FOR_TRACES = r"""
import os, random, statistics, sys
random.seed(1234)
(
    "secret" in globals(),
    os.path.exists("/tmp/secret.txt"),
    os.environ.get("SESSION_SECRET"),
    statistics.mean([1, 3]),
    "planted" in sys.modules,
    sorted(os.listdir("/tmp")),
    random.random(),
)
"""


async def test_a_session_leaves_nothing_for_the_next_one_forked_from_the_same_template() -> None:
    first = await spawn()
    try:
        traces = await first.run(LEAVE_TRACES)
        assert traces.error is None, traces
        second = await spawn()  # forked after the first session changed everything it could
        try:
            template = template_pid()
            assert parent_of(first.proc.pid) == parent_of(second.proc.pid) == template
            seen = await second.run(LOOK_FOR_TRACES)
            assert seen.error is None, seen
            found = ast.literal_eval(seen.value or "")
            assert found[:6] == (False, False, None, 2, False, SHOWN_IN_TMP), found
            assert found[6] == float(traces.value or "nan")  # the same seed gives the same draw: plain Python
            still = await first.run("secret, open('/tmp/secret.txt').read(), os.environ['SESSION_SECRET']")
            assert still.value == "('session-one', 'session-one', 'session-one')"  # its own state is intact
        finally:
            await second.aclose()
    finally:
        await first.aclose()


async def test_each_worker_draws_its_own_random_state(pair: tuple[SandboxWorker, SandboxWorker]) -> None:
    """Forked from one template, unseeded draws must still differ: the child re-seeds."""
    code = "import random, tempfile\nrandom.getrandbits(128), next(tempfile._get_candidate_names())"
    draws = [ast.literal_eval((await worker.run(code)).value or "") for worker in pair]
    assert draws[0][0] != draws[1][0]
    assert draws[0][1] != draws[1][1]


async def test_a_worker_holds_no_fd_of_the_template_or_of_another_session(
    pair: tuple[SandboxWorker, SandboxWorker],
) -> None:
    code = (
        "import os\n"
        "fds = [fd for fd in os.listdir('/proc/self/fd')]\n"
        "{int(fd): os.readlink(f'/proc/self/fd/{fd}') for fd in fds if os.path.exists(f'/proc/self/fd/{fd}')}"
    )
    for worker in pair:
        result = await worker.run(code)
        fds = ast.literal_eval(result.value or "")
        assert fds[0] == "/dev/null", fds
        assert fds[1].startswith("/memfd:sandbox-stdout") and fds[2].startswith("/memfd:sandbox-stderr"), fds
        others = {fd: target for fd, target in fds.items() if fd > 2}
        assert len(others) == 2 and all(t.startswith("pipe:") for t in others.values()), (
            fds
        )  # its control pipes
    template = template_pid()
    held = {int(fd): os.readlink(f"/proc/{template}/fd/{fd}") for fd in os.listdir(f"/proc/{template}/fd")}
    assert sorted(held)[:4] == [0, 1, 2, 3], held  # stdio and its socket
    # and its own PID namespace (to return to after forking a child into a new one), and one
    # socket per spare child (a few per prepared root): no session's pipe or memfd
    assert all(target.startswith(("socket:", "pid:")) for fd, target in held.items() if fd > 3), held
    assert sum(target.startswith("pid:") for target in held.values()) <= 1, held


@pytest.mark.skipif(not IS_ROOT, reason="needs root: workers drop to uids of their own")
async def test_nothing_a_worker_does_reaches_the_template(pair: tuple[SandboxWorker, SandboxWorker]) -> None:
    template = template_pid()
    first, second = pair
    attempt = await first.run(
        "import os, signal\n"
        "out = []\n"
        f"for sig in (signal.SIGKILL, signal.SIGSTOP):\n"
        "    try:\n"
        f"        os.kill({template}, sig)\n"
        "        out.append('sent')\n"
        "    except OSError as exc:\n"
        "        out.append(type(exc).__name__)\n"
        f"out, os.path.exists('/proc/{template}'), os.getppid()"
    )
    kills, visible, ppid = ast.literal_eval(attempt.value or "")
    # In its own PID namespace the template's pid names no process, and its parent is outside (0)
    assert kills == ["ProcessLookupError", "ProcessLookupError"], attempt
    assert not visible and ppid == 0
    assert template_pid() == template  # the same template, running
    assert parent_of(second.proc.pid) == template
    third = await spawn()
    try:
        assert (await third.run("6 * 7")).value == "42"
        assert parent_of(third.proc.pid) == template
    finally:
        await third.aclose()


@pytest.mark.skipif(not IS_ROOT, reason="the template leaves the network only as root")
async def test_the_template_is_confined_as_far_as_forking_allows(
    pair: tuple[SandboxWorker, SandboxWorker],
) -> None:
    template = template_pid()
    assert os.readlink(f"/proc/{template}/ns/net") != os.readlink("/proc/self/ns/net")
    with open(f"/proc/{template}/environ", "rb") as fh:
        environ = dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if item)
    assert environ == {
        k.encode(): v.encode() for k, v in zygote.TEMPLATE_ENV.items()
    }  # nothing of the server's
    with open(f"/proc/{template}/status") as fh:
        status = dict(line.split(":", 1) for line in fh)
    assert status["Threads"].strip() == "1" and status["NoNewPrivs"].strip() == "1"
    assert os.path.realpath(f"/proc/{template}/cwd") == "/"


async def test_workers_share_the_template_pages(pair: tuple[SandboxWorker, SandboxWorker]) -> None:
    """Anonymous memory shared with the template: an interpreter started on its own has none."""
    for worker in pair:
        assert (await worker.run("import json, re, decimal\n1")).value == "1"
        shared = rollup(worker.proc.pid)["Shared_Dirty"]
        assert shared > 4096, rollup(worker.proc.pid)  # kB: the heap the template built before forking


async def test_a_killed_template_is_replaced_and_open_sessions_go_on() -> None:
    tool = PythonTool(pool_size=0, timeout_s=20, memory_mb=256)
    await tool.startup()
    old_session, new_session = SessionState("template-old"), SessionState("template-new")
    try:
        assert (await tool("x = 41\nx + 1", Ctx(old_session))).content[0]["text"] == "42"
        old = template_pid()
        os.kill(old, signal.SIGKILL)
        assert (await tool("x", Ctx(old_session))).content[0]["text"] == "41"  # its worker runs on
        assert (await tool("'x' in globals()", Ctx(new_session))).content[0]["text"] == "False"
        assert template_pid() != old  # a new template forked the new session's worker
        with pytest.raises(ToolError) as info:  # its exit status went with its template: still clear
            await tool("import os\nos._exit(3)", Ctx(old_session))
        assert "exit status was lost with the template process" in info.value.message, info.value
        assert (await tool("x = 1\nx", Ctx(old_session))).content[0]["text"] == "1"  # starts afresh
    finally:
        await old_session.close()
        await new_session.close()
        await tool.shutdown()


async def test_a_hung_template_is_replaced_instead_of_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    template = zygote.template_for(sys.executable)
    template.stop()
    monkeypatch.setattr(zygote, "_REPLY_TIMEOUT_S", 1.0)  # the next start uses it
    try:
        first = await spawn()
        await first.aclose()
        hung = template_pid()
        os.kill(hung, signal.SIGSTOP)
        worker = await spawn()  # the fork request times out, the template is killed, a new one forks
        try:
            assert (await worker.run("6 * 7")).value == "42"
            assert parent_of(worker.proc.pid) == template_pid() != hung
            assert not os.path.exists(f"/proc/{hung}")
        finally:
            await worker.aclose()
    finally:
        template.stop()  # later tests start one with the normal timeout


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/false"])
async def test_a_template_that_cannot_start_is_a_clear_error(python: str) -> None:
    with pytest.raises(SandboxError, match="the sandbox template"):
        await spawn(python=python)


async def test_the_template_serves_only_fork_and_reap() -> None:
    """Asked to run anything else, or to fork without a worker's fds, it refuses and stays up."""
    first = await spawn()
    await first.aclose()
    template = zygote.template_for(sys.executable)
    pid = template_pid()
    with template._lock:
        for request in ({"op": "exec", "code": "1"}, {"op": "fork", "config": {}}, {"op": "fork"}):
            reply, fds = template._ask(request)
            assert fds == [] and "not a request the template serves" in reply["error"], reply
    assert template_pid() == pid
    worker = await spawn()
    try:
        assert (await worker.run("1 + 1")).value == "2"
    finally:
        await worker.aclose()


HOLD_A_WORKER = r"""
import anyio, sys
import tools.sandbox.zygote as zygote
from tools.sandbox import SandboxWorker
async def main():
    worker = await anyio.to_thread.run_sync(SandboxWorker.spawn)
    print(zygote.template_for(sys.executable).pid, flush=True)
    await anyio.sleep(60)
anyio.run(main)
"""


def test_the_template_ends_with_the_process_that_started_it() -> None:
    """Even a SIGKILLed server (no atexit, no handler) leaves no template: it exits on EOF."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_WORKER], cwd=repo, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    template = int(proc.stdout.readline())
    assert os.path.exists(f"/proc/{template}")
    proc.kill()
    proc.wait(30)
    for _ in range(500):
        if not os.path.exists(f"/proc/{template}") or _state(template) == "Z":
            return
        time.sleep(0.02)
    raise AssertionError(f"the template {template} outlived its server")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


async def test_a_worker_the_server_stopped_waiting_for_is_reaped_when_it_exits() -> None:
    """close() of a worker that still runs (say, stuck in the kernel past the 5 s wait): no zombie stays."""
    worker = await spawn()
    pid = worker.proc.pid
    await anyio.to_thread.run_sync(worker.proc.close)  # while it runs: the template is told to reap it later
    assert worker.proc.returncode is not None and worker.proc.status_lost
    assert _state(pid) not in ("Z", "gone")
    os.kill(pid, signal.SIGKILL)  # the pidfd is gone; the pid is still taken (unreaped), so this is safe
    for _ in range(500):
        if _state(pid) == "Z":
            break
        time.sleep(0.01)
    assert _state(pid) == "Z"  # exited, not yet reaped
    other = await spawn()  # any request: the template reaps what it was told to
    try:
        assert _state(pid) == "gone"
    finally:
        await other.aclose()
        await worker.aclose()


def mount_points(pid: int | str) -> list[str]:
    with open(f"/proc/{pid}/mountinfo") as fh:
        return sorted(line.split()[4] for line in fh)


@pytest.mark.skipif(not IS_ROOT, reason="the template prepares roots only as root")
async def test_a_workers_mounts_stay_in_its_own_namespace() -> None:
    """The template builds the read-only root once; each worker adds its own tmpfs and identity
    files in a copy of that mount namespace: none of it reaches the template, the host or a sibling."""
    first = await spawn()
    try:
        template = template_pid()
        host_before, template_before = mount_points("self"), mount_points(template)
        assert os.readlink(f"/proc/{template}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        second = await spawn()
        try:
            assert os.readlink(f"/proc/{second.proc.pid}/ns/mnt") not in {
                os.readlink(f"/proc/{pid}/ns/mnt") for pid in (template, first.proc.pid, os.getpid())
            }
            await second.run("open('/tmp/mine', 'w').write('second')")
            assert (await first.run("import os\nsorted(os.listdir('/tmp'))")).value == repr(SHOWN_IN_TMP)
            ids = "import os\nos.getuid(), open('/etc/passwd').read().splitlines()[-1].split(':')[2]"
            for worker in (first, second):
                uid, named = ast.literal_eval((await worker.run(ids)).value or "")
                assert uid == worker.uid and named == str(worker.uid)  # its own, from one shared root
        finally:
            await second.aclose()
        assert mount_points(template) == template_before
        assert mount_points("self") == host_before
    finally:
        await first.aclose()


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, StopIteration):
                if parent_of(int(entry)) == pid and _state(int(entry)) not in ("Z", "gone"):
                    found.add(int(entry))
    return found


def entered(pid: int, template: int) -> bool:
    """Whether a child has entered namespaces of its own (a spare does so right after its fork)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink(f"/proc/{template}/ns/net")
    except OSError:
        return False


async def wait_for_spares(template: int, workers: set[int], count: int) -> set[int]:
    for _ in range(500):
        spares = {pid for pid in children_of(template) - workers if entered(pid, template)}
        if len(spares) >= count:
            return spares
        await anyio.sleep(0.01)
    raise AssertionError(f"the template {template} keeps no spares: {children_of(template)}")


@pytest.mark.skipif(not IS_ROOT, reason="spares are kept only for prepared roots, as root")
async def test_spares_serve_one_session_each_and_hold_none_before() -> None:
    """A spare child is forked ahead of demand with its namespaces and root entered; it gets one
    session, then the template forks another. Before that it runs no code and holds no fd of any
    session; a spare that died is skipped; spares end with their template."""
    if not SHARED_ROOT:
        pytest.skip("the interpreter lies under /tmp: each worker builds its own root, no spares are kept")
    first = await spawn()
    try:
        template = template_pid()
        spares = await wait_for_spares(template, {first.proc.pid}, zygote_spares())
        for spare in spares:
            fds = {os.readlink(f"/proc/{spare}/fd/{fd}") for fd in os.listdir(f"/proc/{spare}/fd")}
            assert {t for t in fds if not t.startswith("socket:")} == {"/dev/null"}, fds
            for ns in ("net", "ipc", "mnt"):
                assert os.readlink(f"/proc/{spare}/ns/{ns}") != os.readlink(f"/proc/{template}/ns/{ns}")
            with open(f"/proc/{spare}/status") as fh:
                assert (
                    next(line for line in fh if line.startswith("Uid:")).split()[1] == "0"
                )  # no session yet
        second = await spawn()
        try:
            assert second.proc.pid in spares and second.isolation["start"].startswith("a spare")
            assert second.uid != first.uid and (await second.run("'x' in globals()")).value == "False"
            refilled = await wait_for_spares(template, {first.proc.pid, second.proc.pid}, zygote_spares())
            assert second.proc.pid not in refilled  # a spare is handed out once
            for spare in refilled:
                os.kill(spare, signal.SIGKILL)  # dead spares are skipped: the worker is forked on demand
            for _ in range(500):
                if all(_state(pid) in ("Z", "gone") for pid in refilled):
                    break
                await anyio.sleep(0.01)
            third = await spawn()
            try:
                assert (await third.run("6 * 7")).value == "42" and third.proc.pid not in refilled
            finally:
                await third.aclose()
            last = await wait_for_spares(template, {first.proc.pid, second.proc.pid}, zygote_spares())
            zygote.template_for(sys.executable).stop()
            for _ in range(500):
                if not any(_state(pid) not in ("Z", "gone") for pid in last):
                    break
                await anyio.sleep(0.01)
            assert all(_state(pid) in ("Z", "gone") for pid in last)  # no template, no spares
            assert (await second.run("1 + 1")).value == "2"  # sessions run on without their template
        finally:
            await second.aclose()
    finally:
        await first.aclose()
