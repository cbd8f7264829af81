"""The sandbox's filesystem is deny-by-default: a fresh root with only system and interpreter files.

Holes closed (security campaign, point 6): sandboxed code wrote gigabytes to the host disk
through world-writable directories that no tmpfs covered (``/run/lock``), and read any
world-readable host file outside a short hide list (the project checkout, ``/opt``, a
``0644`` tokens file). Every test uses real confined workers.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tools.sandbox import SandboxLimits, SandboxWorker

REPO = Path(__file__).resolve().parents[3]
LIMITS = SandboxLimits(timeout_s=60, cpu_s=30, memory_mb=256, max_output_bytes=1 << 16)
PRIVATE_TMPFS = {"/tmp", "/var/tmp", "/dev/shm"}


async def spawn(**kwargs: object) -> SandboxWorker:
    worker = await anyio.to_thread.run_sync(lambda: SandboxWorker.spawn(LIMITS, **kwargs))  # type: ignore[arg-type]
    if "mount namespace" not in worker.isolation.get("filesystem", ""):
        await worker.aclose()
        pytest.skip(f"needs root with mount namespaces (got {worker.isolation.get('filesystem')})")
    return worker


@pytest.fixture
async def worker() -> AsyncIterator[SandboxWorker]:
    worker = await spawn(hide=())  # nothing hidden on purpose: deny-by-default must not need a list
    yield worker
    await worker.aclose()


# Walks everything it can see (but /proc) and tries to create a file in every directory.
WRITE_EVERYWHERE = r"""
import os, stat
written, world_writable = [], []
for top, dirs, files in os.walk("/"):
    if top in ("/proc", "/sys"):
        dirs[:] = []
        continue
    if os.lstat(top).st_mode & stat.S_IWOTH:
        world_writable.append(top)
    try:
        with open(os.path.join(top, MARKER), "w") as fh:
            fh.write("x" * 4096)
        written.append(top)
    except OSError:
        pass
mounts = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    mounts[fields[4]] = line.split(" - ")[1].split()[0]
sorted(written), world_writable, {d: mounts.get(d) for d in written}
"""


async def test_only_private_tmpfs_mounts_are_writable_and_nothing_reaches_the_host(
    worker: SandboxWorker,
) -> None:
    marker = f"sandbox-marker-{uuid.uuid4().hex}"
    result = await worker.run(WRITE_EVERYWHERE.replace("MARKER", repr(marker)))
    landed = [
        d
        for d in ("/tmp", "/var/tmp", "/run/lock", "/dev/shm", "/run", "/")
        if os.path.exists(f"{d}/{marker}")
    ]
    for d in landed:  # clean the host up before asserting (only the old sandbox wrote here)
        os.unlink(f"{d}/{marker}")
    assert result.error is None and result.value is not None, result
    written, world_writable, mount_types = ast.literal_eval(result.value)
    assert set(written) <= PRIVATE_TMPFS, written
    assert mount_types == {d: "tmpfs" for d in written}  # each one a mount of its own
    assert world_writable == []  # the private tmpfs mounts are mode 0700, owned by the worker
    assert landed == []


async def test_find_lists_no_world_writable_directory(worker: SandboxWorker) -> None:
    """The campaign's own probe, ``find / -perm -0002 -type d``, run inside (over every mount)."""
    result = await worker.run(
        "import subprocess\n"
        "find = ['find', '/', '-path', '/proc', '-prune', '-o', '-perm', '-0002', '-type', 'd', '-print']\n"
        "subprocess.run(find, capture_output=True, text=True).stdout.split()"
    )
    assert result.value == "[]", result


async def test_private_tmpfs_mounts_are_size_capped(worker: SandboxWorker) -> None:
    code = (
        "import os\nsizes = {}\n"
        "for d in ('/tmp', '/var/tmp', '/dev/shm'):\n"
        "    st = os.statvfs(d)\n"
        "    sizes[d] = st.f_blocks * st.f_frsize >> 20\n"
        "sizes"
    )
    result = await worker.run(code)
    assert result.value == repr({"/tmp": LIMITS.tmpfs_mb, "/var/tmp": 4, "/dev/shm": 4})


@pytest.fixture
def planted() -> AsyncIterator[list[Path]]:
    """A world-readable tokens file in /srv and /opt, and a file in the project checkout."""
    tag = uuid.uuid4().hex
    dirs = [Path(f"/srv/toolfactory-{tag}"), Path(f"/opt/toolfactory-{tag}")]
    files = []
    for d in dirs:
        d.mkdir(mode=0o755)
        files.append(d / "tokens.yaml")
    files.append(REPO / f".sandbox-probe-{tag}.txt")
    for f in files:
        f.write_text("token: s3cret\n")
        f.chmod(0o644)
    yield files
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    files[-1].unlink()


async def test_world_readable_host_files_are_not_there(worker: SandboxWorker, planted: list[Path]) -> None:
    paths = [*map(str, planted), str(REPO / "pyproject.toml"), "/etc/shadow", "/etc/hostname"]
    code = (
        "import os\nseen = {}\n"
        f"for path in {paths!r}:\n"
        "    try:\n"
        "        seen[path] = open(path).read()\n"
        "    except OSError as exc:\n"
        "        seen[path] = type(exc).__name__\n"
        "seen, sorted(os.listdir('/'))"
    )
    result = await worker.run(code)
    assert result.value is not None, result
    seen, top = ast.literal_eval(result.value)
    assert seen == {p: "FileNotFoundError" for p in paths}
    assert not {"srv", "opt", "home", "mnt", "run", "sys", "boot"} & set(top), top


async def test_the_checkout_is_not_readable_though_its_venv_runs_the_worker(worker: SandboxWorker) -> None:
    """The venv may live inside the checkout (here it does): only the venv is shown, not its siblings."""
    result = await worker.run(
        "import os, sys, json\n"
        "checkout = os.path.dirname(sys.prefix)\n"
        "try:\n"
        "    import tools\n"
        "    imported = 'yes'\n"
        "except ImportError as exc:\n"
        "    imported = type(exc).__name__\n"
        "sorted(os.listdir(checkout)), imported"
    )
    prefix = Path(os.path.realpath(sys.prefix))
    if prefix.parent != REPO:
        pytest.skip("the interpreter's venv is not inside the checkout here")
    assert result.value == f"([{prefix.name!r}], 'ModuleNotFoundError')", result
