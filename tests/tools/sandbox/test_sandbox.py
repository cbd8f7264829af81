"""The sandbox and the python tool, with real confined subprocesses.

Each escape attempt runs in a worker of one shared pool while a *bystander* worker (another
session) holds a variable; after every attempt the attack must be reported as a result, the
bystander must be untouched and the pool must still serve a normal call.

What a sandbox may and may not do (see tools/sandbox/__init__.py):
allowed: read the system and interpreter files its fresh root shows (/usr, the standard
library, a synthetic /etc/passwd), read and write its own /tmp (its working directory);
denied: everything else on the host (/etc/shadow, the host's /tmp, the server's working
directory, other sandboxes' files), writing outside its private tmpfs mounts, the
network, more than ``max_processes`` processes, more memory/CPU/output than set, and
processes that outlive the call. tests/security/sandbox/test_*.py hold the escape tests
of the security campaign.
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import tools.sandbox
from protocol import ErrorKind, SessionState, ToolError, get_tool_meta
from tests.support.tool_context import Ctx
from tools.python_tool import PythonTool
from tools.sandbox import (
    SandboxError,
    SandboxLimits,
    SandboxPool,
    SandboxResult,
    SandboxWorker,
    _processes_of,
    run_python,
)

LIMITS = SandboxLimits(timeout_s=4, cpu_s=2, memory_mb=256, max_output_bytes=4096)
IS_ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    pool = SandboxPool(2, LIMITS, hide=("/root", "/home", str(REPO)))
    anyio.run(pool.start)
    yield pool
    anyio.run(pool.close)


@pytest.fixture(scope="module")
def strong(pool: SandboxPool) -> bool:
    """True where the kernel gave us namespaces and a dedicated uid (root on Linux)."""
    return "mount namespace" in pool.isolation.get("filesystem", "") and "dedicated" in pool.isolation.get(
        "user", ""
    )


def needs_strong(strong: bool) -> None:
    if not strong:
        pytest.skip("needs root with mount/network namespaces; fallback confinement is weaker by design")


@pytest.fixture
async def bystander(pool: SandboxPool) -> Any:
    worker = await pool.acquire()
    assert (await worker.run("secret = 41 + 1")).error is None
    yield worker
    result = await worker.run("secret")
    assert result.value == "42", "another session's worker was disturbed"
    await pool.release(worker)


async def attack(pool: SandboxPool, code: str, **kwargs: Any) -> tuple[SandboxResult, SandboxWorker]:
    worker = await pool.acquire()
    try:
        result = await worker.run(code, **kwargs)
    finally:
        await pool.release(worker)
    async with pool.worker() as fresh:
        assert (await fresh.run("6 * 7")).value == "42", (
            "the pool does not serve a normal call after the attack"
        )
    return result, worker


# -- basics ------------------------------------------------------------------------------
async def test_one_shot_run_python() -> None:
    result = await run_python("import sys\nprint('hi', sys.stdin.read())\n3 * 3", stdin="there")
    assert result.stdout == "hi there\n"
    assert result.value == "9"
    assert (result.exit_code, result.error, result.timed_out, result.worker_died) == (0, None, False, False)


async def test_exit_codes_and_tracebacks() -> None:
    result = await run_python("def f(x):\n    return 1 / x\nf(0)")
    assert result.exit_code == 1
    assert result.error is not None
    assert 'File "<cell 1>", line 2, in f' in result.error
    assert result.error.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "<string>" not in result.error  # the worker's own frames are not shown
    assert (await run_python("import sys; sys.exit(3)")).exit_code == 3
    syntax = await run_python("def (:")
    assert syntax.exit_code == 1 and "SyntaxError" in (syntax.error or "")


async def test_output_goes_through_every_path(pool: SandboxPool) -> None:
    async with pool.worker() as worker:
        result = await worker.run(
            "import os, subprocess, sys\n"
            "print('print'); sys.stderr.write('err\\n'); os.write(1, b'fd\\n')\n"
            "subprocess.run(['echo', 'child'])"
        )
    assert result.stdout == "print\nfd\nchild\n"
    assert result.stderr == "err\n"


async def test_state_persists_in_a_worker_and_not_across_workers(pool: SandboxPool) -> None:
    async with pool.worker() as a, pool.worker() as b:
        await a.run("x = [1, 2]\nimport math")
        assert (await a.run("x.append(3); x")).value == "[1, 2, 3]"
        assert (await a.run("math.sqrt(16)")).value == "4.0"
        other = await b.run("x")
        assert other.error is not None and "NameError" in other.error


def test_isolation_report(pool: SandboxPool, strong: bool) -> None:
    """The pool says what confinement it got; as root it is strong unless the kernel refused namespaces."""
    assert set(pool.isolation) >= {"network", "filesystem", "user", "processes"}
    if IS_ROOT and "namespaces_error" not in pool.isolation:
        assert strong, pool.isolation
        assert pool.isolation["network"].startswith("network namespace")


@pytest.mark.skipif(
    not (IS_ROOT and os.access("/usr/bin/python3", os.X_OK)), reason="needs root and /usr/bin/python3"
)
async def test_fallback_without_namespaces_still_confines() -> None:
    """No mount/network namespace: dedicated uid, private host directory, audit-hook network block."""
    worker = await anyio.to_thread.run_sync(
        lambda: SandboxWorker.spawn(LIMITS, python="/usr/bin/python3", namespaces=False)
    )
    try:
        assert worker.isolation["network"].startswith("audit hook")
        assert worker.isolation["filesystem"].startswith("private host directory")
        assert worker.isolation["seccomp"].startswith("filter")  # the filter does not need namespaces
        net = await worker.run("import socket\nsocket.create_connection(('127.0.0.1', 9))")
        assert "PermissionError: network access is disabled in this sandbox" in (net.error or "")
        parent = await worker.run("import os\nos.listdir('..')")
        assert "PermissionError" in (parent.error or "")  # other sandboxes' directories are not listable
        assert "PermissionError" in ((await worker.run("open('/etc/shadow')")).error or "")
        assert (await worker.run("open('f.txt', 'w').write('ok')")).value == "2"
    finally:
        await worker.aclose()


def test_fallback_refuses_to_run_as_root_when_it_cannot_drop_privileges() -> None:
    """Python under a directory others cannot enter and no mount namespace: refuse, don't run as root."""
    blocked = any(not os.stat(p).st_mode & 0o001 for p in Path(sys.base_prefix).resolve().parents)
    if not (IS_ROOT and blocked):
        pytest.skip("only meaningful as root with Python installed under a closed directory")
    with pytest.raises(SandboxError, match="cannot drop privileges"):
        SandboxWorker.spawn(LIMITS, namespaces=False)


