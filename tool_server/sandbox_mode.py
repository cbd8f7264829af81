"""Which sandbox confines untrusted code in this process: strong, weak, or unavailable.

The sandbox (``tools.sandbox``) takes every confinement step the process may take and falls
back, step by step, where the kernel, the container's capabilities or its seccomp/AppArmor
profile refuse one: a container without CAP_SYS_ADMIN silently gets the weak fallback. The
server says which at start (a log line and ``/readyz``), and ``tool-server serve`` refuses to
expose untrusted code beyond loopback with only the weak one unless
``server.allow_weak_sandbox`` says so (tool_server/cli.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tool_server")

# Tools that run code a model (or a pipeline) wrote: the python tool and the code_tests
# verifier. Packs written by the builder (``trusted: false``) run theirs in the sandbox too.
SANDBOX_MODULES = frozenset({"tools.python_tool", "tools.verifiers.code"})
HOW_TO_GET_STRONG = (
    "run the server as root with CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID, CAP_KILL, CAP_CHOWN, CAP_FOWNER, "
    "CAP_DAC_OVERRIDE and CAP_SYS_CHROOT, a seccomp profile that allows unshare and mount to CAP_SYS_ADMIN "
    "(docker's default and Kubernetes' RuntimeDefault do) and no AppArmor profile that denies mount: "
    "compose/docker-compose.yml and compose/k8s/deployment.yaml grant exactly that"
)


@dataclass(frozen=True, slots=True)
class SandboxMode:
    mode: str  # "strong", "weak", or "unavailable" (no worker starts: sandboxed calls fail)
    missing: tuple[str, ...] = ()  # what the strong mode has and this one lacks
    error: str | None = None  # why no worker starts

    def summary(self, users: list[str]) -> dict[str, Any]:
        """The ``/readyz`` field."""
        body: dict[str, Any] = {"mode": self.mode, "tools": users}
        if self.missing:
            body["missing"] = list(self.missing)
        if self.error:
            body["error"] = self.error
        return body


def classify(isolation: Mapping[str, str]) -> SandboxMode:
    """Strong: a private read-only root in a mount namespace, a network namespace, a uid of
    its own per worker, an IPC namespace and the seccomp filter (``isolation`` as a worker
    reports it, ``SandboxWorker.isolation``)."""
    missing = []
    if "root" not in isolation:
        missing.append("mount namespace with a private read-only root")
    network = isolation.get("network", "")
    if not network or "weak" in network:  # an audit hook instead of a (user +) network namespace
        missing.append("network namespace")
    if "dedicated" not in isolation.get("user", ""):
        missing.append("a uid of its own per worker")
    if not isolation.get("seccomp", "").startswith("filter"):
        missing.append("seccomp filter")
    if "weak" in isolation.get("ipc", ""):  # SysV/POSIX IPC shared with the host
        missing.append(f"IPC namespace ({isolation['ipc']})")
    return SandboxMode("weak" if missing else "strong", tuple(missing))


def probe() -> SandboxMode:
    """Start one worker the way the pool does and read what it got (blocking: tens of ms once
    the template runs). This replica's uid slice must be configured first."""
    from tools.sandbox.interpreter import SandboxWorker
    from tools.sandbox.records import SandboxError, SandboxLimits

    try:
        worker = SandboxWorker.spawn(SandboxLimits(timeout_s=5, cpu_s=1, memory_mb=256))
    except SandboxError as exc:
        return SandboxMode("unavailable", error=str(exc))
    except Exception as exc:  # out of fds or uids, say: reported, never a failed start
        return SandboxMode("unavailable", error=f"{type(exc).__name__}: {exc}")
    try:
        return classify(worker.isolation)
    finally:
        worker.close_sync()


def sandbox_users(registry: Any) -> list[str]:
    """The served tools and verifiers that run untrusted code in the sandbox."""
    users = [
        name
        for name, entry in registry.entries.items()
        if getattr(entry.instance if entry.instance is not None else entry.func, "__module__", None)
        in SANDBOX_MODULES
    ]
    host = registry.environments
    packs = host.packs.values() if host is not None else ()
    return users + [f"pack {pack.id} (built)" for pack in packs if not pack.trusted]


def log_mode(mode: SandboxMode, users: list[str]) -> None:
    """The start-up line saying which sandbox the untrusted code of ``users`` gets."""
    tools = ", ".join(users)
    if mode.mode == "strong":
        log.info("sandbox: strong (namespaces, private root, own uid, seccomp) for %s", tools)
    elif mode.mode == "weak":
        log.warning(
            "sandbox: WEAK fallback for %s, missing: %s. To get the strong sandbox, %s",
            tools,
            "; ".join(mode.missing),
            HOW_TO_GET_STRONG,
        )
    else:
        log.error("sandbox: unavailable, calls of %s will fail: %s", tools, mode.error)


def weak_exposure(mode: SandboxMode, users: list[str], where: str) -> str | None:
    """Why ``tool-server serve`` refuses to start (None: it may), for a non-loopback bind."""
    if mode.mode != "weak" or not users:
        return None
    return (
        f"refusing to serve {', '.join(users)} on {where} with only the weak sandbox (missing: "
        f"{'; '.join(mode.missing)}): code a model wrote would run less confined. To get the strong "
        f"sandbox, {HOW_TO_GET_STRONG}. Or bind 127.0.0.1, disable those tools, or accept the weak "
        "sandbox explicitly with server.allow_weak_sandbox: true (TOOLFACTORY__SERVER__ALLOW_WEAK_SANDBOX=true)"
    )
