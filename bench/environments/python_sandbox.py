"""Python sandbox: workers forked from the template vs. a fresh interpreter per session, and tool latency.

Side by side in one run:

* ``spawn``: the previous start path, a new ``python -I sandbox_worker.py <config>`` per
  session, loaded from git (``--baseline``: the last commit that had it);
* ``template``: today's path, each worker forked from the pre-warmed template process (a
  spare child forked ahead of demand when one is ready, else forked on demand).

Latency, interleaved so that both paths see the same load: ``--starts`` sessions per path
started alternately (spawn, template, template, spawn, ...), left open, each running one call;
session start p50/p99 is ``SandboxWorker.spawn`` until the confined worker is ready. Then warm
calls alternate between one session of each path. Memory, one path after the other (each
closes its workers first): proportional set size per live session at each ``--sessions``
count (PSS from ``/proc/<pid>/smaps_rollup``: workers, plus the template and its spare children)
and the drop of the host's MemAvailable (which also counts kernel memory: namespaces, page
tables, mounts). Then the python tool as the model sees it (today's path): warm call, first
call of a session (warm pool), cold one-shot ``run_python``.

    .venv/bin/python bench/environments/python_sandbox.py [--sessions 64,256,1024] [--starts 100] [--warm 300]
    .venv/bin/python bench/environments/python_sandbox.py --quick   # about a minute: 64 sessions, fewer calls
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio

from protocol import SessionState
from tools import sandbox
from tools.python_tool import PythonTool
from tools.sandbox import SandboxLimits, run_python
from tools.sandbox import zygote as sandbox_zygote

REPO = Path(__file__).resolve().parents[2]
BASELINE = "67f31cf^"  # the last commit that started a fresh interpreter per session
LIMITS = SandboxLimits(timeout_s=30, memory_mb=512)
_MIN_FREE_KB = 3 << 20  # stop growing a fleet when the host has less than 3 GiB available


@dataclass
class Ctx:
    session: SessionState | None
    call_id: str = "bench"


@dataclass
class PathFigures:
    name: str
    starts: list[float] = field(default_factory=list)  # ms
    warm: list[float] = field(default_factory=list)  # ms
    memory: dict[int, tuple[float, float]] = field(
        default_factory=dict
    )  # sessions: (PSS, MemAvailable drop) MB/session


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _kb(path: str, key: str) -> int:
    with open(path) as fh:
        line = next(line for line in fh if line.startswith(key))
    return int(line.split()[1])


def pss_kb(pid: int) -> int:
    return _kb(f"/proc/{pid}/smaps_rollup", "Pss:")


def children_of(pid: int) -> list[int]:
    """Live children of ``pid`` that are not workers of a session: the template's spares."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except (OSError, ValueError):
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("PPid", "").strip() == str(pid) and fields.get("Uid", "").split()[:1] == ["0"]:
            found.append(int(entry.name))
    return found


def available_kb() -> int:
    return _kb("/proc/meminfo", "MemAvailable:")