async def test_interpreter_in_a_closed_directory_under_tmp_stays_usable(tmp_path: Path, strong: bool) -> None:
    """A venv inside the host's /tmp, below a mode-0700 directory: exposed, while /tmp itself is private."""
    needs_strong(strong)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "secret.txt").write_text("not for the sandbox")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(closed / "venv")], check=True)
    worker = await anyio.to_thread.run_sync(
        lambda: SandboxWorker.spawn(LIMITS, python=str(closed / "venv" / "bin" / "python"))
    )
    try:
        result = await worker.run(
            "import decimal, os, sys\nsys.prefix, sorted(os.listdir(os.path.dirname(sys.prefix)))"
        )
        assert result.value == f"({str(closed / 'venv')!r}, ['venv'])", result
        assert (await worker.run("open('/tmp/mine.txt', 'w').write('x')")).value == "1"
    finally:
        await worker.aclose()


# -- escapes -----------------------------------------------------------------------------
async def test_root_only_files_are_unreadable(pool: SandboxPool, bystander: SandboxWorker) -> None:
    result, _ = await attack(pool, "open('/etc/shadow').read()")
    assert result.error is not None
    assert (
        "PermissionError" in result.error or "FileNotFoundError" in result.error
    )  # no such file in a new root
    allowed, _ = await attack(pool, "open('/etc/passwd').read().startswith('root:')")
    assert allowed.value == "True"  # world-readable system files are part of the allowed view


