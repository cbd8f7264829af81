"""The container engine and compose tool the image tests drive, found as ``make image`` finds them.

compose/image.sh picks docker when its daemon answers, else podman; the compose file then runs
under ``docker compose`` or ``podman-compose`` (the dev extra). Under ``make test``
(``TOOLFACTORY_REQUIRE_TRAINER=1``: its setup apt-installs podman) a missing engine or compose
tool fails the tests; elsewhere they are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.require import REQUIRE_TRAINER
from tests.support.server import REPO

IMAGE_SH = REPO / "compose" / "image.sh"
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"

# Linux capability numbers (linux/capability.h), to read a process's CapEff.
CAPABILITIES = [
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
]  # fmt: skip


def unavailable(reason: str) -> None:
    """Skip, or under ``make test`` fail: its setup installs what is missing, so a skip would hide it."""
    if REQUIRE_TRAINER:
        pytest.fail(f"{reason}; `make setup` installs podman (TOOLFACTORY_REQUIRE_TRAINER=1)", pytrace=False)
    pytest.skip(reason)


def engine() -> str:
    """``docker`` or ``podman``: the one compose/image.sh builds with."""
    found = subprocess.run([str(IMAGE_SH), "engine"], capture_output=True, text=True, timeout=60)
    if found.returncode != 0:
        unavailable(f"no container engine: {found.stderr.strip()}")
    return found.stdout.strip()


def compose_command(engine: str, project: str) -> list[str]:
    """The compose tool for ``engine`` on compose/docker-compose.yml, as project ``project``."""
    if engine == "docker":
        tool = ["docker", "compose"]
        if subprocess.run([*tool, "version"], capture_output=True).returncode != 0:
            unavailable("docker answers but has no compose plugin")
    else:
        path = Path(sys.executable).parent / "podman-compose"
        if not path.exists():
            path = Path(shutil.which("podman-compose") or path)
        if not path.exists():
            unavailable("podman-compose is missing (the dev extra installs it)")
        tool = [str(path)]
    return [*tool, "-p", project, "-f", str(COMPOSE_FILE)]


def capability_names(mask_hex: str) -> list[str]:
    """The names of the capabilities set in a /proc/PID/status mask such as ``00000000a82c00eb``."""
    mask = int(mask_hex, 16)
    return sorted(name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1)


def build_image() -> str:
    """Build the image (layers reused) with compose/image.sh; its name. A failed build fails the test."""
    built = subprocess.run(
        [str(IMAGE_SH), "build"], capture_output=True, text=True, env={**os.environ}, timeout=3600
    )
    if built.returncode != 0:
        pytest.fail(f"compose/image.sh build failed:\n{built.stderr[-6000:]}", pytrace=False)
    return built.stdout.strip().splitlines()[-1]
