"""Fair slots: the executor as it is against the executor at a base commit, side by side.

(a) The hot path with one tenant (a server without tokens): batches of ``echo_async`` (a
task and a slot per call) through ``Executor.run_batch``, once within ``max_concurrency``
(every slot free: the fast path) and once 8x over it (calls wait for slots). Rounds of the
two executors are interleaved in one process; the table shows the best round of each.
(b) What a flood does to another tenant: tenant A posts ``--flood`` 1-ms sleeps through 8
slots, then tenant B posts one; how many of A's calls finished before B's, and B's wait.

The base executor is read with ``git show BASE:tool_server/executor/executor.py`` and loaded beside
the current one (both use the same registry, config and tools).

    python bench/server/tenant_fairness.py [--base REV] [--rounds 5] [--flood 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from protocol import Call  # noqa: E402
from tool_server.app import build_registry  # noqa: E402
from tool_server.config import config_from_dict  # noqa: E402
from tool_server.executor import executor as current  # noqa: E402

TOOLS = [{"target": "tools.testing:echo_async"}, {"target": "tools.testing:sleep"}]


def load_base(rev: str, into: Path) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:tool_server/executor/executor.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = into / "base_executor.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("tool_server._base_executor", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def make(module: ModuleType, **limits: Any) -> Any:
    config = config_from_dict({"tools": TOOLS, "limits": limits})
    return module.Executor(build_registry(config), config)


async def hot_path(module: ModuleType, batch: int, batches: int, tag: str) -> float:
    """Calls per second of ``batches`` batches of ``batch`` echo_async calls, one tenant."""
    executor = make(module, max_concurrency=512)
    await executor.start()
    calls = [
        [Call(f"{tag}{b}-{i}", "echo_async", {"text": "hi"}) for i in range(batch)] for b in range(batches)
    ]
    gc.collect()
    start = time.perf_counter()
    for chunk in calls:
        await executor.run_batch(chunk)
    elapsed = time.perf_counter() - start
    await executor.stop()
    return batch * batches / elapsed


async def flood(module: ModuleType, size: int) -> tuple[int, float]:
    """(A's calls finished when B's one call was answered, B's wait in ms)."""
    executor = make(module, max_concurrency=8, max_queue=size + 8, max_admitted_per_tenant=size + 8)
    await executor.start()
    a, b = module.Caller(tenant="A"), module.Caller(tenant="B")
    stats = executor.metrics.tool_stats.for_tool("sleep")
    flood_task = asyncio.create_task(
        executor.run_batch([Call(f"a{i}", "sleep", {"seconds": 0.001}) for i in range(size)], a)
    )
    await asyncio.sleep(0)  # A's calls are admitted and queued first
    start = time.perf_counter()
    await executor.run_batch([Call("b0", "sleep", {"seconds": 0.001})], b)
    waited = (time.perf_counter() - start) * 1000
    finished_before = stats.outcomes.get("ok", 0) - 1
    await flood_task
    await executor.stop()
    return finished_before, waited


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--base", default="ffcfdeb", help="the commit to compare with (default: before fair slots)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds of each executor (default 5)"
    )
    parser.add_argument("--flood", type=int, default=2000, help="tenant A's calls in (b) (default 2000)")
    args = parser.parse_args()
    if args.rounds < 1 or args.flood < 1:
        parser.error("--rounds and --flood must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        base = load_base(args.base, Path(tmp))
        executors = {f"base {args.base}": base, "fair slots": current}
        shapes = {"256 per batch (slots free)": (256, 80), "4096 per batch (8x the slots)": (4096, 5)}
        best: dict[tuple[str, str], float] = {}
        for r in range(args.rounds):
            for shape, (batch, batches) in shapes.items():
                for name, module in executors.items():
                    rate = asyncio.run(hot_path(module, batch, batches, f"{name[0]}{r}"))
                    best[shape, name] = max(best.get((shape, name), 0.0), rate)
        fairness = {name: asyncio.run(flood(module, args.flood)) for name, module in executors.items()}
    names = list(executors)
    print(f"\n(a) one tenant, echo_async via Executor.run_batch, best of {args.rounds} interleaved rounds\n")
    print(f"| shape | {names[0]} calls/s | {names[1]} calls/s | ratio |")
    print("|---|---:|---:|---:|")
    for shape in shapes:
        old, new = best[shape, names[0]], best[shape, names[1]]
        print(f"| {shape} | {old:,.0f} | {new:,.0f} | {new / old:.3f} |")
    print(f"\n(b) tenant A floods {args.flood} 1-ms sleeps through 8 slots, then tenant B sends one\n")
    print("| executor | A's calls finished before B's | B waited (ms) |")
    print("|---|---:|---:|")
    for name, (finished, waited) in fairness.items():
        print(f"| {name} | {finished} | {waited:.0f} |")


if __name__ == "__main__":
    main()