async def test_processes_of_the_server_and_other_sandboxes_are_not_listed(
    pool: SandboxPool, bystander: SandboxWorker, strong: bool
) -> None:
    needs_strong(strong)
    assert pool.isolation["proc"].startswith("own processes only"), pool.isolation
    result, _ = await attack(
        pool,
        "import os\n"
        "listed = [e for e in os.listdir('/proc') if e.isdigit()]\n"
        "(os.path.exists(f'/proc/{os.getpid()}'), os.path.exists(f'/proc/{os.getppid()}'),"
        " os.path.exists('/proc/1'), len(listed) <= 4)",
    )
    # itself yes (pid 1 of its own PID namespace); its parent (outside: pid 0), the host's init
    # and every bystander's worker: no
    assert result.value == "(True, False, True, True)", result


async def test_host_files_outside_the_sandbox_are_invisible(
    pool: SandboxPool, bystander: SandboxWorker, strong: bool, tmp_path: Path
) -> None:
    needs_strong(strong)
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    server_file = Path(__file__).resolve()  # the server's code: in a hidden directory
    code = (
        "import os\n"
        "seen = []\n"
        f"for path in [{str(secret)!r}, {str(server_file)!r}]:\n"
        "    try:\n"
        "        seen.append(open(path).read())\n"
        "    except OSError as exc:\n"
        "        seen.append(type(exc).__name__)\n"
        "seen, os.getcwd(), sorted(os.listdir('.'))"
    )
    result, _ = await attack(pool, code)
    assert result.value is not None
    assert "host secret" not in result.value
    # Its own, empty /tmp — except the path leading to the interpreter and venv, which stay
    # visible when they live under /tmp (as in a CI clone there).
    exposed = sorted(
        {
            Path(p).resolve().parts[2]
            for p in (sys.executable, sys.prefix)
            if Path(p).resolve().parts[1:2] == ("tmp",)
        }
    )
    assert result.value == f"(['FileNotFoundError', 'FileNotFoundError'], '/tmp', {exposed!r})"


async def test_writing_outside_its_directory_is_denied(pool: SandboxPool, bystander: SandboxWorker) -> None:
    result, _ = await attack(pool, "open('/etc/toolfactory-escape', 'w').write('x')")
    assert result.error is not None and ("PermissionError" in result.error or "Read-only" in result.error)
    assert not Path("/etc/toolfactory-escape").exists()
    ok, _ = await attack(pool, "open('notes.txt', 'w').write('mine'); open('notes.txt').read()")
    assert ok.value == "'mine'"


async def test_other_sandboxes_files_are_invisible(pool: SandboxPool, strong: bool) -> None:
    needs_strong(strong)
    async with pool.worker() as a, pool.worker() as b:
        await a.run("open('/tmp/a-secret.txt', 'w').write('only a')")
        assert (await a.run("open('/tmp/a-secret.txt').read()")).value == "'only a'"
        result = await b.run("open('/tmp/a-secret.txt').read()")
        assert result.error is not None and "FileNotFoundError" in result.error
        kill = await b.run(f"import os, signal; os.kill({a.proc.pid}, signal.SIGKILL)")
        assert kill.error is not None and (
            "PermissionError" in kill.error or "ProcessLookupError" in kill.error
        )
        assert a.alive


async def test_network_is_unreachable(pool: SandboxPool, bystander: SandboxWorker) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        result, _ = await attack(
            pool, f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))"
        )
        assert result.error is not None
        assert any(word in result.error for word in ("unreachable", "PermissionError", "refused"))
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing got through


async def test_fork_bomb_is_contained(pool: SandboxPool, bystander: SandboxWorker) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result, worker = await attack(pool, code, timeout_s=2)
    assert result.timed_out and result.worker_died
    assert result.error == "timed out after 2 s; the interpreter was killed"
    if worker.uid is not None:
        for _ in range(100):  # the background thread sweeps the uid
            if not _processes_of(worker.uid):
                break
            await anyio.sleep(0.05)
        assert _processes_of(worker.uid) == []


