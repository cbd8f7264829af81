"""What a sandbox is given and gives back: its limits, a run's result, and its errors."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SandboxError", "SandboxLimits", "SandboxOverloaded", "SandboxResult"]


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Resource limits of one sandboxed interpreter."""

    timeout_s: float = 10.0  # wall clock per call; the worker is killed past it
    cpu_s: int = 10  # CPU seconds per call (soft RLIMIT_CPU, raised before each call)
    worker_cpu_s: int = 600  # CPU seconds over the worker's life (hard RLIMIT_CPU)
    memory_mb: int = 512  # address space (RLIMIT_AS)
    max_processes: int = 16  # processes and threads of the sandbox uid (RLIMIT_NPROC)
    max_file_mb: int = 16  # largest file it may write, captured output included (RLIMIT_FSIZE)
    max_open_files: int = 256  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of its private /tmp
    max_output_bytes: int = 65536  # stdout and stderr each, as returned


@dataclass(slots=True)
class SandboxResult:
    """What one run produced. ``error`` is the traceback or why the sandbox stopped the code."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0  # 0 ok, 1 exception, n for sys.exit(n), -signal when the process died
    timed_out: bool = False
    truncated: bool = False  # stdout, stderr or value was cut to max_output_bytes
    error: str | None = None
    elapsed_ms: float = 0.0
    value: str | None = None  # repr of a trailing expression, as in a REPL
    worker_died: bool = False  # the interpreter did not survive the call; its state is gone


class SandboxError(RuntimeError):
    """A sandbox could not be started (the message says which confinement step failed)."""


class SandboxOverloaded(SandboxError):
    """No new sandbox now: the fleet is at its worker or memory limit and no idle session is left."""
