"""Sandbox session start: this working tree against a git ref, side by side.

Two processes, one importing ``tools`` from this tree and one from ``git archive REF``, each
with its own template process, start sessions in alternating rounds (A B B A ...), so that
both see the same load. A start is ``SandboxWorker.spawn`` until the confined worker is ready
(a spare handed its session when one is ready, as in the server); each worker then runs one
call and is closed before the next start. Prints p50/p90 per side and the ratio tree/ref.

    .venv/bin/python bench/environments/sandbox_start.py --ref 578aea9 [--starts 1000]   # ~15 s
    .venv/bin/python bench/environments/sandbox_start.py --ref 578aea9 --quick   # 200 starts a side
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROUND = 10  # starts per side per round


def serve(tree: str) -> None:
    """Child: start ``n`` sessions per line read on stdin, print their start times (ms)."""
    sys.path.insert(0, tree)  # before the editable install's finder: this tree's ``tools``
    import anyio

    from tools.sandbox import SandboxLimits, SandboxWorker

    assert Path(sys.modules["tools.sandbox"].__file__ or "").is_relative_to(tree)
    limits = SandboxLimits(timeout_s=30)

    async def starts(n: int) -> list[float]:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            worker = await anyio.to_thread.run_sync(SandboxWorker.spawn, limits)
            times.append((time.perf_counter() - start) * 1000)
            result = await worker.run("6 * 7")
            assert result.value == "42", result
            await worker.aclose()
        return times

    anyio.run(starts, 2)  # warm-up: the template starts, its spares are forked
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(anyio.run(starts, int(line))), flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the git ref to compare with (e.g. before a change)")
    parser.add_argument("--starts", type=int, default=1000, help="session starts per side")
    parser.add_argument("--quick", action="store_true", help="200 starts per side")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    if os.geteuid() != 0:
        print("note: not root, so the weak mode (no namespaces, no spares) is measured", file=sys.stderr)
    starts = 200 if args.quick else args.starts
    sys.path.insert(0, str(REPO))
    from bench.git_ref import export_ref  # noqa: PLC0415 (this process only: the sides import their own trees)

    sides = {"tree": str(REPO), "ref": export_ref(args.ref, "tools", "protocol")}
    procs = {
        name: subprocess.Popen(
            [sys.executable, __file__, "--ref", args.ref, "--serve", tree],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,  # the same hidden paths for both
        )
        for name, tree in sides.items()
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for proc in procs.values():
            assert proc.stdout is not None and json.loads(proc.stdout.readline()) == {"ready": True}
        order = list(sides)
        for i in range(0, starts, ROUND):
            for name in order if (i // ROUND) % 2 == 0 else order[::-1]:
                proc = procs[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{min(ROUND, starts - i)}\n")
                proc.stdin.flush()
                times[name] += json.loads(proc.stdout.readline())
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(30)
        shutil.rmtree(sides["ref"], ignore_errors=True)
    print(f"sandbox session start, {starts} per side, load: {os.getloadavg()[0]:.2f} (1 min)")
    for name in sides:
        ms = times[name]
        print(
            f"  {name:4} ({sides[name]}): p50 {percentile(ms, 0.5):.2f} ms, p90 {percentile(ms, 0.9):.2f} ms"
        )
    p50 = percentile(times["tree"], 0.5) / percentile(times["ref"], 0.5)
    p90 = percentile(times["tree"], 0.9) / percentile(times["ref"], 0.9)
    print(f"  tree/ref: p50 {p50:.2f}x, p90 {p90:.2f}x")


if __name__ == "__main__":
    main()