async def test_fork_limit_raises_in_the_code(pool: SandboxPool, bystander: SandboxWorker) -> None:
    result, _ = await attack(
        pool, "import os, time\nfor _ in range(5000):\n    if os.fork() == 0:\n        time.sleep(30)"
    )
    assert result.error is not None and "BlockingIOError" in result.error
    assert not result.worker_died


async def test_children_that_leave_the_process_group_do_not_outlive_the_call(
    pool: SandboxPool, strong: bool
) -> None:
    needs_strong(strong)
    worker = await pool.acquire()
    result = await worker.run(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nos.getpid()"
    )
    assert result.value == "1"  # pid 1 of its own PID namespace
    assert worker.uid is not None and _processes_of(worker.uid) == [worker.proc.pid]  # killed on return
    await worker.aclose()
    assert _processes_of(worker.uid) == []


async def test_memory_bomb_is_contained(pool: SandboxPool, bystander: SandboxWorker) -> None:
    result, _ = await attack(pool, "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))")
    assert result.error is not None and "MemoryError" in result.error
    huge, _ = await attack(pool, "x = ' ' * 10**10")
    assert huge.error is not None and "MemoryError" in huge.error


async def test_infinite_loop_times_out(pool: SandboxPool, bystander: SandboxWorker) -> None:
    start = time.monotonic()
    result, worker = await attack(pool, "while True:\n    pass", timeout_s=1)
    assert result.timed_out and result.worker_died and not worker.alive
    assert result.exit_code < 0
    assert time.monotonic() - start < 30  # it was killed, not waited out


async def test_cpu_limit_kills_busy_code(pool: SandboxPool, bystander: SandboxWorker) -> None:
    result, _ = await attack(pool, "while True:\n    pass", timeout_s=30, cpu_s=1)
    assert result.worker_died and not result.timed_out
    assert result.error == "CPU time limit of 1 s exceeded; the interpreter was killed"


async def test_huge_output_is_truncated(pool: SandboxPool, bystander: SandboxWorker) -> None:
    result, _ = await attack(pool, "print('x' * 10**7)\n'after'", max_output_bytes=1000)
    assert result.truncated
    assert result.stdout == "x" * 1000
    assert result.value == "'after'"
    flood, _ = await attack(pool, "while True:\n    print('y' * 1000)")
    assert flood.truncated and len(flood.stdout) == LIMITS.max_output_bytes
    assert flood.error is not None and "File too large" in flood.error  # RLIMIT_FSIZE stopped it


async def test_hard_exit_and_crash_are_reported(pool: SandboxPool, bystander: SandboxWorker) -> None:
    exited, _ = await attack(pool, "import os\nprint('bye')\nos._exit(7)")
    assert exited.worker_died and exited.exit_code == 7 and exited.stdout == "bye\n"
    assert "exited with status 7" in (exited.error or "")
    crashed, _ = await attack(pool, "import ctypes\nctypes.string_at(0)")
    assert crashed.worker_died and crashed.exit_code == -11
    assert "segmentation fault" in (crashed.error or "")


async def test_tampered_control_channel_only_breaks_its_own_worker(
    pool: SandboxPool, bystander: SandboxWorker
) -> None:
    code = (
        "import fcntl, os, stat, time\n"
        "for fd in range(3, 32):\n"
        "    try:\n"
        "        if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:\n"
        "            os.write(fd, b'\\xff\\xff\\xff\\xffgarbage')\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(5)"
    )
    result, _ = await attack(pool, code)
    assert result.worker_died
    assert "tampered" in (result.error or "")


# -- the python tool ---------------------------------------------------------------------
@pytest.fixture
async def python_tool() -> Any:
    tool = PythonTool(pool_size=1, timeout_s=2, cpu_s=2, memory_mb=256, max_output_bytes=2000)
    await tool.startup()
    yield tool
    await tool.shutdown()


