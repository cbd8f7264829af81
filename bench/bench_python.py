"""Python tool latency: warm calls in a session vs a session's first call vs a cold interpreter.

* warm: repeated calls in one session (the worker is already leased; state persists);
* first call of a session: a warm worker is taken from the pool (and the pool refills);
* cold: ``run_python`` starts a fresh confined interpreter, runs, kills it.

    .venv/bin/python bench/bench_python.py [--warm 300 --cold 20]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import anyio

from protocol import SessionState
from tools.python_tool import PythonTool
from tools.sandbox import run_python


@dataclass
class Ctx:
    session: SessionState | None
    call_id: str = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(warm_calls: int, cold_calls: int, sessions: int) -> list[tuple[str, list[float]]]:
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
    rows.append(("cold: run_python (new process)", cold))
    await tool.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--cold", type=int, default=20)
    args = parser.parse_args()
    rows = anyio.run(measure, args.warm, args.cold, args.sessions)
    print(f"{'python tool':<34}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}")
    for name, times in rows:
        print(f"{name:<34}{len(times):>6}{percentile(times, 0.5):>10.2f}{percentile(times, 0.99):>10.2f}")
    warm_p50 = percentile(rows[0][1], 0.5)
    cold_p50 = percentile(rows[2][1], 0.5)
    print(f"\ncold / warm p50: {cold_p50 / warm_p50:.0f}x   (target: warm p50 <= 30 ms)")


if __name__ == "__main__":
    main()