def load_baseline(ref: str) -> ModuleType:
    """``tools/sandbox/__init__.py`` and its worker as they were at ``ref``, imported from a temporary copy."""
    where = Path(tempfile.mkdtemp(prefix="bench-python-baseline-"))
    for name in ("sandbox.py", "sandbox_worker.py"):
        text = subprocess.run(
            ["git", "show", f"{ref}:tools/{name}"], cwd=REPO, capture_output=True, check=True
        ).stdout
        (where / name).write_bytes(text)
    spec = importlib.util.spec_from_file_location("baseline_sandbox", where / "sandbox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


async def start_session(spawn: Callable[[], Any], starts: list[float]) -> Any:
    start = time.perf_counter()
    worker = await anyio.to_thread.run_sync(spawn)
    starts.append((time.perf_counter() - start) * 1000)
    result = await worker.run("import math\ntotal = 0")
    assert result.error is None, result
    return worker


async def measure_latency(
    paths: list[tuple[PathFigures, Callable[[], Any]]], starts: int, warm_calls: int
) -> None:
    """Session starts, then warm calls, alternating between the paths (ABBA order)."""
    workers: list[Any] = []
    try:
        for _ in range(2):  # warm-up: the template starts, and both paths' files are in the page cache
            for _, spawn in paths:
                workers.append(await start_session(spawn, []))
        sessions = {}
        for i in range(starts):
            for figures, spawn in paths if i % 2 == 0 else paths[::-1]:
                sessions[figures.name] = await start_session(spawn, figures.starts)
                workers.append(sessions[figures.name])
        for i in range(warm_calls):
            for figures, _ in paths if i % 2 == 0 else paths[::-1]:
                start = time.perf_counter()
                await sessions[figures.name].run(f"total += {i}\nmath.sqrt(total)")
                figures.warm.append((time.perf_counter() - start) * 1000)
    finally:
        for worker in workers:
            await worker.aclose()


async def measure_memory(
    figures: PathFigures, spawn: Callable[[], Any], counts: list[int], template_pids: Callable[[], list[int]]
) -> None:
    workers: list[Any] = []
    before = available_kb()
    try:
        for count in counts:
            while len(workers) < count:
                if available_kb() < _MIN_FREE_KB:
                    print(
                        f"{figures.name}: stopped at {len(workers)} sessions (host memory)", file=sys.stderr
                    )
                    return
                workers.append(await start_session(spawn, []))
            await anyio.sleep(2)  # namespaces of the last closed workers are freed in the background
            pids = [w.proc.pid for w in workers] + template_pids()
            pss = sum(pss_kb(pid) for pid in pids) / 1024 / count
            figures.memory[count] = (pss, (before - available_kb()) / 1024 / count)
            print(f"{figures.name}: {count} sessions, {pss:.2f} MB PSS each", file=sys.stderr)
    finally:
        for worker in workers:
            await worker.aclose()


async def measure_tool(warm_calls: int, cold_calls: int, sessions: int) -> list[tuple[str, list[float]]]:
    tool = PythonTool(pool_size=4)
    await tool.startup()
    await anyio.sleep(2)  # let the pool warm up fully
    rows = []

    session = SessionState("bench-warm")
    await tool("import math\ntotal = 0", Ctx(session))
    warm = []
    for i in range(warm_calls):
        t = time.perf_counter()
        await tool(f"total += {i}\nmath.sqrt(total)", Ctx(session))
        warm.append((time.perf_counter() - t) * 1000)
    await session.close()
    rows.append(("warm call (same session)", warm))

    first = []
    for i in range(sessions):
        fresh = SessionState(f"bench-first-{i}")
        t = time.perf_counter()
        await tool("x = 1\nx + 1", Ctx(fresh))
        first.append((time.perf_counter() - t) * 1000)
        await fresh.close()
        await anyio.sleep(0.3)  # give the pool time to refill, as between real trajectories
    rows.append(("first call of a session (pool)", first))

    cold = []
    for _ in range(cold_calls):
        t = time.perf_counter()
        await run_python("x = 1\nx + 1")
        cold.append((time.perf_counter() - t) * 1000)
    rows.append(("cold: run_python (new worker)", cold))
    await tool.shutdown()
    return rows


def print_paths(old: PathFigures, new: PathFigures) -> None:
    print(f"{'start path':<24}{'spawn':>12}{'template':>12}{'template/spawn':>16}")

    def row(label: str, a: float, b: float, unit: str) -> None:
        print(f"{label:<24}{a:>10.2f}{unit:>2}{b:>10.2f}{unit:>2}{b / a:>15.2f}x")

    for q, label in ((0.5, "start p50"), (0.99, "start p99")):
        row(label, percentile(old.starts, q), percentile(new.starts, q), "ms")
    for q, label in ((0.5, "warm call p50"), (0.99, "warm call p99")):
        row(label, percentile(old.warm, q), percentile(new.warm, q), "ms")
    for count in sorted(set(old.memory) | set(new.memory)):
        if count in old.memory and count in new.memory:
            row(f"PSS/session @{count}", old.memory[count][0], new.memory[count][0], "MB")
            row(f"MemAvail drop @{count}", old.memory[count][1], new.memory[count][1], "MB")
    for figures in (old, new):
        for count, (pss, _) in sorted(figures.memory.items()):
            print(f"{figures.name}: {count} sessions in {pss * count / 1024:.2f} GB PSS")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", default="64,256,1024", help="live session counts to measure memory at")
    parser.add_argument("--baseline", default=BASELINE, help="git ref of the previous start path")
    parser.add_argument(
        "--baseline-max",
        type=int,
        default=1 << 30,
        help="measure the spawn path only up to this many sessions",
    )
    parser.add_argument("--starts", type=int, default=100, help="session starts per path (interleaved)")
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--first", type=int, default=20, help="sessions for the first-call row")
    parser.add_argument("--cold", type=int, default=20)
    parser.add_argument(
        "--quick", action="store_true", help="64 sessions, 60 starts, 200 warm calls, 10 first and cold"
    )
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.starts, args.warm, args.first, args.cold = "64", 60, 200, 10, 10
    counts = sorted(int(n) for n in args.sessions.split(","))
    baseline = load_baseline(args.baseline)

    def template_pids() -> list[int]:
        """The template and its spare children (the workers are counted on their own)."""
        pid = sandbox_zygote.template_for(sys.executable).pid
        return [] if pid is None else [pid, *children_of(pid)]

    old, new = PathFigures("spawn"), PathFigures("template")
    spawn_old = lambda: baseline.SandboxWorker.spawn(LIMITS)  # noqa: E731
    spawn_new = lambda: sandbox.SandboxWorker.spawn(LIMITS)  # noqa: E731
    anyio.run(measure_latency, [(old, spawn_old), (new, spawn_new)], args.starts, args.warm)
    anyio.run(
        measure_memory, old, spawn_old, [n for n in counts if n <= args.baseline_max] or counts[:1], list
    )
    anyio.run(measure_memory, new, spawn_new, counts, template_pids)
    print_paths(old, new)
    rows = anyio.run(measure_tool, args.warm, args.cold, args.first)
    print(f"\n{'python tool (template path)':<34}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}")
    for name, times in rows:
        print(f"{name:<34}{len(times):>6}{percentile(times, 0.5):>10.2f}{percentile(times, 0.99):>10.2f}")
    print(f"\nload average at the end: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