def test_python_tool_metadata() -> None:
    meta = get_tool_meta(PythonTool)
    assert (meta.name, meta.stateful, meta.kind) == ("python", True, "program")


async def test_python_tool_sessions_persist_and_are_isolated(python_tool: PythonTool) -> None:
    one, two = SessionState("s-one"), SessionState("s-two")
    first = await python_tool("total = 40", Ctx(one))
    assert first.content[0]["text"] == "(no output)" and not first.is_error
    out = await python_tool("total += 2\nprint('total is', total)\ntotal", Ctx(one))
    assert out.content[0]["text"] == "total is 42\n42"
    assert out.structured["value"] == "42" and out.structured["stdout"] == "total is 42\n"
    other = await python_tool("total", Ctx(two))
    assert other.is_error and "NameError: name 'total' is not defined" in other.content[0]["text"]
    worker = one.data[python_tool._key].worker
    assert worker is not None and worker.alive
    await one.close()
    assert not worker.alive
    await two.close()


async def test_python_tool_without_session_is_one_shot(python_tool: PythonTool) -> None:
    await python_tool("y = 1", Ctx(None))
    out = await python_tool("y", Ctx(None))
    assert out.is_error and "NameError" in out.content[0]["text"]


async def test_python_tool_timeout_is_a_timeout_error_and_the_session_recovers(
    python_tool: PythonTool,
) -> None:
    session = SessionState("s-timeout")
    await python_tool("kept = 1", Ctx(session))
    with pytest.raises(ToolError) as info:
        await python_tool("print('started', flush=True)\nwhile True:\n    pass", Ctx(session))
    assert info.value.kind is ErrorKind.TIMEOUT
    assert "timed out after 2 s" in info.value.message
    assert "Variables from earlier calls are gone" in info.value.message
    assert "started" in info.value.message  # partial output is shown
    after = await python_tool("'kept' in globals(), 1 + 1", Ctx(session))
    assert after.content[0]["text"] == "(False, 2)"
    await session.close()


async def test_python_tool_dead_interpreter_is_a_tool_error(python_tool: PythonTool) -> None:
    session = SessionState("s-dead")
    with pytest.raises(ToolError) as info:
        await python_tool("import os\nos._exit(3)", Ctx(session))
    assert info.value.kind is ErrorKind.TOOL_ERROR and "exited with status 3" in info.value.message
    assert (await python_tool("2 + 2", Ctx(session))).content[0]["text"] == "4"
    await session.close()


async def test_python_tool_output_rendering(python_tool: PythonTool) -> None:
    out = await python_tool(
        "import sys\nprint('a' * 5000)\nsys.stderr.write('warn\\n')\nsys.exit(2)", Ctx(None)
    )
    text = out.content[0]["text"]
    assert text.startswith("a" * 2000 + "\n[stderr]\nwarn\n[exit status 2]")
    assert text.endswith("[output truncated to 2000 bytes per stream]")
    assert out.structured["truncated"] and out.structured["exit_code"] == 2 and not out.is_error


async def test_python_tool_rejects_oversized_code(python_tool: PythonTool) -> None:
    with pytest.raises(ToolError) as info:
        await python_tool("x = 1\n" * 50_000, Ctx(None))
    assert info.value.kind is ErrorKind.INVALID_ARGUMENTS and "over the limit" in info.value.message


def test_the_worker_needs_only_the_standard_library() -> None:
    """It confines itself before anything else runs: a project import would run unconfined.
    Its sibling modules (relative imports) are held to the same rule."""
    worker = Path(tools.sandbox._WORKER_PATH)
    names: set[str] = set()
    todo, seen = [worker.stem], set()
    while todo:
        seen.add(module := todo.pop())
        tree = ast.parse((worker.parent / f"{module}.py").read_text())
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:  # `from .sibling import x`: read it too
                assert node.module, "import siblings by name (from .module import name)"
                todo += [] if node.module in seen else [node.module]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    assert len(seen) > 1
    assert {name.split(".")[0] for name in names} <= set(sys.stdlib_module_names) | {"__future__"}
